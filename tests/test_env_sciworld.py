"""sciworld-v0: task indexes, episodes on the real simulator, the JVM pool, conformance over HTTP.

Episode tests here are of the lenient dialect (envhub's own rules); the agentgym dialect's
behaviour is checked against AgentGym's in tests/test_fidelity_sciworld.py.

One JVM pool serves the whole module (a JVM takes ~1.5 s to start); the module fixture shuts it
down at the end. Async test bodies run under asyncio.run (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from typing import Any, Iterator

import pytest
from scienceworld.constants import ID2TASK

from common.config.envhub import EnvhubConfig
from envhub import registry
from envhub.client import EnvClient, EnvClientError
from envhub.conformance import check_env
from envhub.envs.sciworld import jvm_pool, task_index
from envhub.envs.sciworld.env import SciWorldEnv, SciWorldOptions
from envhub.envs.sciworld.lenient_rules import hint_text
from envhub.main import EnvhubServer

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

ENV_ID = "sciworld-v0"
LENIENT = task_index.LENIENT_INDEX
FIND_LIVING_THING_0 = LENIENT.task_number("find-living-thing", 0)
AGENTGYM_FIND_LIVING_THING_0 = task_index.AGENTGYM_INDEX.task_number("find-living-thing", 0)
BOIL_0 = 0  # boil variation 0 in both dialects


@pytest.fixture(scope="module", autouse=True)
def fresh_pool() -> Iterator[None]:
    jvm_pool.shutdown_pool()  # this module's tests count JVMs: start from none
    yield
    jvm_pool.shutdown_pool()


def pool() -> jvm_pool.JvmPool:
    defaults = SciWorldOptions()
    return jvm_pool.get_pool(defaults.max_jvms, defaults.jvm_heap_mb)


def reply(action: str) -> str:
    return f"Thought: next I do this.\nAction: {action}"


async def gold_actions(name: str, variation: int) -> list[str]:
    """ScienceWorld's own winning action sequence for a task's variation."""
    jvm = await pool().borrow()
    try:
        await pool().run(jvm.load, name, variation, "", True)
        return await pool().run(jvm.get_gold_action_sequence)
    finally:
        pool().give_back(jvm)


@pytest.fixture(scope="module")
def living_thing_gold() -> list[str]:
    return asyncio.run(gold_actions("find-living-thing", 0))


# --- task index ---------------------------------------------------------------------------


def test_lenient_task_index_is_a_stable_enumeration_with_scienceworld_splits() -> None:
    assert LENIENT.num_tasks() == 7207 and len(task_index.TASK_TABLE) == 30
    assert LENIENT.lookup(0) == task_index.SciWorldTask(0, "boil", 0, "train")
    assert LENIENT.lookup(7206) == task_index.SciWorldTask(7206, "use-thermometer", 539, "test")
    assert LENIENT.lookup(FIND_LIVING_THING_0 + 150).split == "dev"
    splits = registry.task_splits(ENV_ID, dialect="lenient")
    assert {name: len(numbers) for name, numbers in splits.items()} == {
        "train": 3592, "dev": 1796, "test": 1819, "all": 7207}
    assert sorted([*splits["train"], *splits["dev"], *splits["test"]]) == list(splits["all"])
    assert all(LENIENT.lookup(n).split == "dev" for n in splits["dev"])
    assert all(LENIENT.task_number(t.name, t.variation) == n for n in splits["all"] for t in [LENIENT.lookup(n)])
    spec = registry.spec(ENV_ID)
    assert spec.has_task("7206", dialect="lenient") and not spec.has_task("7207", dialect="lenient")
    with pytest.raises(ValueError, match="7207"):
        LENIENT.lookup(7207)


def test_agentgym_task_index_is_agentgyms_data_idx_by_default() -> None:
    agentgym = task_index.AGENTGYM_INDEX
    # AgentGym's server: ScienceWorld's tasks in task-id order, less its seven exceptions.
    served = [(task_id, name) for task_id, name in ID2TASK.items() if task_id not in task_index.AGENTGYM_EXCLUDED_IDS]
    assert list(task_index.AGENTGYM_TASKS) == served and len(served) == 23
    assert agentgym.num_tasks() == 4639
    assert [(agentgym.lookup(n).name, agentgym.lookup(n).variation) for n in (0, 30, 120, 4136, 4638)] == [
        ("boil", 0), ("melt", 0), ("use-thermometer", 0), ("chemistry-mix", 0), ("identify-life-stages-2", 9)]
    assert not {"grow-plant", "grow-fruit", "mendelian-genetics-known-plant"} & {row[0] for row in agentgym.rows}
    splits = registry.task_splits(ENV_ID)  # the default dialect
    assert len(splits["all"]) == 4639 and sum(len(splits[name]) for name in ("train", "dev", "test")) == 4639
    spec = registry.spec(ENV_ID)
    assert spec.has_task("4638") and not spec.has_task("4639") and spec.has_task("4639", dialect="lenient")


@pytest.mark.slow
def test_task_table_matches_the_simulators_own_splits() -> None:
    async def check() -> None:
        jvm = await pool().borrow()
        try:
            for name, variations, train, dev in task_index.TASK_TABLE:
                await pool().run(jvm.load, name, 0, "")
                assert await pool().run(jvm.get_variations_train) == list(range(train)), name
                assert await pool().run(jvm.get_variations_dev) == list(range(train, train + dev)), name
                assert await pool().run(jvm.get_variations_test) == list(range(train + dev, variations)), name
        finally:
            pool().give_back(jvm)

    asyncio.run(check())


# --- episodes -----------------------------------------------------------------------------


def test_reset_shows_task_and_room_and_is_deterministic_and_the_instruction_is_the_conversation_start() -> None:
    async def run() -> None:
        env = SciWorldEnv(dialect="lenient")
        try:
            observation, info = await env.reset(str(FIND_LIVING_THING_0), seed=0)
            again, _ = await env.reset(str(FIND_LIVING_THING_0), seed=5)
        finally:
            await env.close()
        assert observation.startswith("Your task is to find a(n) living thing")
        instruction = SciWorldEnv.conversation_start(dialect="lenient").instruction
        assert "Thought:" in instruction and "Action:" in instruction and "valid actions" in instruction
        assert "This room is called the hallway" in observation
        assert again == observation  # a variation fixes the world; the seed is ignored
        assert info == {"success": False, "best_score": 0.0, "score": 0.0, "task_name": "find-living-thing",
                        "variation": 0, "split": "train", "action_parsed": True}

    asyncio.run(run())


def test_gold_path_wins_with_rewards_summing_to_one(living_thing_gold: list[str]) -> None:
    async def run() -> list[Any]:
        env = SciWorldEnv(dialect="lenient")
        try:
            await env.reset(str(FIND_LIVING_THING_0), seed=0)
            return [await env.step(reply(action)) for action in living_thing_gold]
        finally:
            await env.close()

    results = asyncio.run(run())
    assert [r.terminated for r in results] == [False] * (len(results) - 1) + [True]
    assert results[-1].info["success"] is True and results[-1].info["raw_score"] == 100
    assert results[-1].info["score"] == pytest.approx(1.0)  # lenient: the rewards' sum
    assert all(r.reward >= 0 for r in results) and sum(r.reward for r in results) == pytest.approx(1.0)
    assert "The task is completed" in results[-1].observation


def test_bad_input_hint_and_wrong_focus() -> None:
    async def run() -> dict[str, Any]:
        env = SciWorldEnv(dialect="lenient")
        try:
            await env.reset(str(BOIL_0), seed=0)
            return {name: await env.step(text) for name, text in [
                ("malformed", "I will look around"), ("unknown", reply("xyzzy plugh")),
                ("hint", reply("valid actions")), ("refused", reply("reset task")),
                ("wrong_focus", reply("focus on agent"))]}
        finally:
            await env.close()

    results = asyncio.run(run())
    assert "Action:" in results["malformed"].observation and results["malformed"].info["malformed_action"]
    assert "No known action" in results["unknown"].observation
    hint = results["hint"].observation
    assert "look around" in hint and "focus on agent" in hint and "reset task" not in hint
    assert "not allowed" in results["refused"].observation
    assert all(not r.terminated and r.reward == 0 for name, r in results.items() if name != "wrong_focus")
    failed = results["wrong_focus"]
    assert failed.terminated and failed.info["success"] is False and failed.reward == 0
    assert failed.info["raw_score"] < 0 and "The task is failed" in failed.observation


def test_hint_spreads_over_verbs_and_respects_the_cap() -> None:
    valid = [f"connect a{i} to b{i}" for i in range(500)] + ["look around", "open door to kitchen", "reset task"]
    text = hint_text(valid, max_actions=5)
    assert "(5 of 502)" in text and "look around" in text and "open door to kitchen" in text
    assert "reset task" not in text and text.count("connect") == 3


def test_options_are_validated() -> None:
    for bad in ({"simplification": "easy,flying"}, {"max_jvms": 0}, {"jvm_heap_mb": "lots"}, {"colour": 1},
                {"dialect": "lenient", "hint_max_actions": 0}):
        with pytest.raises(ValueError, match="sciworld"):
            SciWorldEnv(**bad)
    with pytest.raises(ValueError, match="dialect.*agentgym, lenient.*'agentgym-ish'"):
        SciWorldEnv(dialect="agentgym-ish")
    with pytest.raises(ValueError, match="hint_max_actions applies to dialect lenient only"):
        SciWorldEnv(hint_max_actions=10)
    pool()  # the process's pool, with the default cap
    with pytest.raises(ValueError, match="same"):
        SciWorldEnv(max_jvms=7)
    env = SciWorldEnv(simplification="noElectricalAction")
    with pytest.raises(ValueError, match="electrical"):
        asyncio.run(env.reset(str(task_index.AGENTGYM_INDEX.task_number("power-component", 0)), seed=0))


# --- JVM pool -------------------------------------------------------------------------------


async def _wait_until(condition: Any, bound_s: float = 60.0) -> None:
    for _ in range(int(bound_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


def test_pool_reuses_jvms_caps_them_and_waits_for_one() -> None:
    async def run() -> None:
        first = SciWorldEnv()
        await first.reset(str(BOIL_0), seed=0)
        reused_pid = first.jvm_pid
        await first.close()
        started = pool().stats()["started_total"]

        second, third, fourth, late = SciWorldEnv(), SciWorldEnv(), SciWorldEnv(), SciWorldEnv()
        await second.reset(str(AGENTGYM_FIND_LIVING_THING_0), seed=0)
        assert second.jvm_pid == reused_pid and pool().stats()["started_total"] == started
        await third.reset(str(BOIL_0), seed=0)
        assert third.jvm_pid != reused_pid and pool().stats()["live"] == 2

        waiting = asyncio.create_task(fourth.reset(str(BOIL_0), seed=0))  # over the cap of 2
        await _wait_until(lambda: pool().stats()["waiting"] == 1)
        assert not waiting.done()
        with pytest.raises(asyncio.TimeoutError):  # a deadline ends a wait without leaking a slot
            await asyncio.wait_for(late.reset(str(BOIL_0), seed=0), 0.2)
        await second.close()
        await asyncio.wait_for(waiting, 60)
        assert fourth.jvm_pid == reused_pid and pool().stats()["waiting"] == 0
        await third.close()
        await fourth.close()
        assert pool().stats() | {"started_total": 0} == {
            "live": 2, "idle": 2, "borrowed": 0, "starting": 0, "waiting": 0, "started_total": 0,
            "discarded_total": 0}

    asyncio.run(run())


def test_a_jvm_that_fails_is_discarded_and_replaced() -> None:
    async def run() -> None:
        env = SciWorldEnv()
        await env.reset(str(BOIL_0), seed=0)
        dead_pid = env.jvm_pid
        os.kill(dead_pid, signal.SIGKILL)
        with pytest.raises(Exception):
            await env.step(reply("look around"))
        await env.close()
        assert pool().stats()["discarded_total"] == 1 and pool().stats()["live"] == 1
        replacement = SciWorldEnv()
        for _ in range(2):  # the idle survivor, then a fresh start in the freed slot
            await replacement.reset(str(BOIL_0), seed=0)
            assert replacement.jvm_pid != dead_pid
        await replacement.close()

    asyncio.run(run())


def test_a_closed_jvm_is_never_dialled_again(caplog: pytest.LogCaptureFixture) -> None:
    # py4j's finalizers dial the JVM for every collected Java object; against a dead JVM each
    # logged a traceback from inside the garbage collector, which broke numpy loads on 3.11 (CI).
    jvm = jvm_pool.ScienceWorldJvm(max_heap_mb=256)
    java_object = jvm._gateway.jvm.java.util.ArrayList()
    jvm.close()
    with caplog.at_level(logging.DEBUG, logger="py4j"):
        del java_object
        gc.collect()
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


# --- over HTTP ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub_url() -> Iterator[str]:
    server = EnvhubServer(EnvhubConfig(step_timeout_s=60.0))
    server.start_in_thread()
    try:
        yield server.base_url
    finally:
        server.stop()


def test_conformance_over_http_failure_and_winning_paths(hub_url: str, living_thing_gold: list[str]) -> None:
    async def run() -> None:
        async with EnvClient(hub_url, timeout_s=120.0) as client:
            failing = await check_env(client, ENV_ID)  # task 0 with example_actions: a wrong focus
            winning = await check_env(client, ENV_ID, task_id=str(AGENTGYM_FIND_LIVING_THING_0),
                                      actions=[reply(action) for action in living_thing_gold])
            with pytest.raises(EnvClientError) as bad_task:  # past AgentGym's 4,639 tasks
                await client.create(ENV_ID, task_id="4639", seed=0)
        assert failing.reached_terminal and failing.success is False
        assert winning.reached_terminal and winning.success is True
        assert bad_task.value.status_code == 400

    asyncio.run(run())
    assert pool().stats()["borrowed"] == 0  # every session gave its JVM back


@pytest.mark.parametrize("dialect", ["agentgym", "lenient"])
def test_conformance_in_process(dialect: str) -> None:
    options = {"dialect": dialect}
    report = asyncio.run(check_env(registry.make(ENV_ID, **options), ENV_ID, options=options))
    assert report.reached_terminal and report.success is False
