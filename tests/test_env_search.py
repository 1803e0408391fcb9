"""search-v0 (Deep Search): FlashRAG JSONL loading, BM25 retrieval, exact match, the default
offline dataset, and the env over a real HTTP server on loopback.

Every index and dataset is built into a temporary LONGHORIZON_CACHE, so the tests never read
or write the user's cache. Async bodies run under asyncio.run (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from common.config.envhub import EnvhubConfig
from envhub import registry
from envhub.client import EnvClient
from envhub.conformance import check_env
from envhub.envs.search import agentgym_dialect as agentgym
from envhub.envs.search import wiki_offline
from envhub.envs.search.agentgym_dialect import parse_agentgym_reply
from envhub.envs.search.answers import exact_match, normalize_answer
from envhub.envs.search.data import DataFormatError, load_questions, scan_corpus
from envhub.envs.search.env import MAX_QUERY_CHARS, DeepSearchEnv, parse_reply, shared_questions
from envhub.envs.search.retriever import load_or_build_retriever, search_cache_dir, shared_retriever
from envhub.envs.search.wiki_offline import DefaultDataset
from envhub.main import EnvhubServer

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

ENV_ID = "search-v0"
ARTICLES = {
    "Okapi": "The okapi is a giraffid mammal native to the northeast of the Democratic Republic of the "
             "Congo. Its legs carry zebra-like stripes.",
    "Tardigrade": "Tardigrades are microscopic eight-legged animals that survive extreme dehydration, "
                  "radiation and the vacuum of space.",
    "Gouda cheese": "Gouda is a mild yellow cheese made from cow's milk, named after the Dutch city of Gouda.",
    "Basalt": "Basalt is a fine-grained volcanic rock formed from the rapid cooling of lava rich in "
              "magnesium and iron.",
    "Aurora": "An aurora is a natural light display in the sky, seen mostly in polar regions, caused by "
              "the solar wind.",
    "Kilimanjaro": "Mount Kilimanjaro is a dormant volcano in Tanzania and the highest mountain in Africa.",
}
QUESTIONS = [
    {"id": "q0", "question": "Which giraffid mammal of the Congo has zebra-like stripes on its legs?",
     "golden_answers": ["Okapi"]},
    {"id": "q1", "question": "Which microscopic eight-legged animals survive the vacuum of space?",
     "golden_answers": ["Tardigrades", "Tardigrade"]},
    {"id": "q2", "question": "In which country is Mount Kilimanjaro, the highest mountain in Africa?",
     "golden_answers": ["Tanzania"]},
]
SOURCE_TITLES = ["Okapi", "Tardigrade", "Kilimanjaro"]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module", autouse=True)
def temporary_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cache_dir = tmp_path_factory.mktemp("longhorizon-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LONGHORIZON_CACHE", str(cache_dir))
        yield cache_dir


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A six-article corpus in the {"id","title","text"} layout and three questions."""
    data_dir = tmp_path_factory.mktemp("small-dataset")
    corpus_rows = [{"id": str(n), "title": title, "text": text} for n, (title, text) in enumerate(ARTICLES.items())]
    return {"corpus_path": str(_write_jsonl(data_dir / "corpus.jsonl", corpus_rows)),
            "questions_path": str(_write_jsonl(data_dir / "questions.jsonl", QUESTIONS))}


@pytest.fixture(scope="module")
def default_data(temporary_cache: Path) -> DefaultDataset:
    return wiki_offline.default_dataset()


@contextlib.contextmanager
def running_hub(env_options: dict[str, Any]) -> Iterator[str]:
    server = EnvhubServer(EnvhubConfig(env_options={ENV_ID: env_options}))
    server.start_in_thread()
    try:
        yield server.base_url
    finally:
        server.stop()


def _titles_in(observation: str) -> list[str]:
    """Titles of a result block in either dialect ("Doc 1 (Title: T)" or AgentGym's 'Doc 1(Title: "T")')."""
    return [line.split("(Title: ", 1)[1].split(")", 1)[0].strip('"') for line in observation.split("Doc ")[1:]]


