"""sciworld-v0's agentgym dialect against AgentGym's behaviour.

- every fidelity case (envhub/envs/sciworld/fidelity.py) plays without a difference;
- the reply grammar of AgentGym's client (``BaseAdapter.parse_react`` plus its ``</s>`` cut);
- a differential check: the same script through scienceworld's own ``ScienceWorldEnv`` driven the
  way AgentGym's server drives it (``load``, ``getTaskDescription``, ``step("look around")``, then
  ``step(action)`` with ``envStepLimit=100``) answers exactly what our env answers;
- the conversation start: AgentGym's instruction and a worked example that wins on the simulator.

One env (one pooled JVM) serves the module; async bodies run under asyncio.run.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import pytest

from envhub import registry
from envhub.envs.sciworld import example, task_index
from envhub.envs.sciworld.agentgym_rules import AGENTGYM_INSTRUCTION, parse_reply
from envhub.envs.sciworld.env import SciWorldEnv, SciWorldOptions
from envhub.envs.sciworld.fidelity import fidelity_cases, reply
from envhub.envs.sciworld.jvm_pool import get_pool
from envhub.fidelity import play_case

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

ENV_ID = "sciworld-v0"


@pytest.fixture(scope="module")
def env() -> Iterator[SciWorldEnv]:
    env = registry.make(ENV_ID)  # the default dialect: agentgym
    yield env
    asyncio.run(env.close())


@pytest.mark.parametrize("case", fidelity_cases(), ids=lambda case: case.name.split(":")[0])
def test_fidelity_case_plays_as_agentgym(env: SciWorldEnv, case: Any) -> None:
    assert asyncio.run(play_case(env, case)) == []


@pytest.mark.parametrize("text, action, marked", [
    ("Thought:\nI look.\n\nAction:\nlook around", "look around", True),
    ("Action: open door\nThought: no, rather\nAction:  go to kitchen \n", "go to kitchen", True),  # the last one
    ("Thought:\nx\n\nAction:\nlook around\n\nThis should help.", "look around\n\nThis should help.", True),
    ("Thought: x\naction: look around", "", False),  # the marker is case-sensitive
    ("look around", "", False),
    ("Thought: x\nAction: look around</s>", "look aroun", True),  # five characters cut for four
    ("click[Buy Now]", "click[Buy Now]", False),  # parse_react's rule for web envs, shared by all
])
def test_reply_grammar_is_agentgyms_parse_react(text: str, action: str, marked: bool) -> None:
    assert parse_reply(text) == (action, marked)


def test_a_script_answers_as_scienceworlds_own_env_driven_by_agentgyms_server(env: SciWorldEnv) -> None:
    name, variation = "use-thermometer", 0
    number = task_index.AGENTGYM_INDEX.task_number(name, variation)
    actions = ["open door to kitchen", "go to kitchen", "pick up thermometer", "examine thermometer", "wait1",
               "pour OBJ into OBJ", "look at stove", "reset task", "task", "inventory", "", "focus on agent"]

    async def ours() -> list[tuple[str, float, bool]]:
        observation, _ = await env.reset(str(number), seed=0)
        played = [(observation, 0.0, False)]
        for action in actions:
            result = await env.step(reply(action))
            played.append((result.observation, result.info["score"], result.terminated or result.truncated))
            if played[-1][2]:
                break
        return played

    async def reference() -> list[tuple[str, float, bool]]:
        pool = get_pool(SciWorldOptions().max_jvms, SciWorldOptions().jvm_heap_mb)
        jvm = await pool.borrow()
        limit, jvm.envStepLimit = jvm.envStepLimit, 100  # ScienceWorldEnv()'s default, as AgentGym builds it

        def play() -> list[tuple[str, float, bool]]:
            jvm.load(name, variation)
            description = jvm.get_task_description()
            observation, _, _, _ = jvm.step("look around")
            played = [(description + "\n" + observation, 0.0, False)]
            for action in actions:
                observation, _, done, info = jvm.step(action)
                played.append((observation, float(info["score"]), done))
                if done:
                    break
            return played
        try:
            return await pool.run(play)
        finally:
            jvm.envStepLimit = limit
            pool.give_back(jvm)

    expected = asyncio.run(reference())
    assert asyncio.run(ours()) == expected
    assert len(expected) > 5 and expected[-1][2] is True  # the script ran to a (failed) end


def test_conversation_start_is_agentgyms_instruction_with_a_worked_example_in_its_grammar() -> None:
    start = registry.conversation_start(ENV_ID)
    assert start.instruction == AGENTGYM_INSTRUCTION
    assert '"pour OBJ into OBJ"' in start.instruction and '"examine OBJ"' in start.instruction
    assert "valid actions" not in start.instruction  # no hint action in AgentGym's server
    assert start.instruction.endswith("Your response should use the following format:\nThought:\nyour "
                                      "thoughts.\n\nAction:\nyour next action")
    assert "valid actions" in registry.conversation_start(ENV_ID, dialect="lenient").instruction
    (worked,) = start.examples  # AgentGym's evaluation shows none: the run opts in with num_examples
    assert start.default_examples == 0 and worked == example.WORKED_EXAMPLE
    assert all(parse_reply(answer)[1] for _, answer in worked)
    number = task_index.AGENTGYM_INDEX.task_number(*example.EXAMPLE_TASK)
    assert task_index.AGENTGYM_INDEX.lookup(number).split == "train"  # never a held-out variation


def test_worked_example_wins_on_the_simulator_with_rewards_summing_to_the_score(env: SciWorldEnv) -> None:
    number = task_index.AGENTGYM_INDEX.task_number(*example.EXAMPLE_TASK)

    async def play() -> tuple[str, list[Any]]:
        first, _ = await env.reset(str(number), seed=0)
        return first, [await env.step(answer) for _, answer in example.WORKED_EXAMPLE]

    first, results = asyncio.run(play())
    observations = [first, *(result.observation for result in results)]
    assert observations[:-1] == [observation for observation, _ in example.WORKED_EXAMPLE]
    assert observations[-1] == example.EXAMPLE_ANSWERS[-1]
    assert results[-1].terminated and results[-1].info["success"] is True and results[-1].info["score"] == 100
    rewards = 0.0
    for result in results:
        rewards += result.reward
        assert rewards == pytest.approx(max(result.info["score"], 0) / 100)
