"""webnav-v0 in a real headless Chromium on envhub's offline sites.

A scripted policy that reads observations like an agent solves one task of every task family
(so every task type is solvable and its evaluator agrees with the pages), doing nothing scores 0,
the WebArena actions do what they say, sessions never share site state, and the conformance
checker passes through a real envhub server with the sites mounted at /sites.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from common.config.envhub import EnvhubConfig
from envhub import registry
from envhub.base import StepResult
from envhub.channel_client import make_env_client
from envhub.client import EnvClient
from envhub.conformance import check_env
from envhub.envs.webnav.actions import BadAction, WebAction, parse_action, parse_reply
from envhub.envs.webnav.env import WebNavEnv
from envhub.envs.webnav.offline_tasks import FAMILIES, INSTANCES, offline_tasks
from envhub.envs.webnav.scripted import ScriptedPolicy, element_id
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

ENV_ID = "webnav-v0"
MAX_SCRIPT_STEPS = 20


async def solve(env: WebNavEnv, task_id: int) -> StepResult:
    """Run the scripted policy on `task_id` until it stops; returns the terminal step."""
    observation, _ = await env.reset(str(task_id), 0)
    policy = ScriptedPolicy(task_id)
    for _ in range(MAX_SCRIPT_STEPS):
        result = await env.step(policy.act(observation))
        if result.terminated:
            return result
        observation = result.observation
    raise AssertionError(f"task {task_id}: the scripted policy did not stop within {MAX_SCRIPT_STEPS} steps")


def run(coroutine_function: Any, **options: Any) -> Any:
    """Run an async test body with a fresh env (under `options`), closing it afterwards."""
    async def body() -> Any:
        env = registry.make(ENV_ID, **options)
        try:
            return await coroutine_function(env)
        finally:
            await env.close()
    return asyncio.run(body())


# --- tasks and splits (no browser) ------------------------------------------------------------


def test_offline_tasks_have_splits_and_evaluators_of_every_kind():
    tasks = offline_tasks()
    splits = registry.task_splits(ENV_ID)
    assert len(tasks) == len(FAMILIES) * INSTANCES >= 50
    assert sorted(splits["train"] + splits["test"]) == sorted(splits["all"]) == [task.task_id for task in tasks]
    assert {tasks[n].family for n in splits["test"]} == {family.__name__ for family in FAMILIES}
    eval_types = {kind for task in tasks for kind in task.eval["eval_types"]}
    assert eval_types == {"string_match", "url_match", "program_html", "site_state"}
    approaches = {key for task in tasks for key in task.eval.get("reference_answers", {})}
    assert approaches == {"exact_match", "must_include", "fuzzy_match"}


@pytest.mark.parametrize("text, expected", [
    ("click [12]", WebAction("click", 12)),
    ("type [7] [blue shoes] [0]", WebAction("type", 7, "blue shoes", False)),
    ("type [7] [a [bracketed] text]", WebAction("type", 7, "a [bracketed] text", True)),
    ("hover [3]", WebAction("hover", 3)),
    ("press [Control+a]", WebAction("press", text="Control+a")),
    ("scroll [down]", WebAction("scroll", text="down")),
    ("scroll [direction=up]", WebAction("scroll", text="up")),
    ("goto [http://x.test/a?b=1]", WebAction("goto", text="http://x.test/a?b=1")),
    ("go_back", WebAction("go_back")), ("go_forward", WebAction("go_forward")), ("new_tab", WebAction("new_tab")),
    ("tab_focus [1]", WebAction("tab_focus", text="1")), ("close_tab", WebAction("close_tab")),
    ("stop [$12.99]", WebAction("stop", text="$12.99")), ("stop", WebAction("stop")),
])
def test_webarena_action_grammar_parses(text, expected):
    assert parse_action(text) == expected
    assert parse_action(expected.render()) == expected


@pytest.mark.parametrize("reply", ["click 12", "type [x] [a]", "scroll [left]", "tab_focus [first]", "jump [3]",
                                   "go_back [1]", "goto []", "", "Thought: hmm\nAction:"])
def test_malformed_actions_get_feedback(reply):
    assert isinstance(parse_reply(reply), BadAction)


def test_replies_in_both_styles():
    assert parse_reply("Thought: the search box.\nAction: click [4]") == WebAction("click", 4)
    assert parse_reply("In summary, the next action I will perform is ```type [5] [tea] [1]```") == \
        WebAction("type", 5, "tea", True)


# --- real browser -------------------------------------------------------------------------------


def test_a_scripted_policy_solves_one_task_of_every_family():
    async def body(env: WebNavEnv) -> None:
        test_ids = registry.task_ids(ENV_ID, "test")
        assert len(test_ids) == len(FAMILIES)
        for task_id in map(int, test_ids):
            result = await solve(env, task_id)
            assert (result.reward, result.info["success"]) == (1.0, True), (task_id, result.info)
    run(body)


@pytest.mark.slow
def test_the_scripted_policy_solves_every_offline_task():
    async def body(env: WebNavEnv) -> None:
        unsolved = [task.task_id for task in offline_tasks() if (await solve(env, task.task_id)).reward != 1.0]
        assert unsolved == []
    run(body)


def test_stopping_without_doing_the_task_scores_zero_under_every_evaluator():
    async def body(env: WebNavEnv) -> None:
        families = ("shop_search", "shop_cart", "shop_order", "forum_submit", "forum_comment_count")
        for task in [t for t in offline_tasks() if t.family in families][::INSTANCES]:
            await env.reset(str(task.task_id), 0)
            idle = await env.step("stop []")
            assert idle.terminated and idle.reward == 0.0 and idle.info["success"] is False, (task, idle.info)
    run(body, dialect="lenient")


def test_wrong_answers_score_zero_and_state_resets_with_each_episode():
    async def body(env: WebNavEnv) -> None:
        observation, _ = await env.reset("0", 0)  # the price of the Wireless Optical Mouse: $159.95
        assert (await env.step("stop [$159.94]")).reward == 0.0
        cart_task = next(t.task_id for t in offline_tasks() if t.family == "shop_cart")
        await solve(env, cart_task)  # puts items in this session's cart
        observation, _ = await env.reset(str(cart_task), 0)
        assert "link 'My Cart (0)'" in observation  # a new episode starts from the seeded state
    run(body, dialect="lenient")


def test_actions_navigate_tabs_history_and_scrolling():
    async def body(env: WebNavEnv) -> None:
        admin_task = next(t.task_id for t in offline_tasks() if t.family == "admin_order_status")
        observation, _ = await env.reset(str(admin_task), 0)
        orders = (await env.step(f"click [{element_id(observation, 'link', 'Orders')}]")).observation
        assert "/admin/orders" in orders and "link '#1040'" in orders and "link '#1001'" not in orders
        scrolled = (await env.step("scroll [down]")).observation  # the oldest orders are below the fold
        assert "link '#1001'" in scrolled and "link '#1040'" not in scrolled
        assert "link '#1040'" in (await env.step("scroll [up]")).observation
        assert (await env.step("go_back")).observation.endswith(f"/admin\nOBJECTIVE: {_objective(orders)}\n"
                                                               "PREVIOUS ACTION: go_back")
        assert "URL: " in (forward := (await env.step("go_forward")).observation) and "/admin/orders" in forward
        hovered = await env.step(f"hover [{element_id(forward, 'link', 'Products')}]")
        assert "failed" not in hovered.observation
        assert "there is no element [99999]" in (await env.step("click [99999]")).observation
        tab = (await env.step("new_tab")).observation
        assert "Tab 1 (current)" in tab and "URL: about:blank" in tab
        assert "Tab 0 (current)" in (await env.step("tab_focus [0]")).observation
        assert "there is no tab 5" in (await env.step("tab_focus [5]")).observation
        await env.step("tab_focus [1]")
        closed = (await env.step("close_tab")).observation
        assert "Tab 0 (current)" in closed and "Tab 1" not in closed and "/admin/orders" in closed
        assert "goto takes an http(s) URL" in (await env.step("goto [file:///etc/passwd]")).observation
        site = _url(closed).split("/admin")[0]
        assert "limited to this task's sites" in (await env.step(f"goto [{site}/health]")).observation
        assert _url((await env.step(f"goto [{site}/forum/f/books]")).observation).endswith("/forum/f/books")
    run(body, dialect="lenient")


def _url(observation: str) -> str:
    return observation.split("\nURL: ")[1].split("\n")[0]


def _objective(observation: str) -> str:
    return observation.split("OBJECTIVE: ")[1].split("\n")[0]


def test_typing_pressing_keys_and_searching():
    async def body(env: WebNavEnv) -> None:
        observation, _ = await env.reset("8", 0)  # search the shop for "kettle"
        box = element_id(observation, "searchbox", "Search products")
        typed = (await env.step(f"type [{box}] [kettle] [0]")).observation
        assert "URL: " in typed and "search?q=" not in typed  # [0]: no Enter
        pressed = (await env.step("press [Enter]")).observation
        assert "search?q=kettle" in pressed and "Electric Kettle 1.7L" in pressed
        assert (await env.step("stop []")).reward == 1.0
    run(body, dialect="lenient")


def test_sessions_do_not_share_site_state():
    async def body(env: WebNavEnv) -> None:
        other = registry.make(ENV_ID, dialect="lenient")
        try:
            cart_task = next(t.task_id for t in offline_tasks() if t.family == "shop_cart")
            observation, _ = await other.reset(str(cart_task), 0)
            await solve(env, cart_task)
            assert "link 'My Cart (0)'" in observation
            refreshed = (await other.step(f"click [{element_id(observation, 'link', 'My Cart (0)')}]")).observation
            assert "Your cart is empty" in refreshed
        finally:
            await other.close()
    run(body, dialect="lenient")


def test_sites_in_a_token_guarded_envhub_are_reachable_by_the_browser(monkeypatch):
    monkeypatch.setenv("LONGHORIZON_TOKEN", "webnav-test-token-0123456789")

    async def body(url: str) -> None:
        async with EnvClient(url) as client:  # sends the token from the environment
            handle = await client.create(ENV_ID, "8", 0)
            assert "searchbox 'Search products'" in handle.observation  # not envhub's 401
            await client.close(handle.session_id)

    with running_hub(EnvhubConfig()) as url:
        asyncio.run(body(url))


@pytest.mark.parametrize("dialect", ["agentgym", "lenient"])
def test_conformance_over_http_with_the_sites_mounted_in_envhub(dialect):
    async def body() -> None:
        with running_hub(EnvhubConfig(env_options={ENV_ID: {"dialect": dialect}})) as url:
            async with EnvClient(url) as client:
                report = await check_env(client, ENV_ID, options={"dialect": dialect})
                assert report.reached_terminal and report.success is True
                handle = await client.create(ENV_ID, "0", 0)
                # agentgym shows the shop under WebArena's real-world name for it.
                shown = "URL: http://onestopmarket.com\n" if dialect == "agentgym" else f"URL: {url}/sites/shop\n"
                assert shown in handle.observation and "RootWebArea 'One Stop Market'" in handle.observation
                await client.close(handle.session_id)
            async with make_env_client(url, transport="channel") as channel:  # the actors' transport
                handle = await channel.create(ENV_ID, "0", 0)
                assert shown in handle.observation  # served by the hub itself on this path too
                await channel.close(handle.session_id)
    asyncio.run(body())
