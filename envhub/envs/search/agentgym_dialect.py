"""search-v0's ``agentgym`` dialect: AgentGym's SearchQA server, read from its source.

Followed: ``agentenv-searchqa/agentenv_searchqa/env_wrapper.py`` (``SearchQAEnvServer.step``,
``observation``, ``_passages2string``) and ``reward_score/qa_em.py`` / ``qa_em_format.py`` in
WooooDyy/AgentGym. What its server does with one reply:

1. the FIRST closed ``<search>...</search>`` or ``<answer>...</answer>`` (case-sensitive, may span
   lines) decides the action; an unclosed tag does not count;
2. search: the stripped query's top passages as ``<information>Doc 1(Title: t) text\\nDoc 2(...``
   ``</information>`` (no space before "(Title:", the title as the first line of the corpus row's
   ``contents``, the lines joined and stripped); reward 0;
3. answer: the LAST closed ``<answer>`` of the whole reply is scored by exact match after SQuAD
   normalisation (its format score adds nothing: the reply lacks the ``<|im_start|>assistant``
   marker its format check requires, and every partial score is 0); right: reward 1, done,
   "Congratulations! ..."; wrong: reward 0, the episode goes on, "Sorry, ... try again.";
4. anything else: reward 0, the episode goes on, "Your previous action is invalid. ...".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envhub.envs.search.data import Passage

FIRST_OBSERVATION = (
    "You must reason inside <think>...</think> first. If you do not have enough knowledge, issue a "
    "<search>...</search> and then STOP. Do not generate <information> or <answer> yet. Wait for external "
    "input wrapped in <information>...</information>. After receiving information, reason again in <think>. "
    "If confident, output your final answer in <answer>...</answer>. Do not output <answer> before receiving "
    "<information> unless you are fully confident. If you find no further external knowledge needed, you can "
    "directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, "
    "<answer> Beijing </answer>. Follow this process every time.\n\n Question: {question}"
)
"""``SearchQAEnvServer.observation``, word for word; ``{question}`` is the stripped question."""
CORRECT = "Congratulations! You have answered the question correctly."
INCORRECT = "Sorry, your answer is incorrect. Please try again."
INVALID = ("Your previous action is invalid. If you want to search, you should put the query between <search> "
           "and </search>. If you want to give the final answer, you should put the answer between <answer> "
           "and </answer>. Please try again.")

_FIRST_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
_CLOSED_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class AgentGymAction:
    """What AgentGym's server reads from a reply: the first closed tag's kind and stripped text."""

    kind: str
    """"search" or "answer"."""

    content: str
    """Stripped text inside the first closed tag (for an answer, see ``scored_answer``)."""

    scored_answer: str = ""
    """For "answer": the stripped text of the reply's last closed <answer>, the one scored."""


def parse_agentgym_reply(reply: str) -> AgentGymAction | None:
    """AgentGym's reading of ``reply`` (``SearchQAEnvServer.step``), or None: an invalid action."""
    first = _FIRST_ACTION.search(reply)
    if first is None:
        return None
    kind, content = first.group(1), first.group(2).strip()
    if kind == "search":
        return AgentGymAction(kind, content)
    # qa_em.extract_solution: the last closed <answer> is scored, not necessarily the first.
    return AgentGymAction(kind, content, _CLOSED_ANSWER.findall(reply)[-1].strip())


def passage_heading(passage: Passage) -> str:
    """The first line of the passage's FlashRAG ``contents``, which AgentGym shows as its title:
    as written for a ``contents`` row; for a ``title``/``text`` row, quoted as wiki-18's are."""
    return passage.heading if passage.heading is not None else f'"{passage.title}"'


def format_agentgym_passages(passages: list[Passage], max_passage_chars: int | None) -> str:
    """``_passages2string`` inside ``<information>``: "Doc i(Title: heading) text" lines, stripped."""
    lines = []
    for rank, passage in enumerate(passages, start=1):
        lines.append(f"Doc {rank}(Title: {passage_heading(passage)}) {passage.clipped_text(max_passage_chars)}\n")
    return f"<information>{''.join(lines).strip()}</information>"
