"""textcraft-v0: recipe loading and parity, the crafting rules, a scripted planner, real HTTP.

Most tests here are about the ``lenient`` dialect (LENIENT); tests/test_fidelity_textcraft.py covers
the default ``agentgym`` dialect. The ADaPT recipe folder (shared/data/textcraft-adapt-recipes beside
the repo) must give the original's 544 goals (125 / 291 / 117 / 11 at depths 1-4); the lenient
dialect's default recipe set, built from minecraft-data (pc 1.16.2), gives 546 (126 / 291 / 118 / 11).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from common.config.envhub import EnvhubConfig
from envhub import registry
from envhub.base import StepResult
from envhub.client import EnvClient
from envhub.conformance import check_env
from envhub.envs.textcraft.agentgym_tree import goal_items
from envhub.envs.textcraft.catalog import Catalog, load_catalog
from envhub.envs.textcraft.datapack import load_datapack
from envhub.envs.textcraft.env import TextCraftEnv
from envhub.envs.textcraft.recipes import RecipeBook
from envhub.main import EnvhubServer

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

ENV_ID = "textcraft-v0"
ADAPT_DIR_NAME = Path("data") / "textcraft-adapt-recipes"
ADAPT_CANDIDATES = (Path(__file__).resolve().parents[2] / "shared" / ADAPT_DIR_NAME,
                    Path("/work/shared") / ADAPT_DIR_NAME)
ADAPT_DIR = next((path for path in ADAPT_CANDIDATES if path.is_dir()), None)
needs_adapt = pytest.mark.skipif(ADAPT_DIR is None, reason=f"ADaPT recipe folder absent (looked in {ADAPT_CANDIDATES})")
LENIENT = {"dialect": "lenient"}
COMMAND_LINE = re.compile(r"^craft (\d+) (.+?) using (.+)$")


def adapt_options() -> dict[str, str]:
    return {"recipes_dir": str(ADAPT_DIR)}


def depth_counts(catalog: Catalog) -> dict[int, int]:
    return dict(sorted(Counter(goal.depth for goal in catalog.goals).items()))


def task_of(catalog: Catalog, item: str) -> str:
    return str(next(number for number, goal in enumerate(catalog.goals) if goal.item == item))


def reply(action: str) -> str:
    return f"Thought: next step.\nAction: {action}"


async def play(env: TextCraftEnv, actions: list[str]) -> list[StepResult]:
    return [await env.step(reply(action)) for action in actions]


# --- a planner that reads the crafting commands of the first observation -------------------


def parse_commands(observation: str) -> dict[str, list[tuple[int, list[tuple[str, int]]]]]:
    """Output item id -> [(yield, [(ingredient id, count)])] from the observation's command lines."""
    recipes: dict[str, list[tuple[int, list[tuple[str, int]]]]] = {}
    for line in observation.splitlines():
        match = COMMAND_LINE.match(line)
        if match:
            parts = [part.strip().split(" ", 1) for part in match.group(3).split(",")]
            ingredients = [(name.replace(" ", "_"), int(count)) for count, name in parts]
            recipes.setdefault(match.group(2).replace(" ", "_"), []).append((int(match.group(1)), ingredients))
    return recipes


class Planner:
    """Gets base items and crafts bottom-up, tracking the inventory it expects the env to hold."""

    def __init__(self, observation: str, book: RecipeBook) -> None:
        self.recipes = parse_commands(observation)
        self.book = book
        self.inventory: Counter[str] = Counter()
        self.actions: list[str] = []

    def obtain(self, item: str, count: int, visiting: frozenset[str] = frozenset()) -> None:
        while self.inventory[item] < count:
            if item not in self.recipes:
                assert self.book.is_base(item), f"{item} is neither craftable from the commands nor a base item"
                self.actions.append(f"get {count - self.inventory[item]} {item.replace('_', ' ')}")
                self.inventory[item] = count
                return
            self.craft_once(item, visiting | {item})

    def craft_once(self, item: str, visiting: frozenset[str]) -> None:
        made, ingredients = next(
            (made, parts) for made, parts in self.recipes[item]
            if not any(self.resolve(name) in visiting for name, _ in parts))
        concrete = [(self.resolve(name), count) for name, count in ingredients]
        for _ in range(4):  # gathering one ingredient may use up another: repeat until all are held
            for name, count in concrete:
                self.obtain(name, count, visiting)
            if all(self.inventory[name] >= count for name, count in concrete):
                break
        inputs = ", ".join(f"{count} {name.replace('_', ' ')}" for name, count in concrete)
        self.actions.append(f"craft {made} {item.replace('_', ' ')} using {inputs}")
        self.inventory.subtract(dict(concrete))
        self.inventory[item] += made

    def resolve(self, name: str) -> str:
        """A tag's member to use (a base one when there is one), or the item itself."""
        members = sorted(self.book.tags.get(name, ()))
        if not members:
            return name
        return next((member for member in members if self.book.is_base(member)), None) or next(
            member for member in members if member in self.recipes)