# --- data, retrieval, scoring -------------------------------------------------------------


def test_flashrag_jsonl_loads_both_corpus_layouts_and_questions(tmp_path: Path) -> None:
    split_rows = [{"id": 7, "title": "Okapi", "text": ARTICLES["Okapi"]}]
    contents_rows = [{"id": "7", "contents": f'"Okapi"\n{ARTICLES["Okapi"]}'}]
    passages = [scan_corpus(_write_jsonl(tmp_path / name, rows))[1]
                for name, rows in (("split.jsonl", split_rows), ("contents.jsonl", contents_rows))]
    assert passages[0] == passages[1]
    assert (passages[0][0].doc_id, passages[0][0].title) == ("7", "Okapi")
    assert passages[0][0].text.startswith("The okapi is")

    questions = load_questions(_write_jsonl(tmp_path / "questions.jsonl", QUESTIONS))
    assert [q.id for q in questions] == ["q0", "q1", "q2"]
    assert questions[1].golden_answers == ("Tardigrades", "Tardigrade")

    bad_question = tmp_path / "bad_questions.jsonl"
    _write_jsonl(bad_question, [QUESTIONS[0], {"question": "Who?", "golden_answers": []}])
    with pytest.raises(DataFormatError, match=r"bad_questions.jsonl:2: 'golden_answers'"):
        load_questions(bad_question)
    with pytest.raises(DataFormatError, match="'text'.*'contents'"):
        scan_corpus(_write_jsonl(tmp_path / "bad_corpus.jsonl", [{"id": "1", "body": "no text"}]))
    (tmp_path / "broken.jsonl").write_text('{"id": "1", "title": "x", "text": "y"}\n{not json\n')
    with pytest.raises(DataFormatError, match="broken.jsonl:2: not valid JSON"):
        scan_corpus(tmp_path / "broken.jsonl")


def test_retriever_ranks_the_distinctive_passage_first_and_caches_its_index(small_dataset: dict[str, str]) -> None:
    retriever = shared_retriever(small_dataset["corpus_path"])
    assert len(retriever) == len(ARTICLES)
    assert [p.title for p in retriever.search("volcanic rock from cooling lava", top_k=3)][0] == "Basalt"
    assert [p.title for p in retriever.search("tardigrades surviving dehydration", top_k=1)] == ["Tardigrade"]
    assert retriever.search("the of and", top_k=3) == []  # only stopwords
    assert retriever.search("qwertyuiop", top_k=3) == []  # no term in the corpus
    assert len(retriever.search("mountain volcano mammal cheese", top_k=50)) <= len(ARTICLES)
    # Shared within the process; on disk for the next one.
    assert shared_retriever(small_dataset["corpus_path"]) is retriever
    assert len(list((search_cache_dir() / "bm25").iterdir())) >= 1
    reloaded = load_or_build_retriever(small_dataset["corpus_path"])
    assert reloaded.search("Dutch cheese", 2) == retriever.search("Dutch cheese", 2)


@pytest.mark.parametrize(("answer", "golden", "expected"), [
    ("The Netherlands", ["Netherlands"], True),
    ("  an   apple. ", ["Apple"], True),
    ("Paris!", ["paris"], True),
    ("2001: A Space Odyssey", ["2001 Space Odyssey"], True),
    ("the the", [""], True),
    ("Paris, France", ["Paris"], False),
    ("20th century music", ["20th-century music"], False),  # SQuAD drops '-' without a space
    ("Thebes", ["the bes"], False),  # articles only as whole words
    ("London", ["Paris", "London"], True),
])
def test_exact_match_uses_squad_normalisation(answer: str, golden: list[str], expected: bool) -> None:
    assert exact_match(answer, golden) is expected


def test_normalize_answer_lowercases_and_strips_punctuation_and_articles() -> None:
    assert normalize_answer("  The  Quick, Brown Fox's DEN!  ") == "quick brown foxs den"


