"""babyai-v0: level table and splits, deterministic resets, macro-actions, and the real HTTP server.

Most tests here are about the ``lenient`` dialect (this env's own grammar); the ``agentgym`` dialect
(the default) has tests/test_fidelity_babyai.py, and shares the levels, resets, conformance and
server tests here. Async test bodies run under asyncio.run (no pytest-asyncio); the server runs in a
background thread.
"""

from __future__ import annotations

import asyncio
import itertools
import re

import pytest

from common.config.envhub import EnvhubConfig
from envhub import registry
from envhub.base import StepResult
from envhub.client import EnvClient, EnvClientError
from envhub.conformance import check_env
from envhub.envs.babyai import BabyAIEnv
from envhub.envs.babyai.agentgym_levels import AGENTGYM_LEVEL_IDS, agentgym_level_and_seed
from envhub.envs.babyai.levels import LEVELS, TaskLayout
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

ENV_ID = "babyai-v0"
GOTO_MISSION = re.compile(
    r"Your goal: go to (?:the|a) (?:(red|green|blue|purple|yellow|grey) )?(ball|key|box|door)\n")
OPEN_RED_DOOR_LEVEL, BOSS_LEVEL = 12, 38
LENIENT = {"dialect": "lenient"}


def task(level_index: int, seed_offset: int = 0) -> str:
    """A lenient task id."""
    return str(level_index * 1000 + seed_offset)


def lenient_env() -> BabyAIEnv:
    return BabyAIEnv(dialect="lenient")


def available(observation: str) -> list[str]:
    return re.findall(r"^Available actions: (.*)\.$", observation, re.MULTILINE)[-1].split(", ")


async def act(env: BabyAIEnv, action: str) -> StepResult:
    return await env.step(f"Thought: scripted.\nAction: {action}")


async def play_goto(task_id: str, max_turns: int = 30) -> StepResult:
    """Parse a GoTo mission; "go to" the target once it is known, else look around and walk."""
    env = lenient_env()
    observation, _ = await env.reset(task_id, seed=0)
    colour, kind = GOTO_MISSION.search(observation).groups()
    target = re.compile(rf"go to {colour or '[a-z]+'} {kind} \d+")
    explore = itertools.cycle(["turn left"] * 3 + ["move forward"] * 3)
    for _ in range(max_turns):
        options = available(observation)
        action = next((option for option in options if target.fullmatch(option)), None) or next(explore)
        result = await act(env, action if action in options else "turn right")
        if result.terminated or result.truncated:
            return result
        observation = result.observation
    raise AssertionError(f"task {task_id} did not end within {max_turns} turns")


# --- levels and splits -------------------------------------------------------------------