async def solve(env: TextCraftEnv, catalog: Catalog, task_id: str) -> list[StepResult]:
    observation, _ = await env.reset(task_id, seed=7)
    planner = Planner(observation, catalog.book)
    planner.obtain(catalog.goals[int(task_id)].item, 1)
    results = await play(env, planner.actions)
    for action, result in zip(planner.actions, results):
        assert result.observation.startswith(("Got", "Crafted")), (action, result.observation)
    return results


# --- recipe sets ---------------------------------------------------------------------------


@needs_adapt
def test_adapt_recipes_give_the_original_goal_counts() -> None:
    catalog = load_catalog(str(ADAPT_DIR))
    assert len(catalog.goals) == 544
    assert depth_counts(catalog) == {1: 125, 2: 291, 3: 117, 4: 11}
    splits = registry.task_splits(ENV_ID, **adapt_options())
    assert [len(splits[f"depth{depth}"]) for depth in range(1, 5)] == [125, 291, 117, 11]


def test_default_recipes_load_offline_with_wood_tags_and_every_depth() -> None:
    catalog = load_catalog(None)
    assert len(catalog.goals) == 546 and depth_counts(catalog) == {1: 126, 2: 291, 3: 118, 4: 11}
    tags = catalog.book.tags
    assert {"oak_planks", "birch_planks", "crimson_planks"} <= tags["planks"]
    assert {"oak_log", "stripped_birch_wood"} <= tags["logs"] and tags["oak_logs"] < tags["logs"]
    assert [recipe.command() for recipe in catalog.book.recipes["stick"]][0] == "craft 4 stick using 2 planks"