def test_lenient_parse_reply_reads_the_last_tag() -> None:
    assert parse_reply("no tags here") is None
    reply = "<think>first search</think><search>okapi</search> then <answer> Okapi </answer>"
    assert (parse_reply(reply).kind, parse_reply(reply).content) == ("answer", "Okapi")
    assert parse_reply("<answer>x</answer> on second thought <SEARCH>zebra legs</SEARCH>").content == "zebra legs"
    assert parse_reply("<search>cut at the stop string").content == "cut at the stop string"


def test_agentgym_parsing_acts_on_the_first_closed_tag_and_scores_the_last_answer() -> None:
    # agentenv-searchqa env_wrapper.py SearchQAEnvServer.step and reward_score/qa_em.py extract_solution.
    assert parse_agentgym_reply("no tags here") is None
    assert parse_agentgym_reply("<search>cut at the stop string") is None
    assert parse_agentgym_reply("<SEARCH>okapi</SEARCH>") is None
    first = parse_agentgym_reply("<think>t</think><search> okapi\nlegs </search> <answer>Okapi</answer>")
    assert (first.kind, first.content) == ("search", "okapi\nlegs")
    answer = parse_agentgym_reply("<answer> Giraffe </answer> no: <search>x</search><answer> Okapi </answer>")
    assert (answer.kind, answer.content, answer.scored_answer) == ("answer", "Giraffe", "Okapi")
    skipped = parse_agentgym_reply("<search>unclosed <answer>Okapi</answer>")
    assert (skipped.kind, skipped.scored_answer) == ("answer", "Okapi")


# --- the env ------------------------------------------------------------------------------


async def _play_scripted(env: DeepSearchEnv, task_id: str, answer_with: str | None) -> tuple[list[str], Any]:
    """Search the question text, then answer `answer_with` (None: the first golden answer)."""
    observation, info = await env.reset(task_id, seed=0)
    question = observation.split("Question: ", 1)[1].strip()
    searched = await env.step(f"<think>Let me search.</think>\n<search>{question}</search>")
    assert not searched.terminated and searched.reward == 0.0
    golden = shared_questions(env.questions_path).__getitem__(int(task_id)).golden_answers
    final = await env.step(f"<think>Found it.</think>\n<answer>{answer_with or golden[0]}</answer>")
    return _titles_in(searched.observation), final


def test_lenient_scripted_policy_that_searches_then_answers_gets_reward_one(small_dataset: dict[str, str]) -> None:
    async def body() -> None:
        env = DeepSearchEnv(**small_dataset, top_k=2, dialect="lenient")
        for task_id, source_title in enumerate(SOURCE_TITLES):
            titles, final = await _play_scripted(env, str(task_id), answer_with=None)
            assert titles[0] == source_title and len(titles) <= 2
            assert (final.reward, final.terminated, final.info["success"]) == (1.0, True, True)
            assert final.info["golden_answers"] == list(QUESTIONS[task_id]["golden_answers"])
        _, wrong = await _play_scripted(env, "0", answer_with="Giraffe")
        assert (wrong.reward, wrong.terminated, wrong.info["success"]) == (0.0, True, False)
        assert [final.info["score"], wrong.info["score"]] == [1.0, 0.0]
        await env.close()

    asyncio.run(body())


def test_agentgym_episode_searches_retries_after_a_wrong_answer_and_wins(small_dataset: dict[str, str]) -> None:
    async def body() -> None:
        env = DeepSearchEnv(**small_dataset, top_k=2)  # agentgym is the default dialect
        titles, wrong = await _play_scripted(env, "0", answer_with="Giraffe")
        assert titles[0] == "Okapi"
        assert (wrong.observation, wrong.reward, wrong.terminated) == (agentgym.INCORRECT, 0.0, False)
        assert wrong.info["score"] == 0.0 and wrong.info["action_valid"]
        invalid = await env.step("<answer>Okapi")
        assert (invalid.observation, invalid.info["action_parsed"]) == (agentgym.INVALID, False)
        right = await env.step("<think>The search said okapi.</think><answer> the okapi </answer>")
        assert (right.observation, right.reward, right.terminated) == (agentgym.CORRECT, 1.0, True)
        assert right.info["success"] and right.info["score"] == 1.0
        await env.close()

    asyncio.run(body())


