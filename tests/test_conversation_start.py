"""How an episode opens: each env's conversation start (instruction, acknowledgement, worked
examples), served by envhub, rendered by the actors as context, switchable per run and per env."""

from __future__ import annotations

import asyncio
import re
import time

import numpy as np
import pytest

from actors.conversation import ConversationStarts
from actors.engine_api import SamplingParams
from actors.episode import EpisodeDeps, run_episode
from actors.transcript_tokens import TranscriptTokens
from common.config import ConfigError, load_config
from common.config.envhub import EnvhubConfig
from common.protocol import TaskLease
from common.tiny_model import load_tiny_tokenizer
from envhub import registry
from envhub.actions import MalformedAction, extract_action
from envhub.base import ACKNOWLEDGEMENT, ConversationStart
from envhub.client import EnvClient, EnvClientError
from envhub.envs.babyai import BabyAIEnv
from envhub.envs.babyai.commands import Invalid
from envhub.envs.babyai.commands import parse_command as parse_babyai
from envhub.envs.babyai.env import worked_example_tasks
from envhub.envs.search.env import DeepSearchEnv, shared_questions
from envhub.envs.textcraft.agentgym_tree import goal_items
from envhub.envs.textcraft.catalog import load_catalog
from envhub.envs.textcraft.commands import Unparsable
from envhub.envs.textcraft.commands import parse_command as parse_textcraft
from tests.bench.actor_bench import ScriptedEngine
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

# Envs whose instruction comes from AgentGym's clients, with the phrase that marks each one.
AGENTGYM_INSTRUCTIONS = {
    "textcraft-v0": "You are given few useful crafting recipes to craft items in Minecraft.",
    "babyai-v0": "You are an exploration master that wants to finish every goal you are given.",
    "sciworld-v0": "You are an agent for science world.",
    "search-v0": "You must always reason inside <think>...</think> first;",
}


@pytest.mark.parametrize("env_id", sorted(AGENTGYM_INSTRUCTIONS))
def test_agentgym_envs_open_with_agentgym_instruction_and_acknowledgement(env_id: str) -> None:
    start = registry.conversation_start(env_id)
    assert start.instruction.startswith(AGENTGYM_INSTRUCTIONS[env_id])
    assert start.acknowledgement == ("Ok." if env_id == "search-v0" else ACKNOWLEDGEMENT)
    turns = start.turns(0)
    assert turns == [("user", start.instruction), ("assistant", start.acknowledgement)]


def test_search_example_answers_a_training_question_from_what_its_search_returned() -> None:
    start = registry.conversation_start("search-v0")
    assert start.default_examples == 0  # ~600 tokens a prompt: opt in with num_examples 1
    (question, search), (information, answer) = start.examples[0]
    assert "Question:" in question and "<search>" in search and information.startswith("<information>")
    golden = re.search(r"<answer> (.+) </answer>", answer).group(1)
    assert golden in information
    questions = shared_questions(DeepSearchEnv()._data_paths()[1])
    rows = [n for n, q in enumerate(questions) if f"Question: {q.question}" in question]
    assert rows and rows[0] in DeepSearchEnv.task_splits()["train"]  # never a held-out question


@pytest.mark.parametrize("env_id, parse, refused", [("textcraft-v0", parse_textcraft, Unparsable),
                                                    ("babyai-v0", parse_babyai, Invalid)])
def test_worked_examples_are_won_episodes_whose_replies_are_actions_of_the_env(env_id, parse, refused) -> None:
    start = registry.conversation_start(env_id)
    # AgentGym's evaluation shows no example: the default dialect shows one only when the run asks.
    assert start.default_examples == 0 and registry.conversation_start(env_id, dialect="lenient").default_examples == 1
    for example in start.examples:
        assert len(example) >= 2  # an exchange the model can follow turn by turn
        for _, reply in example:
            action = extract_action(reply)
            assert not isinstance(action, MalformedAction) and not isinstance(parse(action), refused)
    turns = start.turns(1)
    assert turns[2:] == [turn for observation, reply in start.examples[0]
                         for turn in (("user", observation), ("assistant", reply))]


def test_textcraft_examples_are_training_goals_never_held_out_ones() -> None:
    for example in registry.conversation_start("textcraft-v0").examples:
        goal = re.search(r"Goal: craft (.+)\.$", example[0][0]).group(1)
        numbers = [n for n, item in enumerate(goal_items()) if item == "minecraft:" + goal.replace(" ", "_")]
        assert numbers and numbers[0] in registry.task_splits("textcraft-v0")["depth1_train"]
    lenient_goal = re.search(r"Goal: craft (.+)\.$",
                             registry.conversation_start("textcraft-v0", dialect="lenient").examples[0][0][0]).group(1)
    catalog = load_catalog(None)
    numbers = [n for n, g in enumerate(catalog.goals) if g.item.replace("_", " ") == lenient_goal]
    assert numbers and numbers[0] in catalog.splits()["depth1_train"]