def test_forty_minigrid_levels_and_splits() -> None:
    level_ids = [level_id for level_id, _ in LEVELS]
    assert len(level_ids) == len(set(level_ids)) == 40
    layout = TaskLayout()
    assert layout.level_and_seed("0") == ("BabyAI-GoToRedBallGrey-v0", 0)
    assert layout.level_and_seed("39999") == ("BabyAI-BossLevelNoUnlock-v0", 999)
    for bad in ("40000", "-1", "x"):
        with pytest.raises(ValueError, match="task id"):
            layout.level_and_seed(bad)
    train, test = registry.task_ids(ENV_ID, "train", **LENIENT), registry.task_ids(ENV_ID, "test", **LENIENT)
    assert (len(train), len(test)) == (40 * 900, 40 * 100) and not set(train) & set(test)
    assert "899" in train and "900" in test and "39999" in test
    goto = registry.task_ids(ENV_ID, "goto", **LENIENT)
    assert {LEVELS[int(t) // 1000][0] for t in goto} == set(level_ids[:11])
    assert all(level_id.startswith("BabyAI-GoTo") for level_id in level_ids[:11])
    assert set(registry.task_ids(ENV_ID, "goto_test", **LENIENT)) <= set(test)
    small = registry.task_splits(ENV_ID, seeds_per_level=10, test_seeds_per_level=2, require_action_marker=False,
                                 **LENIENT)
    assert len(small["train"]) == 320 and small["test"][:2] == [8, 9]
    with pytest.raises(ValueError, match="test_seeds_per_level"):
        BabyAIEnv(seeds_per_level=10, test_seeds_per_level=10, **LENIENT)


def test_agentgym_task_ids_are_agentgyms_data_idx_and_low_ids_are_held_out() -> None:
    # AgentGym's BabyAIEnv.reset: all_levels[data_idx % 40 + 1], seed data_idx // 40.
    assert agentgym_level_and_seed("0") == ("BabyAI-GoToRedBallGrey-v0", 0)
    assert agentgym_level_and_seed("41") == ("BabyAI-GoToRedBall-v0", 1)
    assert agentgym_level_and_seed("3") == ("BabyAI-GoToObjS4-v0", 0)  # its GoToObjS6-v0: minigrid < 2.5, room 4
    assert agentgym_level_and_seed("39999") == ("BabyAI-BossLevelNoUnlock-v0", 999)
    for bad in ("40000", "-1", "x"):
        with pytest.raises(ValueError, match="task id"):
            agentgym_level_and_seed(bad)
    splits = registry.task_splits(ENV_ID)  # agentgym is the default dialect
    assert list(splits["test"]) == list(range(400)) and list(splits["train"]) == list(range(400, 40000))
    assert all(int(n) % 40 < 11 for n in splits["goto"]) and len(splits["goto"]) == 11 * 990
    assert set(splits["goto_test"]) <= set(splits["test"]) and set(splits["goto"]) <= set(splits["train"])
    assert registry.spec(ENV_ID).max_turns == 20  # AgentGym-RL's examples/eval/babyai_eval.sh max_rounds


def test_dialect_option_is_checked() -> None:
    with pytest.raises(ValueError, match=r"dialect must be one of \('agentgym', 'lenient'\)"):
        BabyAIEnv(dialect="strict")
    with pytest.raises(ValueError, match="apply only to dialect 'lenient'"):
        BabyAIEnv(seeds_per_level=10)
    with pytest.raises(ValueError, match="unknown option"):
        BabyAIEnv(dialect="lenient", seeds=3)
    with pytest.raises(ValueError, match="apply only to dialect 'lenient'"):
        registry.task_splits(ENV_ID, require_action_marker=False)


def test_every_level_resets_deterministically_and_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    async def body() -> None:
        env_a, env_b = lenient_env(), lenient_env()
        agentgym_a, agentgym_b = BabyAIEnv(), BabyAIEnv()
        for level_index, (level_id, _) in enumerate(LEVELS):
            first, info = await env_a.reset(task(level_index), seed=0)
            again, _ = await env_b.reset(task(level_index), seed=7)  # the task alone fixes the level
            assert first == again and info["level"] == level_id and info["success"] is False
            assert first.startswith("Your goal: ") and "Available actions: turn left, turn right" in first
            first, info = await agentgym_a.reset(str(level_index), seed=0)
            again, _ = await agentgym_b.reset(str(level_index), seed=7)
            assert first == again and info["level"] == AGENTGYM_LEVEL_IDS[level_index] and info["score"] == 0.0
            assert first.startswith("Your goal: ") and '\nAvailable actions: ["turn left", "turn right", ' in first
        layouts = {(await env_a.reset(task(0, offset), seed=0))[0] for offset in range(5)}
        assert len(layouts) > 1, "seed offsets should vary the layout"
        await env_a.reset(task(BOSS_LEVEL, 3), seed=0)  # minigrid prints "Sampling rejected" here
        await agentgym_a.reset(str(BOSS_LEVEL + 3 * 40), seed=0)

    asyncio.run(body())
    assert capsys.readouterr().out == ""


# --- macro-actions -----------------------------------------------------------------------


def test_scripted_goto_policy_wins_goto_tasks() -> None:
    async def body() -> None:
        for level_index in (0, 2, 3, 4, 8, 9):  # single-room GoTo levels
            for seed_offset in range(3):
                result = await play_goto(task(level_index, seed_offset))
                assert result.terminated and not result.truncated
                assert result.reward == 1.0 and result.info["success"] is True
                assert 0.0 < result.info["score"] < 1.0  # minigrid's time-discounted reward
                assert "completed the mission" in result.observation

    asyncio.run(body())


def test_pick_up_and_drop() -> None:
    async def body() -> None:
        env = lenient_env()
        await env.reset(task(0), seed=0)  # "go to the red ball", grey distractors around
        picked = await act(env, "pick up grey key 1")
        assert picked.info["action_valid"] and not picked.terminated
        assert "You picked up grey key 1" in picked.observation
        assert "You are carrying a grey key (grey key 1)." in picked.observation
        assert "drop" in available(picked.observation)
        refused = await act(env, "pick up grey ball 1")
        assert not refused.info["action_valid"] and "already carrying grey key 1" in refused.observation
        dropped = await act(env, "drop")
        assert "You are carrying nothing." in dropped.observation
        assert "pick up grey key 1" in available(dropped.observation)

        await env.reset(task(19), seed=0)  # PickupDistDebug: "pick up the green key"
        won = await act(env, "pick up green key 1")
        assert won.terminated and won.reward == 1.0 and won.info["success"] is True

    asyncio.run(body())


def test_doors_toggle_and_go_through() -> None:
    async def body() -> None:
        env = lenient_env()
        observation, _ = await env.reset(task(OPEN_RED_DOOR_LEVEL), seed=0)  # "open the red door"
        assert "red door 1 (closed)" in observation
        reached = await act(env, "go to the red door")
        assert "right in front of you" in reached.observation and "toggle" in available(reached.observation)
        opened = await act(env, "toggle")
        assert opened.terminated and opened.info["success"] is True and "You opened red door 1" in opened.observation

        await env.reset(task(23), seed=0)  # Unlock: a closed grey door in view
        through = await act(env, "go through grey door 1")
        assert "You went through grey door 1." in through.observation
        assert through.info["primitive_steps"] > 2 and not through.terminated

    asyncio.run(body())


def test_invalid_actions_get_explanations_and_spend_no_step() -> None:
    async def body() -> None:
        env = lenient_env()
        await env.reset(task(OPEN_RED_DOOR_LEVEL), seed=0)
        replies_and_reasons = [
            ("go to the red ball", "No action found"),  # no "Action:" line
            ("Action: fly to the moon", "Unknown action"),
            ("Action: go to purple ball 1", "have not seen any purple ball"),
            ("Action: drop", "not carrying anything"),
            ("Action: toggle", "nothing to toggle"),
            ("Action: pick up red door 1", "cannot pick up red door 1"),
        ]
        for reply, reason in replies_and_reasons:
            result = await env.step(reply)
            assert reason in result.observation, (reply, result.observation)
            assert result.reward == 0.0 and not result.terminated and not result.truncated
            assert result.info["action_valid"] is False and result.info["primitive_steps"] == 0
            assert "Available actions:" in result.observation

    asyncio.run(body())


def test_minigrid_time_limit_truncates_without_success() -> None:
    async def body() -> None:
        env = lenient_env()
        _, info = await env.reset(task(OPEN_RED_DOOR_LEVEL), seed=0)
        for turn in range(1, info["max_primitive_steps"] + 1):
            result = await act(env, "turn left")
            if result.truncated:
                break
        assert turn == info["max_primitive_steps"] == result.info["primitive_steps"]
        assert result.truncated and not result.terminated
        assert result.reward == 0.0 and result.info["success"] is False and "Time is up" in result.observation

    asyncio.run(body())


# --- over HTTP ---------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["agentgym", "lenient"])
def test_conformance_in_process_and_over_http(dialect: str) -> None:
    # Task 400: GoToRedBallGrey seed 10 under agentgym, GoToRedBallGrey seed 400 under lenient.
    async def body(url: str) -> None:
        report = await check_env(BabyAIEnv(dialect=dialect), ENV_ID, task_id="400")
        assert report.reached_terminal and report.success is True
        async with EnvClient(url) as client:
            report = await check_env(client, ENV_ID, task_id="400")
            assert report.reached_terminal and report.success is True

    with running_hub(EnvhubConfig(env_options={ENV_ID: {"dialect": dialect}})) as url:
        asyncio.run(body(url))


def test_options_decide_the_tasks_over_http() -> None:
    options = {ENV_ID: {"dialect": "lenient", "seeds_per_level": 10, "test_seeds_per_level": 2}}

    async def body(url: str) -> None:
        async with EnvClient(url) as client:
            session = await client.create(ENV_ID, "15", 0)  # level 1, seed offset 5
            assert session.info["level"] == "BabyAI-GoToRedBall-v0" and session.info["level_seed"] == 5
            await client.close(session.session_id)
            with pytest.raises(EnvClientError) as caught:
                await client.create(ENV_ID, "400", 0)  # 40 levels x 10 seeds end at 399
            assert caught.value.status_code == 400

    with running_hub(EnvhubConfig(env_options=options)) as url:
        asyncio.run(body(url))

