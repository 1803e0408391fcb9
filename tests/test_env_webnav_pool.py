"""webnav-v0's browser pool through a real envhub server: context reuse, the page cap, crashes.

A crash is real: the test SIGKILLs the Chromium renderer processes it started (children of
this process), as the kernel's OOM killer would. The episode must end as an env error (HTTP
500, which the actor records as status ``env_error``) and the server must keep serving.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from actors.episode import _env_failure_status
from common.config.envhub import EnvhubConfig
from envhub.client import EnvClient, EnvClientError
from envhub.envs.webnav.browser import PoolSettings, browser_thread
from envhub.envs.webnav.options import WebNavOptions
from envhub.envs.webnav.scripted import ScriptedPolicy
from tests.processes import process_tree
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

ENV_ID = "webnav-v0"
SMALL_POOL = {"max_pages": 2, "max_tabs": 2, "page_wait_s": 0.3}


def settings_of(options: dict) -> PoolSettings:
    o = WebNavOptions(**options)
    return PoolSettings(o.executable_path, o.headless, o.max_pages, o.max_idle_contexts, o.viewport_width,
                        o.viewport_height)


def pool_stats(options: dict) -> dict[str, int]:
    """Stats of the process's browser pool for these webnav options (the hub runs in this process),
    read on the browser thread that owns the pool."""
    async def read() -> dict[str, int]:
        return browser_thread().pools[settings_of(options)].stats()
    return browser_thread().call_blocking(read(), 10)


def renderer_pids() -> list[int]:
    """Chromium renderer processes descending from this process (started by this test run)."""
    found = []
    for pid in process_tree(os.getpid())[1:]:
        try:
            if b"--type=renderer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            pass  # gone meanwhile
    return found


async def solve_over_http(client: EnvClient, task_id: int) -> float:
    handle = await client.create(ENV_ID, str(task_id), 0)
    policy, observation = ScriptedPolicy(task_id), handle.observation
    try:
        for _ in range(20):
            result = await client.step(handle.session_id, policy.act(observation))
            if result.terminated:
                return result.reward
            observation = result.observation
        raise AssertionError("the scripted policy did not stop")
    finally:
        await client.close(handle.session_id)


def test_sessions_reuse_contexts_the_page_cap_holds_and_close_frees_pages():
    cfg = EnvhubConfig(env_options={ENV_ID: SMALL_POOL})

    async def body(url: str) -> None:
        async with EnvClient(url) as client:
            first = await client.create(ENV_ID, "0", 0)
            second = await client.create(ENV_ID, "0", 0)
            assert pool_stats(SMALL_POOL)["open_pages"] == 2
            with pytest.raises(EnvClientError) as full:  # a third page would break the cap
                await client.create(ENV_ID, "0", 0)
            assert full.value.status_code == 500 and "max_pages" in full.value.message
            refused = await client.step(first.session_id, "```new_tab```")
            assert refused.info["action_valid"] is False and "Tab 1" not in refused.observation
            created_before = pool_stats(SMALL_POOL)["contexts_created"]
            await client.close(second.session_id)
            assert pool_stats(SMALL_POOL)["open_pages"] == 1  # close freed the page
            third = await client.create(ENV_ID, "0", 0)
            reused = pool_stats(SMALL_POOL)
            assert reused["contexts_created"] == created_before and reused["contexts_reused"] >= 1
            for handle in (first, third):
                await client.close(handle.session_id)
            final = pool_stats(SMALL_POOL)
            assert final["open_pages"] == 0 and final["leased_contexts"] == 0
            assert final["idle_contexts"] == final["contexts_created"]  # every context is back, cleared
            assert (await client.health())["sessions"] == 0

    try:
        with running_hub(cfg) as url:
            asyncio.run(body(url))
    finally:
        browser_thread().call_blocking(browser_thread().close_pool(settings_of(SMALL_POOL)), 30)


def test_a_crashed_page_ends_the_episode_as_an_env_error_and_the_server_keeps_serving():
    async def body(url: str) -> None:
        async with EnvClient(url) as client:
            handle = await client.create(ENV_ID, "0", 0)
            closed_before = pool_stats({}).get("contexts_closed", 0)
            pids = renderer_pids()
            assert pids, "no Chromium renderer found"
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            with pytest.raises(EnvClientError) as crashed:
                for _ in range(3):  # the crash is reported by the first step that touches the page
                    await client.step(handle.session_id, "```scroll [down]```")
            assert crashed.value.status_code == 500 and "crash" in crashed.value.message
            assert _env_failure_status(crashed.value) == "env_error"
            assert pool_stats({})["contexts_closed"] == closed_before + 1  # the crashed context is not reused
            health = await client.health()
            assert health["status"] == "ok" and health["sessions"] == 0
            assert await solve_over_http(client, 4) == 1.0  # a new session in the same browser works

    with running_hub(EnvhubConfig()) as url:
        asyncio.run(body(url))
