"""envhub server under bad input: what tests/test_envhub.py does not already cover.

The action size cap (413, session kept), every rejected request counted once in /health, a
failing env isolated from the other sessions with the server still serving, and an env whose
options were never configured.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest

from common.config.envhub import EnvhubConfig
from envhub.base import Environment, StepResult
from envhub.client import EnvClient, EnvClientError
from envhub.main import EnvhubServer
from tests.servers import registered_envs

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

MAX_ACTION_CHARS = 100


class ExplodingEnv(Environment):
    """Steps fine until it is told 'explode'."""

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        return "A room with a big red button. Say 'explode' to press it.", {"success": False}

    async def step(self, action: str) -> StepResult:
        if action == "explode":
            raise RuntimeError("kaboom: the button was real")
        return StepResult("Nothing happens.", 0.0, False, False, {"success": False})


@pytest.fixture(scope="module", autouse=True)
def test_envs() -> Iterator[None]:
    with registered_envs(dict(id="badinput-exploding-v0", entry_point=f"{__name__}:ExplodingEnv", max_turns=4,
                              splits={"train": range(5)})):
        yield


@pytest.fixture(scope="module")
def hub_url() -> Iterator[str]:
    server = EnvhubServer(EnvhubConfig(max_action_chars=MAX_ACTION_CHARS))
    server.start_in_thread()
    try:
        yield server.base_url
    finally:
        server.stop()


async def _errors(client: EnvClient) -> dict[str, int]:
    return (await client.health())["stats"]["errors"]


async def _status_of(call: Any) -> EnvClientError:
    with pytest.raises(EnvClientError) as caught:
        await call
    return caught.value


def test_action_over_the_cap_is_413_and_the_session_stays_open(hub_url: str) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            handle = await client.create("keydoor-v0", "4", seed=0)
            too_long = await _status_of(client.step(handle.session_id, "go " + "x" * MAX_ACTION_CHARS))
            assert too_long.status_code == 413
            assert f"limit is {MAX_ACTION_CHARS}" in too_long.message and "envhub.max_action_chars" in too_long.message
            at_cap = await client.step(handle.session_id, "x" * MAX_ACTION_CHARS)  # exactly the cap is allowed
            assert not at_cap.terminated and "Unknown action" in at_cap.observation
            await client.close(handle.session_id)

    asyncio.run(body())


def test_each_rejected_request_is_counted_once_in_health(hub_url: str) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            before = await _errors(client)
            handle = await client.create("badinput-exploding-v0", "1", seed=0)
            calls = {
                "unknown_env": (404, client.create("nosuch-v0", "1", seed=0)),
                "bad_task": (400, client.create("keydoor-v0", "007", seed=0)),
                "unknown_session": (404, client.step("no-such-session", "go hall")),
                "action_too_large": (413, client.step(handle.session_id, "y" * (MAX_ACTION_CHARS + 1))),
                "env_error": (500, client.step(handle.session_id, "explode")),
                "session_gone": (410, client.step(handle.session_id, "look")),
            }
            for kind, (status_code, call) in calls.items():
                assert (await _status_of(call)).status_code == status_code, kind
            after = await _errors(client)
            assert {kind: after.get(kind, 0) - before.get(kind, 0) for kind in calls} == dict.fromkeys(calls, 1)

    asyncio.run(body())


def test_an_env_exception_closes_only_its_session_and_the_server_keeps_serving(hub_url: str) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            bystander = await client.create("keydoor-v0", "9", seed=1)
            doomed = await client.create("badinput-exploding-v0", "2", seed=0)
            open_before = (await client.health())["sessions"]
            error = await _status_of(client.step(doomed.session_id, "explode"))
            assert error.status_code == 500 and "kaboom: the button was real" in error.message
            assert "closed" in error.message and (await client.health())["sessions"] == open_before - 1
            still_fine = await client.step(bystander.session_id, "open door")  # the other session is untouched
            assert still_fine.observation == "The door is locked."
            fresh = await client.create("badinput-exploding-v0", "2", seed=0)  # and new sessions still work
            assert (await client.step(fresh.session_id, "wait")).observation == "Nothing happens."
            for handle in (bystander, fresh):
                await client.close(handle.session_id)

    asyncio.run(body())


def test_env_without_its_required_options_is_reported_not_crashed(hub_url: str) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            before = (await _errors(client)).get("env_config", 0)
            for task_id in ("0", ""):  # "" is the schema fuzzer's case: it once skipped the options check (500)
                error = await _status_of(client.create("agentgym-v0", task_id, seed=0))
                assert error.status_code == 400, (task_id, error)
                assert "needs option 'url'" in error.message and "envhub.env_options" in error.message
            conversation = await _status_of(client.conversation_start("agentgym-v0"))
            assert conversation.status_code == 400 and "needs option 'url'" in conversation.message
            listed = {env["id"]: env for env in await client.list_envs()}
            assert listed["agentgym-v0"]["splits"] is None and "url" in listed["agentgym-v0"]["error"]
            assert listed["keydoor-v0"]["splits"] == {"train": 10000, "test": 1000}
            assert (await _errors(client))["env_config"] == before + 3
            served = await client.create("keydoor-v0", "4", seed=0)  # the server keeps serving
            assert "hall" in served.observation
            await client.close(served.session_id)

    asyncio.run(body())


def test_max_action_chars_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_action_chars"):
        EnvhubConfig(max_action_chars=0)