@pytest.mark.parametrize("dialect", ["agentgym", "lenient"])
def test_babyai_examples_are_training_goto_tasks_each_with_its_own_goal(dialect: str) -> None:
    examples = registry.conversation_start("babyai-v0", dialect=dialect).examples
    goals = [re.search(r"go to (?:the|a) (\w+ \w+)", example[0][0]).group(1) for example in examples]
    assert len(examples) > 1 and len(set(goals)) == len(goals)  # repeating one example's answer wins one goal
    candidates = worked_example_tasks(registry.task_splits("babyai-v0", dialect=dialect)["goto"])

    async def first_observations() -> set[str]:
        env = BabyAIEnv(dialect)
        try:
            return {(await env.reset(task_id, 0))[0] for task_id in candidates}
        finally:
            await env.close()

    played_on = asyncio.run(first_observations())
    for example, goal in zip(examples, goals):
        assert example[0][0] in played_on and example[-1][1].endswith(goal + " 1")


def test_an_episode_sees_the_examples_its_task_picks_when_fewer_are_shown_than_the_env_has() -> None:
    start = registry.conversation_start("babyai-v0")
    openings = {task_id: start.turns(1, task_id) for task_id in map(str, range(40))}
    assert all(start.turns(1, task_id) == turns for task_id, turns in openings.items())  # a group shares its prompt
    shown = {turns[2][1] for turns in openings.values()}  # each opening's first example observation
    assert shown == {example[0][0] for example in start.examples}  # 40 tasks see every example
    every = start.turns(len(start.examples), "7")
    assert every == start.turns(len(start.examples), "8")  # all shown: one order (shared by every episode)


def test_conversation_start_rejects_what_it_cannot_render() -> None:
    with pytest.raises(ValueError, match="default_examples"):
        ConversationStart("rules", examples=((("obs", "reply"),),), default_examples=2)
    with pytest.raises(ValueError, match="2 asked for"):
        ConversationStart("rules", examples=((("obs", "reply"),),)).turns(2)
    with pytest.raises(ValueError, match="not a conversation start"):
        ConversationStart.from_json({"instruction": "x", "acknowledgement": "y", "examples": [[[1, 2]]],
                                     "default_examples": 0})
    keydoor = registry.conversation_start("keydoor-v0")  # no instruction turn: its observations say it all
    assert keydoor.turns() == [] and keydoor.turns(1)[0][0] == "user" and len(keydoor.turns(1)) == 8


def test_envhub_serves_each_env_conversation_start_under_its_options() -> None:
    instruction = "You are web shopping. Reply 'Action: <action>'."
    examples = [[["You see a search box.", "Action: search[red shoes]"]]]
    cfg = EnvhubConfig(port=0, env_options={"agentgym-v0": {
        "url": "http://127.0.0.1:9", "num_tasks": 3, "instruction": instruction, "examples": examples,
        "default_examples": 1}})

    async def fetch(url: str) -> None:
        async with EnvClient(url) as client:
            assert await client.conversation_start("textcraft-v0") == registry.conversation_start("textcraft-v0")
            shop = await client.conversation_start("agentgym-v0")
            assert shop.turns() == [("user", instruction), ("assistant", ACKNOWLEDGEMENT),
                                    ("user", "You see a search box."), ("assistant", "Action: search[red shoes]")]
            with pytest.raises(EnvClientError) as unknown:
                await client.conversation_start("nosuch-v0")
            assert unknown.value.status_code == 404

    with running_hub(cfg) as url:
        asyncio.run(fetch(url))


def test_a_run_chooses_the_conversation_start_per_run_and_per_env() -> None:
    cfg = load_config(None, ["--rollout.num_examples", "0", "--rollout.conversation_per_env",
                             "{babyai-v0: {num_examples: 1}, search-v0: {conversation_start: false}}"])
    assert cfg.rollout.conversation_for("textcraft-v0") == (True, 0)
    assert cfg.rollout.conversation_for("babyai-v0") == (True, 1)
    assert cfg.rollout.conversation_for("search-v0") == (False, 0)
    assert load_config().rollout.conversation_for("babyai-v0") == (True, None)  # the env's default
    with pytest.raises(ConfigError, match="unknown config key 'rollout.conversation_per_env.babyai-v0.examples'"):
        load_config(None, ["--rollout.conversation_per_env", "{babyai-v0: {examples: 1}}"])
    with pytest.raises(ConfigError, match="num_examples"):
        load_config(None, ["--rollout.num_examples", "-2"])


def lease(env_id: str, task_id: str) -> TaskLease:
    return TaskLease(lease_id="l-0", group_id="g-0", env_id=env_id, task_id=task_id, seed=0, group_size=1,
                     turn_cap=2, max_episode_tokens=100_000, policy_version=0, deadline_unix_s=time.time() + 600)


