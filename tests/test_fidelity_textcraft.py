"""textcraft-v0 under the agentgym dialect: AgentGym's goals, grammar, observations and scores.

The ADaPT recipe folder (the files AgentGym's TextCraft server reads) is looked for beside the repo;
tests that need it skip, saying so, when it is absent.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from envhub import registry
from envhub.envs.textcraft.agentgym_game import client_action
from envhub.envs.textcraft.agentgym_tree import AgentGymTree, build_tree, display, load_agentgym_tree
from envhub.envs.textcraft.env import TextCraftEnv
from envhub.envs.textcraft.fidelity import fidelity_cases, reply
from envhub.envs.textcraft.pack import read_pack_folder
from envhub.envs.textcraft.pack_mcdata import pack_recipes_from_minecraft_data
from envhub.fidelity import play_case

ADAPT_DIR_NAME = Path("data") / "textcraft-adapt-recipes"
ADAPT_CANDIDATES = (Path(__file__).resolve().parents[2] / "shared" / ADAPT_DIR_NAME,
                    Path("/work/shared") / ADAPT_DIR_NAME)
ADAPT_DIR = next((path for path in ADAPT_CANDIDATES if path.is_dir()), None)
needs_adapt = pytest.mark.skipif(ADAPT_DIR is None, reason=f"ADaPT recipe folder absent (looked in {ADAPT_CANDIDATES})")


@pytest.mark.parametrize("case", fidelity_cases(), ids=lambda case: case.name[:40])
def test_fidelity_case_plays_as_agentgym_answers(case) -> None:
    assert asyncio.run(play_case(TextCraftEnv(**case.options), case)) == []


@needs_adapt
def test_default_goals_are_agentgyms_544_in_its_order() -> None:
    """Task id N is AgentGym's data_idx N, its recipe files read in ls order (125/291/117/11 per depth)."""
    adapt = build_tree(read_pack_folder(ADAPT_DIR))
    default = load_agentgym_tree(None)
    assert len(adapt.goals) == 544
    assert default.goals == adapt.goals
    assert Counter(default.depths[goal] for goal in default.goals) == {1: 125, 2: 291, 3: 117, 4: 11}
    assert registry.task_ids("textcraft-v0", "all") == [str(number) for number in range(544)]


@needs_adapt
def test_minecraft_data_rebuilds_adapts_crafting_recipe_files() -> None:
    """Same recipes, ingredient order, tags and groups: every crafting command reads as AgentGym's."""
    assert Counter(pack_recipes_from_minecraft_data()) == Counter(read_pack_folder(ADAPT_DIR))


@needs_adapt
def test_default_tree_and_every_first_observation_are_those_of_adapts_files() -> None:
    """Items, tags, groups and every item's recipes in AgentGym's order, hence the same crafting commands
    and distractors for every task as AgentGym's server shows with ADaPT's files read in ls order."""
    adapt, default = build_tree(read_pack_folder(ADAPT_DIR)), load_agentgym_tree(None)
    assert default == adapt
    for goal in adapt.goals:
        assert default.crafting_commands(goal, random.Random(42)) == adapt.crafting_commands(goal, random.Random(42))


def test_a_tag_without_craftable_members_is_a_gettable_item() -> None:
    tree = load_agentgym_tree(None)
    assert "minecraft:acacia_logs" in tree.item_ids and "minecraft:acacia_logs" not in tree.tags
    assert "minecraft:planks" in tree.tags


@pytest.mark.parametrize("text, sent", [
    ("Thought:\nx\n\nAction:\nget 1 oak log", "get 1 oak log"),
    ("Action: craft 4 oak_planks using 1 oak_log!", "craft 4 oakplanks using 1 oaklog"),
    ("Action:   get 1   oak log  \nThought: later", "get 1 oak log"),
    ("no action line at all", ""),
    ("action: get 1 oak log", ""),
    ("Action: get 1 oak log\nAction: inventory", None),
])
def test_client_extracts_and_strips_the_action_as_agentgym_does(text: str, sent: str | None) -> None:
    assert client_action(text) == sent


def test_steps_carry_score_parsed_and_valid_flags() -> None:
    async def play() -> list:
        env = TextCraftEnv()
        await env.reset("0", seed=5)
        return [await env.step(reply(action)) for action in ("dance", "get 1 acacia planks", "get 1 acacia logs")]

    dance, refused, got = asyncio.run(play())
    assert [step.info["score"] for step in (dance, refused, got)] == [0.0, 0.0, 0.0]
    assert [step.info["action_parsed"] for step in (dance, refused, got)] == [False, True, True]
    assert (refused.info["action_valid"], got.info["action_valid"]) == (False, True)


def test_agentgym_tasks_ignore_the_seed_as_agentgyms_server_does() -> None:
    async def first(seed: int) -> str:
        return (await TextCraftEnv().reset("183", seed=seed))[0]

    assert asyncio.run(first(0)) == asyncio.run(first(7))