def test_goals_are_ordered_by_depth_then_name_and_splits_partition_them() -> None:
    catalog = load_catalog(None)
    keys = [(goal.depth, goal.item) for goal in catalog.goals]
    assert keys == sorted(keys)
    splits = registry.task_splits(ENV_ID, **LENIENT)
    train, test = set(splits["train"]), set(splits["test"])
    assert not train & test and train | test == set(splits["all"]) == set(range(len(catalog.goals)))
    for depth in range(1, 5):
        assert test & set(splits[f"depth{depth}"]), f"depth {depth} has no held-out goal"
        # one depth's own train/test (a curriculum on depth 1, validated on unseen depth-1 goals)
        assert set(splits[f"depth{depth}_test"]) == test & set(splits[f"depth{depth}"])
        assert set(splits[f"depth{depth}_train"]) == train & set(splits[f"depth{depth}"])
    assert len(test) == sum(-(-len(splits[f"depth{depth}"]) // 5) for depth in range(1, 5))


def test_datapack_format_shaped_shapeless_groups_and_alternatives(tmp_path: Path) -> None:
    def result(item: str, count: int) -> dict[str, object]:
        return {"item": f"minecraft:{item}", "count": count}

    files = {
        "oak_planks": {"type": "minecraft:crafting_shapeless", "group": "planks",
                       "ingredients": [{"tag": "minecraft:oak_logs"}], "result": result("oak_planks", 4)},
        "birch_planks": {"type": "minecraft:crafting_shapeless", "group": "planks",
                         "ingredients": [{"tag": "minecraft:birch_logs"}], "result": result("birch_planks", 4)},
        "stick": {"type": "minecraft:crafting_shaped", "pattern": ["#", "#"],
                  "key": {"#": {"tag": "minecraft:planks"}}, "result": result("stick", 4)},
        "torch": {"type": "minecraft:crafting_shaped", "pattern": ["X", "#"], "result": result("torch", 4),
                  "key": {"X": [{"item": "minecraft:coal"}, {"item": "minecraft:charcoal"}],
                          "#": {"item": "minecraft:stick"}}},
        "charcoal": {"type": "minecraft:smelting", "ingredient": {"tag": "minecraft:logs"},
                     "result": "minecraft:charcoal"},
    }
    for name, recipe in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(recipe))
    book = load_datapack(tmp_path)
    assert book.tags == {"planks": frozenset({"oak_planks", "birch_planks"})}
    assert book.is_base("oak_logs") and book.is_base("coal") and not book.is_base("stick")
    assert [recipe.command() for recipe in book.recipes["torch"]] == ["craft 4 torch using 1 coal, 1 stick"]
    assert "charcoal" not in book.recipes  # smelting is not crafting
    goals = load_catalog(str(tmp_path)).goals
    assert [(goal.item, goal.depth) for goal in goals] == [
        ("birch_planks", 1), ("oak_planks", 1), ("stick", 2), ("torch", 3)]


# --- playing -------------------------------------------------------------------------------


@pytest.mark.parametrize("recipe_set", ["default", pytest.param("adapt", marks=needs_adapt)])
def test_scripted_planner_solves_every_goal_from_the_shown_commands(recipe_set: str) -> None:
    options = (adapt_options() if recipe_set == "adapt" else {}) | LENIENT
    catalog = load_catalog(options.get("recipes_dir"))

    async def body() -> None:  # every goal of every depth: the whole set plays in about a second
        for task_id in registry.task_ids(ENV_ID, "all", **options):
            results = await solve(TextCraftEnv(**options), catalog, task_id)
            last = results[-1]
            assert (last.reward, last.terminated, last.info["success"]) == (1.0, True, True), task_id
            assert all(result.reward == 0.0 and not result.terminated for result in results[:-1])

    asyncio.run(body())


def test_a_tag_accepts_any_member_kind() -> None:
    catalog = load_catalog(None)

    async def body() -> None:
        env = TextCraftEnv(**LENIENT)
        await env.reset(task_of(catalog, "stick"), seed=0)
        results = await play(env, ["get 1 birch log", "craft 4 birch planks using 1 birch log",
                                   "craft 4 stick using 2 birch planks"])
        assert [result.observation for result in results] == [
            "Got 1 birch log", "Crafted 4 birch planks", "Crafted 4 stick"]
        assert results[-1].reward == 1.0 and results[-1].info["success"] is True

    asyncio.run(body())


def test_get_refuses_crafted_items_groups_and_unknown_items() -> None:
    async def body() -> None:
        env = TextCraftEnv(**LENIENT)
        await env.reset("0", seed=0)
        crafted, group, unknown, zero, inventory = await play(
            env, ["get 1 stick", "get 2 planks", "get 1 unobtainium", "get 0 dirt", "inventory"])
        assert crafted.observation.startswith("Could not find stick") and "crafted" in crafted.observation
        assert "group" in group.observation and "planks" in group.observation
        assert "no such item" in unknown.observation
        assert zero.observation.startswith("Could not get 0 dirt")
        assert inventory.observation == "Inventory: You are not carrying anything."

    asyncio.run(body())


def test_craft_needs_exact_counts_and_held_ingredients() -> None:
    catalog = load_catalog(None)

    async def body() -> None:
        env = TextCraftEnv(**LENIENT)
        await env.reset(task_of(catalog, "crafting_table"), seed=0)
        results = await play(env, [
            "get 2 oak log",
            "craft 8 oak planks using 2 oak log",  # the recipe takes exactly 1 log
            "craft 4 crafting table using 4 oak planks",  # held: none yet
            "craft 4 oak planks using 1 oak log, 1 dirt",  # an extra ingredient
            "inventory",
        ])
        assert "valid recipe" in results[1].observation and "counts must match" in results[1].observation
        assert results[2].observation.startswith("Could not find enough items to craft crafting table")
        assert "you have 0 oak planks" in results[2].observation
        assert results[4].observation == "Inventory: [oak log] (2)"  # nothing was consumed
        assert not any(result.terminated for result in results)

    asyncio.run(body())


def test_malformed_replies_get_feedback_and_names_are_lenient() -> None:
    async def body() -> None:
        env = TextCraftEnv(**LENIENT)
        await env.reset("0", seed=0)
        no_marker = await env.step("I will get some wood.")
        nonsense = await env.step("Action: dance wildly")
        bad_ingredient = await env.step("Action: craft 4 acacia planks using some acacia log")
        prefixed = await env.step("Thought: ok\nAction: get 1 minecraft:acacia_log.")
        for result in (no_marker, nonsense, bad_ingredient):
            assert result.reward == 0.0 and not result.terminated and result.observation
        assert "Action:" in no_marker.observation
        assert nonsense.observation.startswith("Could not execute") and "get N item" in nonsense.observation
        assert bad_ingredient.observation.startswith("Wrong item format")
        assert prefixed.observation == "Got 1 acacia log"

    asyncio.run(body())


def test_reset_is_deterministic_and_lists_the_goal_and_its_commands() -> None:
    catalog = load_catalog(None)
    task_id = task_of(catalog, "lectern")

    async def body() -> None:
        first, info = await TextCraftEnv(**LENIENT).reset(task_id, seed=3)
        again, _ = await TextCraftEnv(**LENIENT).reset(task_id, seed=3)
        assert first == again
        assert first.rstrip().endswith("Goal: craft lectern.")
        assert info == {"success": False, "goal": "lectern", "depth": 4}
        assert "craft 1 lectern using 4 wooden slabs, 1 bookshelf" in first
        assert first.startswith("Crafting commands:\n")  # the instruction is the conversation start's
        others = {(await TextCraftEnv(**LENIENT).reset(task_id, seed=seed))[0] for seed in range(4)}
        assert len(others) > 1  # the seed reshuffles commands and distractors
        no_distractors, _ = await TextCraftEnv(num_distractors=0, **LENIENT).reset(task_id, seed=3)
        assert len(parse_commands(no_distractors)) < len(parse_commands(first))

    asyncio.run(body())


def test_bad_options_are_rejected_clearly() -> None:
    with pytest.raises(ValueError, match="num_distractors"):
        TextCraftEnv(num_distractors=-1)
    with pytest.raises(FileNotFoundError, match="recipes_dir"):
        TextCraftEnv(recipes_dir="/nonexistent/recipes")
    with pytest.raises(TypeError, match="unknown options"):
        TextCraftEnv.task_splits(recipe_dir="/typo")


# --- conformance and HTTP --------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub_urls() -> Iterator[tuple[str, str | None]]:
    """A hub with the default recipes, and one configured with the ADaPT folder (None if absent)."""
    default_server = EnvhubServer(EnvhubConfig())
    default_server.start_in_thread()
    adapt_server = EnvhubServer(EnvhubConfig(env_options={ENV_ID: adapt_options()})) if ADAPT_DIR else None
    if adapt_server is not None:
        adapt_server.start_in_thread()
    try:
        yield default_server.base_url, adapt_server.base_url if adapt_server else None
    finally:
        default_server.stop()
        if adapt_server is not None:
            adapt_server.stop()


def test_conformance_in_process_wins_with_the_example_actions() -> None:
    report = asyncio.run(check_env(TextCraftEnv(), ENV_ID, task_id="0"))
    assert report.reached_terminal and report.success is True


def test_conformance_in_process_under_the_lenient_dialect() -> None:
    lenient_win = ("Thought: logs first.\nAction: get 1 acacia log",
                   "Thought: planks.\nAction: craft 4 acacia planks using 1 acacia log")
    report = asyncio.run(check_env(TextCraftEnv(**LENIENT), ENV_ID, task_id="0", actions=lenient_win,
                                   options=LENIENT))
    assert report.reached_terminal and report.success is True


def test_conformance_over_http(hub_urls: tuple[str, str | None]) -> None:
    async def body() -> None:
        async with EnvClient(hub_urls[0]) as client:
            report = await check_env(client, ENV_ID, task_id="0")
            assert report.reached_terminal and report.success is True

    asyncio.run(body())


@needs_adapt
def test_http_hub_serves_the_configured_recipe_folder(hub_urls: tuple[str, str | None]) -> None:
    async def body() -> None:
        url = hub_urls[1]
        assert url is not None
        async with EnvClient(url) as client:
            listed = {env["id"]: env for env in await client.list_envs()}
            assert listed[ENV_ID]["splits"]["all"] == 544
            task_id = str(goal_items(str(ADAPT_DIR)).index("minecraft:oak_planks"))  # agentgym: AgentGym's order
            handle = await client.create(ENV_ID, task_id, seed=1)
            assert "craft 4 oak planks using 1 oak logs" in handle.observation
            got = await client.step(handle.session_id, reply("get 1 oak logs"))
            made = await client.step(handle.session_id, reply("craft 4 oak planks using 1 oak logs"))
            await client.close(handle.session_id)
        assert got.observation == "Got 1 oak logs"
        assert made.reward == 1.0 and made.terminated and made.info["success"] is True

    asyncio.run(body())