def test_agentgym_results_follow_agentgyms_layout(small_dataset: dict[str, str], tmp_path: Path) -> None:
    contents_corpus = _write_jsonl(tmp_path / "contents.jsonl", [
        {"id": str(n), "contents": f"{title}\n{text}"} for n, (title, text) in enumerate(ARTICLES.items())])

    async def body() -> None:
        split_layout = DeepSearchEnv(**small_dataset)
        await split_layout.reset("0", seed=0)
        shown = (await split_layout.step("<search>okapi zebra</search>")).observation
        assert shown == f'<information>Doc 1(Title: "Okapi") {ARTICLES["Okapi"]}</information>'
        # A contents row's first line is shown as written (wiki-18 quotes it; this corpus does not).
        contents_layout = DeepSearchEnv(corpus_path=str(contents_corpus),
                                        questions_path=small_dataset["questions_path"])
        await contents_layout.reset("0", seed=0)
        shown = (await contents_layout.step("<search>volcano mountain rock</search>")).observation
        assert shown.startswith("<information>Doc 1(Title: Kilimanjaro) Mount Kilimanjaro")
        assert "\nDoc 2(Title: " in shown and shown.endswith(".</information>")

    asyncio.run(body())


def test_first_observation_has_the_instruction_and_question(small_dataset: dict[str, str]) -> None:
    async def body() -> None:
        agentgym_env = DeepSearchEnv(**small_dataset)
        observation, _ = await agentgym_env.reset("2", seed=5)
        assert observation.startswith("You must reason inside <think>...</think> first.")
        assert observation.endswith(f"Follow this process every time.\n\n Question: {QUESTIONS[2]['question']}")
        env = DeepSearchEnv(**small_dataset, dialect="lenient")
        observation, info = await env.reset("2", seed=5)
        assert observation == (await env.reset("2", seed=5))[0]
        assert "<search> query </search>" in observation and "<answer> Beijing </answer>" in observation
        assert observation.rstrip().endswith(QUESTIONS[2]["question"])
        assert info == {"success": False, "question_id": "q2"}

    asyncio.run(body())


def test_bad_replies_get_feedback_and_keep_the_episode_going(small_dataset: dict[str, str]) -> None:
    async def body() -> None:
        env = DeepSearchEnv(**small_dataset, max_passage_chars=20, dialect="lenient")
        await env.reset("0", seed=0)
        no_tag = await env.step("I think it is the okapi.")
        assert "<search> and </search>" in no_tag.observation and not no_tag.terminated
        empty = await env.step("<answer>  </answer>")
        assert "was empty" in empty.observation and not empty.terminated
        too_long = await env.step(f"<search>{'okapi ' * MAX_QUERY_CHARS}</search>")
        assert f"the limit is {MAX_QUERY_CHARS}" in too_long.observation and not too_long.terminated
        nothing = await env.step("<search>qwertyuiop</search>")
        assert nothing.observation == "<information>No passage matched the query.</information>"
        cut = await env.step("<search>okapi</search>")
        assert "Doc 1 (Title: Okapi) The okapi is a giraf ..." in cut.observation
        assert cut.info == {"success": False, "searches": 2, "action_parsed": True, "action_valid": True, "score": 0.0}
        assert [r.info["action_parsed"] for r in (no_tag, empty, too_long)] == [False, False, True]
        assert too_long.info["action_valid"] is False

    asyncio.run(body())


def test_options_are_validated_with_clear_errors(small_dataset: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="both corpus_path and questions_path"):
        DeepSearchEnv(corpus_path=small_dataset["corpus_path"])
    with pytest.raises(ValueError, match="is not a file"):
        DeepSearchEnv(corpus_path=str(tmp_path / "missing.jsonl"), questions_path=small_dataset["questions_path"])
    with pytest.raises(ValueError, match="top_k must be an int >= 1"):
        DeepSearchEnv(**small_dataset, top_k=0)
    with pytest.raises(ValueError, match="max_passage_chars"):
        DeepSearchEnv(**small_dataset, max_passage_chars="long")
    with pytest.raises(ValueError, match=r"dialect must be one of \('agentgym', 'lenient'\)"):
        DeepSearchEnv(**small_dataset, dialect="searchr1")
    splits = registry.task_splits(ENV_ID, **small_dataset)
    as_lists = {name: list(numbers) for name, numbers in splits.items()}
    assert as_lists == {"train": [0, 1, 2], "test": [], "all": [0, 1, 2]}


