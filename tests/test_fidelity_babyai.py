"""babyai-v0's agentgym dialect against AgentGym's BabyAI server and client: the fidelity cases
(envhub/envs/babyai/fidelity.py), and focused tests of the reply parsing, action names, step counting,
score and training reward."""

from __future__ import annotations

import ast
import asyncio
import re
import subprocess
from pathlib import Path

import pytest

from envhub import registry
from envhub.envs.babyai import BabyAIEnv
from envhub.envs.babyai.agentgym_game import client_action
from envhub.envs.babyai.env import AGENTGYM_INSTRUCTION
from envhub.envs.babyai.fidelity import fidelity_cases
from envhub.fidelity import play_case

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

AGENTGYM_MIRROR = "/work/.mirror/WooooDyy+AgentGym/repo"
CASES = fidelity_cases()
AVAILABLE = re.compile(r'^Available actions: \[(.*)\]$', re.MULTILINE)


def offered(observation: str) -> list[str]:
    return re.findall(r'"([^"]*)"', AVAILABLE.findall(observation)[-1])


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_fidelity_case_plays_as_agentgym(case) -> None:
    assert asyncio.run(play_case(BabyAIEnv(), case)) == []


@pytest.mark.parametrize("reply, sent", [
    ("Thought:\nI see it.\n\nAction:\ngo to red ball 1", "go to red ball 1"),
    ("Action: turn left\nI turned.", "turn left"),  # the action ends at its line's end
    ("Action:   **Go  to** the red-ball 1!", "Go to the redball 1"),  # the server lower-cases later
    ("I will turn left.", ""),  # no Action: line -> an empty action ("No change in state.")
    ("action: turn left", ""),  # "Action:" is case-sensitive
    ("Action: turn left\nAction: turn right", None),  # refused by the client itself
])
def test_client_extracts_the_action_as_agentgym_does(reply: str, sent: str | None) -> None:
    assert client_action(reply) == sent


def test_refused_replies_spend_no_step_and_count_as_unparsed_or_invalid() -> None:
    async def body() -> None:
        env = BabyAIEnv()
        await env.reset("19", seed=0)  # PickupDistDebug: "pick up the green key"
        for reply, parsed in [("no action", False), ("Action: a\nAction: b", False),
                              ("Action: pick up green key 1", True), ("Action: go through red door 1", True)]:
            result = await env.step(reply)
            assert result.info["action_parsed"] is parsed and result.info["action_valid"] is False, reply
            assert result.info["primitive_steps"] == 0 and result.reward == 0.0 and not result.terminated
        checked = await env.step("Action: check available actions")
        assert checked.info["action_valid"] is True and checked.observation.startswith("You can take the following")

    asyncio.run(body())


def test_names_are_renumbered_from_what_is_in_view_nearest_first_every_turn() -> None:
    async def body() -> None:
        env = BabyAIEnv()
        first, _ = await env.reset("1", seed=0)  # GoToRedBall: two grey balls, 2 and 6 cells away
        assert "There is a grey ball 1 1 steps in front of you and 1 steps to your right." in first
        assert "There is a grey ball 2 5 steps in front of you and 1 steps to your right." in first
        moved = await env.step("Action: go to grey ball 2")  # the nearer one drops out of view
        assert "There is a grey ball 1 right in front of you 1 steps away." in moved.observation
        names = offered(moved.observation)
        assert "go to grey ball 1" in names and "go to grey ball 2" not in names

    asyncio.run(body())


def test_a_macro_action_costs_its_minigrid_steps_and_the_score_is_minigrids_reward() -> None:
    async def body() -> None:
        env = BabyAIEnv()
        _, info = await env.reset("1", seed=0)
        won = await env.step("Action: go to red ball 1")
        steps, limit = won.info["primitive_steps"], info["max_primitive_steps"]
        assert (steps, limit) == (8, 64)  # AgentGym's route: 8 primitives
        assert won.info["score"] == pytest.approx(1 - 0.9 * steps / limit)
        assert won.terminated and not won.truncated and won.info["success"] is True
        assert won.reward == pytest.approx(won.info["score"])  # a win in [0, 1]: the reward is the score

    asyncio.run(body())


def test_training_reward_pays_the_score_clipped_to_one() -> None:
    (slow,) = [case for case in CASES if case.name.startswith("a slow success")]

    async def body() -> None:
        env = BabyAIEnv()
        await env.reset(slow.task_id, seed=0)
        results = [await env.step(step.action) for step in slow.steps]
        assert results[-1].info["score"] > 1.0 and not any(r.terminated or r.truncated for r in results)
        assert all(0.0 <= r.reward <= 1.0 for r in results)
        assert sum(r.reward for r in results) == pytest.approx(1.0)
        assert results[-4].reward == pytest.approx(0.4375)  # paid when the score first rises

    asyncio.run(body())


@pytest.mark.skipif(not Path(AGENTGYM_MIRROR).exists(), reason="AgentGym's source is not mirrored here")
def test_instruction_is_agentgyms_client_text_word_for_word() -> None:
    client = subprocess.run(["git", "--git-dir", AGENTGYM_MIRROR, "show", "HEAD:agentenv/agentenv/envs/babyai.py"],
                            capture_output=True, text=True, check=True).stdout
    (literal,) = re.findall(r"\"value\": '(You are an exploration master.*?)',\n", client)
    assert ast.literal_eval(f"'{literal}'") == AGENTGYM_INSTRUCTION


def test_conversation_start_is_agentgyms_instruction_with_won_examples_in_its_grammar() -> None:
    start = registry.conversation_start("babyai-v0")
    assert start.instruction == AGENTGYM_INSTRUCTION and start.default_examples == 0  # AgentGym shows none
    assert "- toggle and go through <door> <id>: <door> can be a closed door or a locked door." in start.instruction
    assert "drop" not in start.instruction  # AgentGym's list leaves it out, though its server offers it
    assert len(start.examples) > 1  # each with its own goal (tests/test_conversation_start.py)
    for example in start.examples:
        assert len(example) >= 2
        for observation, reply in example:
            assert client_action(reply) in offered(observation)
    lenient = registry.conversation_start("babyai-v0", dialect="lenient")
    assert lenient.instruction != start.instruction and "Available actions: [" not in lenient.examples[0][0][0]
    assert lenient.default_examples == 1