async def scripted_episode(url: str, reply: str, settings: tuple[bool, int | None]):
    """One textcraft episode of a test double engine that always writes ``reply``."""
    tokenizer = load_tiny_tokenizer()
    reply_ids = tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id]
    async with EnvClient(url) as env:
        conversation = ConversationStarts(env, lambda env_id: settings)
        deps = EpisodeDeps(0, ScriptedEngine(reply_ids), env, tokenizer, SamplingParams(64), None, conversation)
        return await run_episode(lease("textcraft-v0", "0"), 0, deps), tokenizer


def test_an_episode_opens_with_the_conversation_start_as_context_and_counts_parsed_actions() -> None:
    start = registry.conversation_start("textcraft-v0")
    with running_hub(EnvhubConfig(port=0)) as url:
        parsed, tokenizer = asyncio.run(scripted_episode(url, "Thought:\nfirst.\n\nAction:\ninventory", (True, 1)))
        prose, _ = asyncio.run(scripted_episode(url, "I like crafting tables.", (True, 0)))
        plain, _ = asyncio.run(scripted_episode(url, "Action: inventory", (False, 1)))
        refused, _ = asyncio.run(scripted_episode(url, "Thought:\nfirst.\n\nAction:\nget 1 unobtainium", (True, 1)))

    assert parsed.status == "ok" and parsed.num_turns == 2
    assert parsed.score == 0.0  # AgentGym's score travels from the env's info to the trajectory
    np.testing.assert_array_equal(parsed.turn_action_parsed, [1, 1])
    np.testing.assert_array_equal(prose.turn_action_parsed, [0, 0])
    np.testing.assert_array_equal(parsed.turn_action_accepted, [1, 1])  # the env carried "inventory" out
    np.testing.assert_array_equal(refused.turn_action_parsed, [1, 1])  # a well-formed "get"...
    np.testing.assert_array_equal(refused.turn_action_accepted, [0, 0])  # ...of nothing the env has
    context = tokenizer.decode(parsed.token_ids[: parsed.turn_spans[0, 0]])
    example_reply = start.turns(1, "0")[3][1]  # task 0's own pick of the six
    positions = [context.index(text) for text in (start.instruction[:60], ACKNOWLEDGEMENT, example_reply,
                                                   "Goal: craft acacia planks.")]
    assert positions == sorted(positions)
    assert not parsed.loss_mask[: parsed.turn_spans[0, 0]].any()
    assert example_reply not in tokenizer.decode(prose.token_ids)  # 0 examples: instruction only
    plain_context = tokenizer.decode(plain.token_ids[: plain.turn_spans[0, 0]])
    assert ACKNOWLEDGEMENT not in plain_context and example_reply not in plain_context  # off: one user turn
    assert plain_context.index(start.instruction[:60]) < plain_context.index("Crafting commands:")


def test_an_actor_asking_an_env_for_more_examples_than_it_has_fails_at_start() -> None:
    async def check(url: str) -> None:
        async with EnvClient(url) as env:
            await ConversationStarts(env, lambda env_id: (True, 1)).check(["textcraft-v0"])
            await ConversationStarts(env, lambda env_id: (False, 9)).check(["textcraft-v0"])  # off: not shown
            with pytest.raises(ValueError, match="textcraft-v0: this env has 6 worked examples; 7 asked for"):
                await ConversationStarts(env, lambda env_id: (True, 7)).check(["textcraft-v0"])

    with running_hub(EnvhubConfig(port=0)) as url:
        asyncio.run(check(url))


def test_an_actor_whose_conversation_start_leaves_no_room_in_the_budget_fails_at_start() -> None:
    # Seen in a user run: TextCraft's instruction and two examples (1.4-2.1k tokens of the tiny
    # byte-level tokenizer) under max_episode_tokens 512 failed every episode, and the run went on.
    tokens = TranscriptTokens(load_tiny_tokenizer(), None)

    async def check(url: str) -> None:
        async with EnvClient(url) as env:
            start = await env.conversation_start("textcraft-v0")
            shown, off = (ConversationStarts(env, lambda env_id, on=on: (on, 2)) for on in (True, False))
            length = len(tokens.opening_ids(start.turns(2), ""))
            await shown.check(["textcraft-v0"], tokens.opening_ids, length + 1)
            with pytest.raises(ConfigError, match=f"textcraft-v0: its conversation start alone is {length} "
                                                  f"tokens, no room in rollout.max_episode_tokens {length}"):
                await shown.check(["textcraft-v0"], tokens.opening_ids, length)
            instruction_only = len(tokens.opening_ids([], start.instruction))
            assert instruction_only < length
            await off.check(["textcraft-v0"], tokens.opening_ids, instruction_only + 1)  # off: no examples count

    with running_hub(EnvhubConfig(port=0)) as url:
        asyncio.run(check(url))