def test_unknown_dialect_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="dialect.*agentgym, lenient"):
        TextCraftEnv(dialect="strict")


def test_conversation_start_is_agentgyms_instruction_with_examples_in_its_grammar() -> None:
    start = TextCraftEnv.conversation_start()
    assert start.instruction.startswith("You are given few useful crafting recipes")
    assert start.default_examples == 0  # AgentGym's evaluation shows none
    for example in start.examples:
        replies = [turn[1] for turn in example]
        assert all(text.startswith("Thought:\n") and "\n\nAction:\n" in text for text in replies)
        assert all(client_action(text) for text in replies)


@pytest.mark.parametrize("num_distractors", [10, 2])
def test_each_worked_example_is_a_won_training_episode_of_its_own_goal(num_distractors: int) -> None:
    """Replayed through the env on its goal's training task, each example's replies meet the same
    observations and win, so an example is what the env shows; no two share a goal, none is held out."""
    start = TextCraftEnv.conversation_start(num_distractors=num_distractors)
    splits = TextCraftEnv.task_splits()
    goals = {display(goal): number for number, goal in enumerate(load_agentgym_tree(None).goals)}
    names = [re.search(r"Goal: craft (.+)\.", example[0][0]).group(1) for example in start.examples]
    assert len(start.examples) == 6 and len(set(names)) == 6
    for name, example in zip(names, start.examples, strict=True):
        assert goals[name] in splits["depth1_train"]
        env = TextCraftEnv(num_distractors=num_distractors)
        observation, _ = asyncio.run(env.reset(str(goals[name]), 0))
        for expected, reply_text in example:
            assert observation == expected
            result = asyncio.run(env.step(reply_text))
            observation = result.observation
        assert result.terminated and result.reward == 1


# --- every goal can be won from the commands AgentGym shows -----------------------------------


class CommandPlanner:
    """Gets what no shown command makes, crafts the rest bottom-up (a tag: a member a command makes)."""

    def __init__(self, observation: str, tree: AgentGymTree) -> None:
        self.tree = tree
        self.recipes: dict[str, list[tuple[int, list[tuple[str, int]]]]] = {}
        for line in observation.splitlines():
            match = re.match(r"^craft (\d+) (.+?) using (.+)$", line)
            if match:
                written = (part.split(" ", 1) for part in match.group(3).split(", "))
                parts = [(name, int(count)) for count, name in written]
                self.recipes.setdefault(match.group(2), []).append((int(match.group(1)), parts))
        self.inventory: Counter[str] = Counter()
        self.actions: list[str] = []

    def obtain(self, name: str, count: int, visiting: frozenset[str] = frozenset()) -> None:
        while self.inventory[name] < count:
            if name not in self.recipes:
                self.actions.append(f"get {count - self.inventory[name]} {name}")
                self.inventory[name] = count
                return
            self.craft_once(name, visiting | {name})

    def craft_once(self, name: str, visiting: frozenset[str]) -> None:
        made, parts = next((made, parts) for made, parts in self.recipes[name]
                           if not any(self.resolve(part) in visiting for part, _ in parts))
        concrete = [(self.resolve(part), count) for part, count in parts]
        for _ in range(4):  # gathering one ingredient may use up another: repeat until all are held
            for part, count in concrete:
                self.obtain(part, count, visiting)
            if all(self.inventory[part] >= count for part, count in concrete):
                break
        self.actions.append(f"craft {made} {name} using " + ", ".join(f"{count} {part}" for part, count in concrete))
        self.inventory.subtract(dict(concrete))
        self.inventory[name] += made

    def resolve(self, name: str) -> str:
        tag = "minecraft:" + name.replace(" ", "_")
        if tag not in self.tree.tags:
            return name
        members = sorted(display(item) for item, of in self.tree.tag_of_item.items() if of == tag)
        return next(member for member in members if member in self.recipes)


def test_every_default_goal_is_won_from_the_commands_shown() -> None:
    tree = load_agentgym_tree(None)

    async def body() -> None:
        for number, goal in enumerate(tree.goals):
            env = TextCraftEnv()
            observation, _ = await env.reset(str(number), seed=0)
            planner = CommandPlanner(observation, tree)
            planner.obtain(display(goal), 1)
            results = [await env.step(reply(action)) for action in planner.actions]
            assert all(result.observation.startswith(("Got", "Crafted")) for result in results), (goal, results)
            assert [result.info["score"] for result in results] == [0.0] * (len(results) - 1) + [1.0], goal
            assert results[-1].terminated and results[-1].info["success"] is True

    asyncio.run(body())


def test_a_count_the_server_cannot_read_ends_the_episode_unwon() -> None:
    async def play():
        env = TextCraftEnv()
        await env.reset("0", seed=0)
        return await env.step(reply("get " + "9" * 5000 + " acacia logs"))

    result = asyncio.run(play())
    assert result.terminated and result.info["success"] is False and result.info["score"] == 0.0

