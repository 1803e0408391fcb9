"""search-v0's AgentGym fidelity cases: scripted replies and what AgentGym's SearchQA server answers.

The expected answers are read from ``agentenv-searchqa/agentenv_searchqa/env_wrapper.py``
(``SearchQAEnvServer.step``: the first closed tag's regex, the three messages, the reward and
done rules; ``_passages2string``: the result lines) and ``reward_score/qa_em.py`` (the last
closed <answer> is scored by exact match after SQuAD normalisation). The cases run on a small
corpus in wiki-18's layout (``contents`` = quoted title, newline, text), written on first use into
the search cache, so they need neither the default dataset nor a download.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from envhub.envs.search import agentgym_dialect as agentgym
from envhub.envs.search.retriever import search_cache_dir
from envhub.fidelity import ExpectedStep, FidelityCase

SERVER = "agentenv-searchqa/agentenv_searchqa/env_wrapper.py: SearchQAEnvServer.step"
CORPUS = [
    {"id": "0", "contents": '"Okapi"\nThe okapi is a giraffid mammal native to the Congo. Its legs carry '
                            "zebra-like stripes."},
    {"id": "1", "contents": '"Basalt"\nBasalt is a fine-grained volcanic rock formed from the rapid cooling of lava.'},
    {"id": "2", "contents": '"Kilimanjaro"\nMount Kilimanjaro is a dormant volcano in Tanzania, the highest '
                            "mountain in Africa."},
]
QUESTIONS = [
    {"id": "f0", "question": "Which giraffid mammal of the Congo has zebra-like stripes on its legs? ",
     "golden_answers": ["Okapi"]},
    {"id": "f1", "question": "In which country is Mount Kilimanjaro?", "golden_answers": ["Tanzania"]},
]


def fidelity_dataset() -> dict[str, str]:
    """Options naming the cases' corpus and questions (written once into the search cache)."""
    folder = search_cache_dir() / "fidelity-v1"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"corpus_path": folder / "corpus.jsonl", "questions_path": folder / "questions.jsonl"}
    for path, rows in ((paths["corpus_path"], CORPUS), (paths["questions_path"], QUESTIONS)):
        text = "".join(json.dumps(row) + "\n" for row in rows)
        if not path.is_file() or path.read_text() != text:
            _write_atomically(path, text)
    return {name: str(path) for name, path in paths.items()}


def _write_atomically(path: Path, text: str) -> None:
    # Renamed into place: another process reading the corpus never sees half a file.
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(text)
    temporary.replace(path)


def fidelity_cases() -> list[FidelityCase]:
    options = fidelity_dataset()
    okapi_docs = '<information>Doc 1(Title: "Okapi") The okapi is a giraffid mammal'
    return [
        FidelityCase(
            "search then answer right", "0", options=options, source=SERVER, success=True,
            first_observation_contains=("You must reason inside <think>...</think> first.",
                                        "Follow this process every time.\n\n Question: Which giraffid mammal "
                                        "of the Congo has zebra-like stripes on its legs?"),
            steps=(
                ExpectedStep("<think>I should search.</think>\n<search> okapi zebra stripes </search>",
                             observation_contains=(okapi_docs,), score=0.0, done=False),
                ExpectedStep("<think>It is the okapi.</think>\n<answer> Okapi </answer>",
                             observation=agentgym.CORRECT, score=1.0, done=True),
            )),
        FidelityCase(
            "a wrong answer lets the agent try again", "1", options=options, source=SERVER, success=True,
            steps=(
                ExpectedStep("<think>Probably Kenya.</think>\n<answer>Kenya</answer>",
                             observation=agentgym.INCORRECT, score=0.0, done=False),
                # qa_em.normalize_answer: case and punctuation do not count.
                ExpectedStep("<answer> tanzania. </answer>", observation=agentgym.CORRECT, score=1.0, done=True),
            )),
        FidelityCase(
            "the first closed tag acts, the last answer is scored", "1", options=options,
            source=f"{SERVER}; reward_score/qa_em.py: extract_solution", success=True,
            steps=(
                ExpectedStep("<search>Kilimanjaro country</search> so <answer>Tanzania</answer>",
                             observation_contains=('<information>Doc 1(Title: "Kilimanjaro") Mount Kilimanjaro',),
                             score=0.0, done=False),
                ExpectedStep("<answer>Kenya</answer> no, <answer>Tanzania</answer>",
                             observation=agentgym.CORRECT, score=1.0, done=True),
            )),
        FidelityCase(
            "invalid replies are refused and the episode goes on", "0", options=options, source=SERVER,
            steps=tuple(ExpectedStep(reply, observation=agentgym.INVALID, score=0.0, done=False) for reply in (
                "I think it is the okapi.",
                "<search>okapi zebra",  # unclosed
                "<Answer>Okapi</Answer>",  # the tags are case-sensitive
                "<answer>Okapi</search>",  # mismatched
            ))),
        FidelityCase(
            "an unclosed tag before a closed one is skipped", "0", options=options, source=SERVER, success=True,
            steps=(ExpectedStep("<search>unfinished query <answer>Okapi</answer>",
                                observation=agentgym.CORRECT, score=1.0, done=True),)),
    ]
