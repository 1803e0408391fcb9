"""search-v0's agentgym dialect against AgentGym's SearchQA server (envhub/envs/search/fidelity.py),
and the conformance checker under both dialects. Runs on the fidelity corpus in a temporary cache."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from envhub import registry
from envhub.conformance import check_env
from envhub.envs.search import agentgym_dialect as agentgym
from envhub.envs.search.agentgym_dialect import format_agentgym_passages
from envhub.envs.search.data import Passage
from envhub.envs.search.fidelity import fidelity_cases, fidelity_dataset
from envhub.fidelity import cases_for, play_case

ENV_ID = "search-v0"


@pytest.fixture(scope="module", autouse=True)
def temporary_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as patch:
        cache_dir = tmp_path_factory.mktemp("longhorizon-cache")
        patch.setenv("LONGHORIZON_CACHE", str(cache_dir))
        yield cache_dir


@pytest.mark.parametrize("case", fidelity_cases(), ids=lambda case: case.name)
def test_every_fidelity_case_plays_as_agentgym_answers(case) -> None:
    async def body() -> list[str]:
        env = registry.make(ENV_ID, **case.options)  # agentgym is the default dialect
        try:
            return await play_case(env, case)
        finally:
            await env.close()

    assert asyncio.run(body()) == []


def test_the_cases_are_registered_and_cover_winning_and_refused_replies() -> None:
    cases = cases_for(ENV_ID)
    assert any(case.success for case in cases)
    observations = {step.observation for case in cases for step in case.steps}
    assert {agentgym.INVALID, agentgym.INCORRECT, agentgym.CORRECT} <= observations


def test_the_lenient_dialect_fails_the_refusal_case() -> None:
    # The checker itself must be able to fail: the lenient dialect words its refusals otherwise and
    # searches with an unclosed tag.
    refusals = next(case for case in fidelity_cases() if case.name.startswith("invalid replies"))
    case = dataclasses.replace(refusals, steps=refusals.steps[:2])  # lenient answers the later ones, ending it

    async def body() -> list[str]:
        env = registry.make(ENV_ID, **case.options, dialect="lenient")
        try:
            return await play_case(env, case)
        finally:
            await env.close()

    problems = asyncio.run(body())
    assert len(problems) == len(case.steps) and all("Your previous action is invalid" in p for p in problems)


def test_results_render_as_passages2string_does() -> None:
    passages = [Passage("1", "Okapi", "A giraffid.", heading='"Okapi"'), Passage("2", "Basalt", "A rock.")]
    assert format_agentgym_passages(passages, None) == (
        '<information>Doc 1(Title: "Okapi") A giraffid.\nDoc 2(Title: "Basalt") A rock.</information>')
    assert format_agentgym_passages([], None) == "<information></information>"


@pytest.mark.parametrize("dialect", ["agentgym", "lenient"])
def test_conformance_in_both_dialects(dialect: str) -> None:
    options = {**fidelity_dataset(), "dialect": dialect}

    async def body() -> None:
        env = registry.make(ENV_ID, **options)
        # The last action answers right, so both dialects reach their terminal step.
        report = await check_env(env, ENV_ID, task_id="0", options=options,
                                 actions=[*registry.load_env_class(ENV_ID).example_actions, "<answer>Okapi</answer>"])
        assert report.reached_terminal

    asyncio.run(body())


def test_an_unknown_dialect_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"search-v0: option dialect must be one of \('agentgym', 'lenient'\)"):
        registry.make(ENV_ID, **fidelity_dataset(), dialect="AgentGym")