# --- the default offline dataset ----------------------------------------------------------


def test_default_dataset_builds_deterministically_with_sensible_sizes(default_data: DefaultDataset) -> None:
    built = json.loads((default_data.questions_path.parent / "build.json").read_text())
    assert 9000 <= built["articles"] <= 11000
    assert built["articles"] <= built["passages"] <= 2 * built["articles"]
    assert 0.7 * built["articles"] <= built["questions"] <= built["articles"]
    questions = shared_questions(default_data.questions_path)
    assert len(questions) == built["questions"]
    kinds = {q.metadata["kind"] for q in questions}
    assert kinds == {"subject", "year"}
    for question in questions:  # the answer never shows in the quoted sentence
        if question.metadata["kind"] == "subject":
            sentence = question.question.split(": ", 1)[1]
            assert normalize_answer(question.metadata["source_title"]) not in normalize_answer(sentence)
    articles = wiki_offline.load_articles(wiki_offline.summaries_path())[:300]
    assert wiki_offline.build_rows(articles) == wiki_offline.build_rows(articles)

    splits = registry.task_splits(ENV_ID)
    assert set(splits["train"]) | set(splits["test"]) == set(splits["all"]) == set(range(len(questions)))
    assert not set(splits["train"]) & set(splits["test"])
    assert 0.08 < len(splits["test"]) / len(questions) < 0.12


def test_default_questions_are_answerable_from_the_top_three_passages(default_data: DefaultDataset) -> None:
    retriever = shared_retriever(default_data.corpus_path)
    sample = shared_questions(default_data.questions_path)[::20]
    hits = [q.metadata["source_title"] in {p.title for p in retriever.search(q.question, 3)} for q in sample]
    hit_rate = sum(hits) / len(hits)
    print(f"source article in the top 3 for {hit_rate:.1%} of {len(sample)} questions")
    assert hit_rate > 0.9


# --- over HTTP ----------------------------------------------------------------------------


def test_conformance_and_a_scripted_win_over_http_on_the_default_dataset(default_data: DefaultDataset) -> None:
    async def body(url: str) -> None:
        async with EnvClient(url) as client:
            report = await check_env(client, ENV_ID, task_id="0")
            assert not report.reached_terminal  # under agentgym only a right answer ends an episode
            question = shared_questions(default_data.questions_path)[0]
            handle = await client.create(ENV_ID, "0", seed=0)
            searched = await client.step(handle.session_id, f"<search>{question.question}</search>")
            assert question.metadata["source_title"] in _titles_in(searched.observation)
            wrong = await client.step(handle.session_id, "<answer>certainly not this</answer>")
            assert (wrong.observation, wrong.terminated) == (agentgym.INCORRECT, False)
            final = await client.step(handle.session_id, f"<answer>{question.golden_answers[0]}</answer>")
            assert (final.reward, final.terminated, final.info["success"]) == (1.0, True, True)
            await client.close(handle.session_id)

    with running_hub({}) as url:
        asyncio.run(body(url))


def test_lenient_conformance_over_http_with_a_flashrag_dataset(small_dataset: dict[str, str]) -> None:
    async def body(url: str) -> None:
        async with EnvClient(url) as client:
            report = await check_env(client, ENV_ID, task_id="1", options={"dialect": "lenient"})
            assert report.reached_terminal and report.success is False
            envs = {env["id"]: env for env in await client.list_envs()}
            assert envs[ENV_ID]["splits"] == {"train": 3, "test": 0, "all": 3}

    with running_hub({**small_dataset, "dialect": "lenient"}) as url:
        asyncio.run(body(url))
