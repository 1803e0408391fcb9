"""envhub: registry, KeyDoor, session table, and the real HTTP server on loopback.

Servers run in background threads (uvicorn + uvloop) on port 0; each async test body
runs under asyncio.run (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any, Iterator

import pytest

from common.config.envhub import EnvhubConfig
from envhub import registry
from envhub.base import Environment, StepContractError, StepResult
from envhub.client import EnvClient, EnvClientError
from envhub.conformance import ConformanceError, check_env
from envhub.envs.keydoor import KeyDoorEnv
from envhub.main import parse_config
from envhub.sessions import SessionGoneError, SessionLimitError, SessionTable, UnknownSessionError
from tests.servers import registered_envs, running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

# At import, before the module's deliberately broken test envs are registered (test_envs).
# agentgym-v0 needs a remote server's url; tests/test_env_agentgym.py checks it against one.
BUILTIN_ENV_IDS = [env_spec.id for env_spec in registry.list_specs() if env_spec.id != "agentgym-v0"]
HINT_PATTERN = re.compile(r"key jingles in the (\w+)")


class SlowEnv(Environment):
    """Every step outlasts any test deadline."""

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        return "A slow room. Anything you do takes forever.", {"success": False}

    async def step(self, action: str) -> StepResult:
        await asyncio.sleep(60)
        return StepResult("done", 0.0, False, False, {"success": False})


class FailingEnv(Environment):
    """Raises in `reset` or `step`, as chosen by its registered kwargs."""

    def __init__(self, fail_in: str) -> None:
        self.fail_in = fail_in

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        if self.fail_in == "reset":
            raise RuntimeError("boom: the lamp exploded in reset")
        return "A room with a fragile lamp.", {"success": False}

    async def step(self, action: str) -> StepResult:
        raise RuntimeError("boom: the lamp exploded")


class RecordingEnv(Environment):
    """Counts closes, to see that server shutdown closes every session."""

    closed_count = 0

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        return "An empty room.", {"success": False}

    async def step(self, action: str) -> StepResult:
        return StepResult("Still empty.", 0.0, False, False, {"success": False})

    async def close(self) -> None:
        type(self).closed_count += 1


class SilentEnv(RecordingEnv):
    """Breaks the contract: its first observation is empty."""

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        return "", {"success": False}


@pytest.fixture(scope="module", autouse=True)
def test_envs() -> Iterator[None]:
    splits = {"train": range(0, 10)}
    with registered_envs(dict(id="test-slow-v0", entry_point=f"{__name__}:SlowEnv", max_turns=4, splits=splits),
                         dict(id="test-failstep-v0", entry_point=f"{__name__}:FailingEnv", max_turns=4,
                              splits=splits, fail_in="step"),
                         dict(id="test-failreset-v0", entry_point=f"{__name__}:FailingEnv", max_turns=4,
                              splits=splits, fail_in="reset"),
                         dict(id="test-recording-v0", entry_point=f"{__name__}:RecordingEnv", max_turns=4,
                              splits=splits),
                         dict(id="test-silent-v0", entry_point=f"{__name__}:SilentEnv", max_turns=4, splits=splits)):
        yield


@pytest.fixture(scope="module")
def hub_url() -> Iterator[str]:
    with running_hub(EnvhubConfig()) as url:
        yield url


@pytest.fixture(scope="module")
def strict_hub_url() -> Iterator[str]:
    cfg = EnvhubConfig(step_timeout_s=0.3, session_idle_timeout_s=1.0, reap_interval_s=0.05)
    with running_hub(cfg) as url:
        yield url


async def _open_sessions(client: EnvClient) -> int:
    return (await client.health())["sessions"]


async def _expect_error(status_code: int, call: Any) -> EnvClientError:
    with pytest.raises(EnvClientError) as caught:
        await call
    assert caught.value.status_code == status_code, caught.value
    return caught.value


def _scripted_keydoor_actions(first_observation: str) -> list[str]:
    key_room = HINT_PATTERN.search(first_observation).group(1)
    return [f"go {key_room}", "take key", "go hall", "open door"]


# --- registry --------------------------------------------------------------------------


def test_registry_validates_ids_and_names_registered_envs() -> None:
    with pytest.raises(ValueError, match="name-vN"):
        registry.register("keydoor", "envhub.envs.keydoor:KeyDoorEnv", max_turns=8, splits={"t": range(2)})
    with pytest.raises(ValueError, match="module.path:ClassName"):
        registry.register("other-v0", "envhub.envs.keydoor.KeyDoorEnv", max_turns=8, splits={"t": range(2)})
    with pytest.raises(ValueError, match="already registered"):
        registry.register("keydoor-v0", "envhub.envs.keydoor:KeyDoorEnv", max_turns=8, splits={"t": range(2)})
    with pytest.raises(registry.UnknownEnvError, match="keydoor-v0"):
        registry.spec("nosuch-v0")
    assert registry.task_ids("keydoor-v0", "test")[:2] == ["10000", "10001"]
    assert len(registry.task_ids("keydoor-v0", "train")) == 10000
    with pytest.raises(KeyError, match="train"):
        registry.task_ids("keydoor-v0", "validation")
    keydoor = registry.spec("keydoor-v0")
    assert keydoor.has_task("42") and keydoor.has_task("10999")
    assert not any(keydoor.has_task(bad) for bad in ("11000", "-1", "007", "x", " 4", ""))
    assert isinstance(registry.make("keydoor-v0"), KeyDoorEnv)


def test_step_result_rejects_contract_violations() -> None:
    with pytest.raises(StepContractError, match=r"\[0, 1\]"):
        StepResult("obs", 1.5, False, False, {})
    with pytest.raises(StepContractError, match="success"):
        StepResult("obs", 1.0, True, False, {})
    with pytest.raises(StepContractError, match="bool"):
        StepResult("obs", 0.0, 1, False, {"success": False})
    assert StepResult("obs", 1, True, False, {"success": True}).reward == 1.0


# --- KeyDoor ---------------------------------------------------------------------------


def test_keydoor_hint_policy_wins_every_task_in_four_turns() -> None:
    async def play(task_id: str, seed: int) -> tuple[str, list[StepResult]]:
        env = registry.make("keydoor-v0")
        observation, info = await env.reset(task_id, seed)
        assert info["success"] is False and len(observation) < 200
        return HINT_PATTERN.search(observation).group(1), [
            await env.step(action) for action in _scripted_keydoor_actions(observation)
        ]

    async def body() -> None:
        key_rooms = set()
        for task_id in [*map(str, range(30)), "10000", "10999"]:
            key_room, results = await play(task_id, seed=int(task_id) % 3)
            key_rooms.add(key_room)
            assert [r.terminated for r in results] == [False, False, False, True]
            assert results[-1].reward == 1.0 and results[-1].info["success"] is True
            assert all(len(r.observation) < 200 for r in results)
        assert len(key_rooms) >= 3, "tasks should vary the key room"

    asyncio.run(body())


def test_keydoor_is_deterministic_and_explains_bad_actions() -> None:
    async def body() -> None:
        env_a, env_b = KeyDoorEnv(), KeyDoorEnv()
        assert (await env_a.reset("7", 1)) == (await env_b.reset("7", 1))
        locked = await env_a.step("open door")
        assert locked.observation == "The door is locked." and not locked.terminated and locked.reward == 0.0
        garbage = await env_a.step("fly to the moon")
        assert "go <room>" in garbage.observation and not garbage.terminated and garbage.reward == 0.0
        missing = await env_a.step("go narnia")
        assert "no narnia" in missing.observation and missing.info["room"] == "hall"

    asyncio.run(body())


def test_keydoor_subgoal_rewards_are_paid_once_and_a_win_still_returns_one() -> None:
    async def body() -> None:
        env = KeyDoorEnv(room_pool=["kitchen", "garden"], rooms_per_task=2, subgoal_reward=0.25)
        observation, _ = await env.reset("3", 0)
        assert sorted(re.search(r"Rooms: ([a-z, ]+)\.", observation).group(1).split(", ")) == ["garden", "kitchen"]
        key_room = _scripted_keydoor_actions(observation)[0]
        results = [await env.step(a) for a in (key_room, "take key", "take key", "go hall", key_room, "go hall",
                                                "open door")]
        assert [r.reward for r in results] == [0.0, 0.25, 0.0, 0.25, 0.0, 0.0, 0.5]
        assert "You hold the key" in results[3].observation  # the hall says what the agent holds
        door = results[-1]
        assert door.info["success"] is True
        with pytest.raises(ValueError, match="rooms_per_task"):
            KeyDoorEnv(rooms_per_task=7)
        with pytest.raises(ValueError, match="room_pool"):
            KeyDoorEnv(room_pool=["kitchen", "hall"])
        with pytest.raises(ValueError, match="subgoal_reward"):
            KeyDoorEnv(subgoal_reward=0.5)

    asyncio.run(body())


# --- session table -----------------------------------------------------------------------


def test_session_table_reaps_idle_sessions_and_remembers_them() -> None:
    table = SessionTable(max_sessions=2, idle_timeout_s=10.0, remembered_ids=1)
    first = table.create("keydoor-v0", "1", KeyDoorEnv(), now_s=0.0)
    second = table.create("keydoor-v0", "2", KeyDoorEnv(), now_s=0.0)
    with pytest.raises(SessionLimitError, match="limit"):
        table.create("keydoor-v0", "3", KeyDoorEnv(), now_s=0.0)
    table.get(second.session_id, now_s=8.0)  # touching keeps it alive
    assert table.reap_idle(now_s=12.0) == [first]
    assert len(table) == 1 and first.closed_reason is not None
    with pytest.raises(SessionGoneError, match="expired"):
        table.get(first.session_id, now_s=12.0)
    table.remove(second.session_id, "closed by client")  # memory holds 1 id: forgets `first`
    with pytest.raises(UnknownSessionError):
        table.get(first.session_id, now_s=13.0)


# --- HTTP server -------------------------------------------------------------------------


def test_http_create_step_close_round_trip(hub_url: str) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            listed = {env["id"]: env for env in await client.list_envs()}
            assert listed["keydoor-v0"] == {"id": "keydoor-v0", "max_turns": 12,
                                            "splits": {"train": 10000, "test": 1000}}
            before = await _open_sessions(client)
            handle = await client.create("keydoor-v0", "12", seed=3)
            assert HINT_PATTERN.search(handle.observation) and handle.info["room"] == "hall"
            assert await _open_sessions(client) == before + 1
            result = await client.step(handle.session_id, "open door")
            assert result == StepResult("The door is locked.", 0.0, False, False, result.info)
            await client.close(handle.session_id)
            assert await _open_sessions(client) == before
            await client.close(handle.session_id)  # closing twice is harmless
            await _expect_error(410, client.step(handle.session_id, "go hall"))

    asyncio.run(body())


def test_http_keydoor_solved_by_hint_reading_policy(hub_url: str) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            handle = await client.create("keydoor-v0", "10042", seed=0)
            results = [await client.step(handle.session_id, a) for a in _scripted_keydoor_actions(handle.observation)]
            assert results[-1].terminated and results[-1].reward == 1.0 and results[-1].info["success"] is True
            await _expect_error(409, client.step(handle.session_id, "open door"))
            await client.close(handle.session_id)

    asyncio.run(body())


def test_http_rejects_unknown_env_bad_task_and_malformed_body(hub_url: str) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            unknown = await _expect_error(404, client.create("nosuch-v0", "1", seed=0))
            assert "keydoor-v0" in unknown.message
            bad_task = await _expect_error(400, client.create("keydoor-v0", "99999", seed=0))
            assert "99999" in bad_task.message
            malformed = await _expect_error(422, client._request("POST", "/sessions", {"env_id": "keydoor-v0"}))
            assert "task_id" in malformed.message
            await _expect_error(404, client.step("no-such-session", "go hall"))
            await _expect_error(404, client.close("no-such-session"))
            errors = (await client.health())["stats"]["errors"]
            assert errors["unknown_env"] >= 1 and errors["malformed_request"] >= 1

    asyncio.run(body())


@pytest.mark.parametrize("env_id", ["test-failstep-v0", "test-failreset-v0"])
def test_http_env_exception_is_500_and_closes_session(hub_url: str, env_id: str) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            before = await _open_sessions(client)
            if env_id == "test-failreset-v0":
                error = await _expect_error(500, client.create(env_id, "1", seed=0))
            else:
                handle = await client.create(env_id, "1", seed=0)
                error = await _expect_error(500, client.step(handle.session_id, "light lamp"))
                await _expect_error(410, client.step(handle.session_id, "light lamp"))
            assert "boom: the lamp exploded" in error.message
            assert await _open_sessions(client) == before

    asyncio.run(body())


def test_http_step_past_deadline_is_504_and_closes_session(strict_hub_url: str) -> None:
    async def body() -> None:
        async with EnvClient(strict_hub_url) as client:
            before = await _open_sessions(client)
            handle = await client.create("test-slow-v0", "1", seed=0)
            error = await _expect_error(504, client.step(handle.session_id, "wait"))
            assert "deadline" in error.message
            assert await _open_sessions(client) == before
            await _expect_error(410, client.step(handle.session_id, "wait"))

    asyncio.run(body())


def test_http_idle_session_is_reaped_then_answers_410(strict_hub_url: str) -> None:
    async def body() -> None:
        async with EnvClient(strict_hub_url) as client:
            before = await _open_sessions(client)
            handle = await client.create("keydoor-v0", "5", seed=0)
            assert await _open_sessions(client) == before + 1
            give_up_s = time.monotonic() + 10.0
            while await _open_sessions(client) > before and time.monotonic() < give_up_s:
                await asyncio.sleep(0.1)
            assert await _open_sessions(client) == before
            expired = await _expect_error(410, client.step(handle.session_id, "go hall"))
            assert "expired" in expired.message
            assert (await client.health())["stats"]["sessions_reaped"] >= 1

    asyncio.run(body())


def test_http_session_limit_is_503_and_shutdown_closes_sessions() -> None:
    RecordingEnv.closed_count = 0

    async def fill(url: str) -> None:
        async with EnvClient(url) as client:
            for task_id in ("1", "2"):
                await client.create("test-recording-v0", task_id, seed=0)
            full = await _expect_error(503, client.create("test-recording-v0", "3", seed=0))
            assert "limit" in full.message

    with running_hub(EnvhubConfig(max_sessions=2)) as url:
        asyncio.run(fill(url))
    assert RecordingEnv.closed_count == 2


@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS)
def test_conformance_in_process(env_id: str) -> None:
    report = asyncio.run(check_env(registry.make(env_id), env_id))
    assert report.steps_taken >= 1


@pytest.mark.parametrize("env_id", BUILTIN_ENV_IDS)
def test_conformance_over_http(hub_url: str, env_id: str) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            report = await check_env(client, env_id)
            assert report.steps_taken >= 1
            if env_id == "keydoor-v0":  # its example actions visit every room: a winning script
                assert report.reached_terminal and report.success is True

    asyncio.run(body())


def test_conformance_catches_an_env_breaking_the_contract(hub_url: str) -> None:
    async def body() -> None:
        with pytest.raises(ConformanceError, match="non-empty"):
            await check_env(registry.make("test-silent-v0"), "test-silent-v0")
        async with EnvClient(hub_url) as client:
            before = await _open_sessions(client)
            with pytest.raises(ConformanceError, match="non-empty"):
                await check_env(client, "test-silent-v0")
            assert await _open_sessions(client) == before  # the checker closed its session anyway

    asyncio.run(body())


def test_cli_flags_use_the_config_grammar() -> None:
    cfg = parse_config(["--port", "8123", "--step-timeout-s", "2.5", "--envhub.max_sessions", "7"])
    assert cfg == EnvhubConfig(port=8123, step_timeout_s=2.5, max_sessions=7)
    with pytest.raises(SystemExit):
        parse_config(["--no-such-flag", "1"])


def test_an_env_registered_for_a_block_is_gone_after_it() -> None:
    env_spec = dict(id="test-brief-v0", entry_point=f"{__name__}:SilentEnv", max_turns=4, splits={"train": range(2)})
    with registered_envs(env_spec):
        assert registry.task_ids("test-brief-v0", "train") == ["0", "1"]
    with pytest.raises(registry.UnknownEnvError, match="unknown env id 'test-brief-v0'"):
        registry.spec("test-brief-v0")
    with pytest.raises(registry.UnknownEnvError):
        registry.unregister("test-brief-v0")
