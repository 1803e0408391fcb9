"""webnav-v0's agentgym dialect against AgentGym's WebArena client and server.

The grammar tests need no browser; the fidelity cases (envhub/envs/webnav/fidelity.py), the worked
example's replay and the conformance checks run in headless Chromium on the offline shop.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from envhub import registry
from envhub.base import ACKNOWLEDGEMENT
from envhub.conformance import check_env
from envhub.envs.webnav.actions import WebAction
from envhub.envs.webnav.agentgym_dialect import (
    INSTRUCTION,
    NO_BACKTICKS,
    ParseFailure,
    describe_action,
    first_block,
    parse_agentgym_action,
    shown_element_lines,
    to_local_urls,
    to_real_url,
)
from envhub.envs.webnav.fidelity import fidelity_cases
from envhub.envs.webnav.worked_example import WORKED_EXAMPLE, WORKED_EXAMPLE_TASK
from envhub.fidelity import play_case

ENV_ID = "webnav-v0"


# --- grammar (no browser) -----------------------------------------------------------------------


def test_the_first_triple_backtick_block_is_the_action() -> None:
    assert first_block("Let's think. In summary, the next action I will perform is ```click [12]```") == "click [12]"
    assert first_block("```\n type [3] [a b] [0] \n``` then ```stop [x]```") == "type [3] [a b] [0]"
    assert first_block("Action: click [12]") is None
    assert first_block("``click [12]``") is None
    assert first_block("``````") == ""


@pytest.mark.parametrize(("text", "expected"), [
    ("click [12]", WebAction("click", 12)),
    ("click[12]", WebAction("click", 12)),
    ("click [12] then click [13]", WebAction("click", 12)),  # searched, not matched: the first one
    ("hover [3]", WebAction("hover", 3)),
    ("type [5] [blue shoes] [0]", WebAction("type", 5, "blue shoes", False, clear_first=False)),
    ("type [5] [blue shoes]", WebAction("type", 5, "blue shoes", True, clear_first=False)),  # Enter unless [0]
    ("type [5] [a] [b] [1]", WebAction("type", 5, "a] [b", True, clear_first=False)),  # WebArena's greedy text
    ("type [5] [x] [2]", WebAction("type", 5, "x] [2", True, clear_first=False)),  # not [0]/[1]: " [1]" is appended
    ("press [Control+a]", WebAction("press", text="Control+a")),
    ("scroll [down]", WebAction("scroll", text="down")),
    ("scroll up", WebAction("scroll", text="up")),
    ("goto [http://x.org/a]", WebAction("goto", text="http://x.org/a")),
    ("tab_focus [2]", WebAction("tab_focus", text="2")),
    ("go_back", WebAction("go_back")),
    ("new_tab please", WebAction("new_tab")),
    ("stop [$279.49]", WebAction("stop", text="$279.49")),
    ("stop [N/A]", WebAction("stop", text="N/A")),
    ("stop []", WebAction("stop", text="")),
    ("stop", WebAction("stop", text="")),
])
def test_create_id_based_action_is_followed(text: str, expected: WebAction) -> None:
    assert parse_agentgym_action(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("Click [12]", "Invalid action Click [12]"),
    ("click [abc]", "Invalid click action click [abc]"),
    ("type [5]", "Invalid type action type [5] [1]"),  # the error shows the text with its default [1]
    ("scroll [direction=down]", "Invalid scroll action scroll [direction=down]"),
    ("press []", "Invalid press action press []"),
    ("", "list index out of range"),
    ("wait", "Invalid action wait"),
])
def test_what_webarena_refuses_and_its_message(text: str, message: str) -> None:
    assert parse_agentgym_action(text) == ParseFailure(message)


def test_previous_action_descriptions_follow_action2str() -> None:
    lines = shown_element_lines("Tab 0 (current): Shop\n\n[1] RootWebArea 'Shop' focused: True\n"
                                "\t\t[9] searchbox 'Search   products' required: False")
    assert lines == {1: "[1] RootWebArea 'Shop' focused: True", 9: "[9] searchbox 'Search   products' required: False"}
    assert describe_action(WebAction("type", 9, "tea", True), lines) == (
        "type [9] [tea ] where [9] is searchbox 'Search products' required: False")  # whitespace collapsed
    assert describe_action(WebAction("hover", 1), lines) == "hover [1] where [1] is RootWebArea 'Shop' focused: True"
    assert describe_action(WebAction("click", 2), lines).startswith('Attempt to perfom "click" on element "[2]"')
    assert describe_action(WebAction("tab_focus", text="1"), lines) == "page_focus [1]"
    assert describe_action(WebAction("scroll", text="up"), lines) == "scroll [up]"
    assert describe_action(WebAction("close_tab"), lines) == "close_tab"
    assert describe_action(WebAction("stop", text=""), lines) == "stop []"


def test_site_urls_are_shown_by_their_real_world_names_and_mapped_back() -> None:
    sites = {"shopping": "http://127.0.0.1:9/sites/shop", "shopping_admin": "http://127.0.0.1:9/sites/admin/"}
    assert to_real_url("http://127.0.0.1:9/sites/shop/category/kitchen", sites) == \
        "http://onestopmarket.com/category/kitchen"
    assert to_real_url("http://127.0.0.1:9/sites/admin/orders", sites) == "http://luma.com/admin/orders"
    assert to_real_url("about:blank", sites) == "about:blank"
    assert to_local_urls("goto [https://onestopmarket.com/search?q=tea]", sites) == \
        "goto [http://127.0.0.1:9/sites/shop/search?q=tea]"


def test_conversation_start_is_agentgyms_instruction_in_agentgym_only() -> None:
    start = registry.conversation_start(ENV_ID)
    assert (start.instruction, start.acknowledgement, start.default_examples) == (INSTRUCTION, "Ok.", 0)
    assert start.instruction.startswith("You are an autonomous intelligent agent tasked with navigating a web")
    assert start.instruction.endswith("Issue stop action when you think you have achieved the objective. "
                                      "Don't generate anything after stop.")
    assert all(first_block(reply) for _, reply in start.examples[0])
    lenient = registry.conversation_start(ENV_ID, dialect="lenient")
    assert lenient.acknowledgement == ACKNOWLEDGEMENT and lenient.instruction != INSTRUCTION


def test_an_unknown_dialect_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"webnav-v0: option dialect must be one of \('agentgym', 'lenient'\)"):
        registry.make(ENV_ID, dialect="webarena")


# --- in Chromium ------------------------------------------------------------------------------


async def _play(case, **options) -> list[str]:
    env = registry.make(ENV_ID, **options)
    try:
        return await play_case(env, case)
    finally:
        await env.close()


def test_every_fidelity_case_plays_as_agentgym_answers() -> None:
    async def body() -> dict[str, list[str]]:
        return {case.name: await _play(case) for case in fidelity_cases()}

    assert asyncio.run(body()) == {case.name: [] for case in fidelity_cases()}


def test_the_lenient_dialect_fails_the_backtick_case() -> None:
    case = next(case for case in fidelity_cases() if case.name.startswith("no triple backticks"))
    problems = asyncio.run(_play(dataclasses.replace(case, steps=case.steps[:1]), dialect="lenient"))
    assert len(problems) == 1 and NO_BACKTICKS in problems[0]


def test_the_worked_example_is_what_the_env_says() -> None:
    async def body() -> None:
        env = registry.make(ENV_ID)
        try:
            observation, _ = await env.reset(WORKED_EXAMPLE_TASK, 0)
            for recorded, reply in WORKED_EXAMPLE:
                assert observation == recorded
                result = await env.step(reply)
                observation = result.observation
            assert result.terminated and result.info["success"]
        finally:
            await env.close()

    assert WORKED_EXAMPLE_TASK in registry.task_ids(ENV_ID, "train")
    asyncio.run(body())


@pytest.mark.parametrize("dialect", ["agentgym", "lenient"])
def test_conformance_in_both_dialects(dialect: str) -> None:
    async def body() -> None:
        env = registry.make(ENV_ID, dialect=dialect)
        report = await check_env(env, ENV_ID, task_id="0", options={"dialect": dialect})
        assert report.reached_terminal and report.success is True

    asyncio.run(body())
