"""AgentGym's TextCraft crafting tree, built from recipe files (agentgym dialect of ``textcraft-v0``).

Follows agentenv-textcraft/agentenv_textcraft/crafting_tree.py (``CraftingTree``) rule for rule,
over PackRecipes taken in the order given (pack.py and pack_mcdata.py document that order):

1. every ingredient and output name is recorded as an item, or as a tag when the file said ``tag``;
2. block decompression (one ``*_block`` ingredient) is then dropped;
3. a recipe's ``group`` becomes a tag ``minecraft:<group>`` whose members are the outputs of that
   group (the last group seen for an item wins), unless the group is the output's own name;
4. a recipe whose output is among what its ingredients are (transitively) made of is dropped;
5. a tag used by a kept recipe with no craftable member becomes a plain item (``minecraft:logs``).

Goals (task ids): the craftable items in the order their first kept recipe was read, stably sorted
by crafting depth (``reset``'s ``sorted(..., key=depth)`` in environment.py).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

from envhub.envs.textcraft.pack import PackRecipe

NAMESPACE = "minecraft:"
USES_SAMPLED = 10
"""Recipes drawn per ingredient as distractor candidates (``create_recipe_set``)."""
MAX_DISTRACTORS = 10
"""Distractors shown (``TextCraftEnv.reset``'s max_distractor)."""


def display(name: str) -> str:
    """AgentGym's ``item_id_to_str``: ``minecraft:dark_oak_planks`` -> ``dark oak planks``."""
    return name.replace(NAMESPACE, "").replace("_", " ")


@dataclass(frozen=True)
class TreeInput:
    """One ingredient of a kept recipe: an item id, or a tag (then any member item fits)."""

    name: str
    is_tag: bool
    count: int


@dataclass(frozen=True)
class TreeRecipe:
    """One kept recipe as AgentGym holds it."""

    inputs: tuple[TreeInput, ...]
    output: str
    """Output item id."""
    output_tag: str | None
    """``minecraft:<group>``, also when the group is the output's own name (AgentGym keeps it so)."""
    count: int

    def command(self) -> str:
        """AgentGym's ``Recipe.recipe_str``: ``craft 4 oak planks using 1 oak log``."""
        inputs = ", ".join(f"{part.count} {display(part.name)}" for part in self.inputs)
        return f"craft {self.count} {display(self.output)} using {inputs}"


@dataclass
class AgentGymTree:
    """The crafting tree: which names are items or tags, and the kept recipes."""

    item_ids: set[str] = field(default_factory=set)
    tags: set[str] = field(default_factory=set)
    tag_of_item: dict[str, str] = field(default_factory=dict)
    item_recipes: dict[str, list[TreeRecipe]] = field(default_factory=dict)
    tag_recipes: dict[str, list[TreeRecipe]] = field(default_factory=dict)

    def is_craftable(self, name: str) -> bool:
        return name in self.item_recipes or name in self.tag_recipes

    def recipes_of(self, name: str) -> list[TreeRecipe]:
        return self.item_recipes.get(name) or self.tag_recipes.get(name) or []

    @functools.cached_property
    def depths(self) -> dict[str, int]:
        """Minimum crafting depth of every craftable name (``get_min_depth``)."""
        found: dict[str, int] = {}
        for name in [*self.item_recipes, *self.tag_recipes]:
            _depth(self, name, found, set())
        return found

    @functools.cached_property
    def goals(self) -> tuple[str, ...]:
        """Task id i -> goal item id (see the module docstring)."""
        craftable = [item for item in self.item_recipes if self.depths[item] >= 1]
        return tuple(sorted(craftable, key=lambda item: self.depths[item]))

    @functools.cached_property
    def uses(self) -> dict[str, list[TreeRecipe]]:
        """Recipes using each name, item recipes first then tag recipes (``collect_item_uses``)."""
        found: dict[str, list[TreeRecipe]] = {}
        for recipes in [*self.item_recipes.values(), *self.tag_recipes.values()]:
            for recipe in recipes:
                for part in recipe.inputs:
                    found.setdefault(part.name, []).append(recipe)
        return found

    def recipe_tree(self, name: str, path: frozenset[str] = frozenset()) -> list[TreeRecipe]:
        """Every recipe below ``name``, depth first, repeats kept (``traverse_recipe_tree``)."""
        if name in path:
            return []
        current = self.recipes_of(name)
        collected = list(current)
        for recipe in current:
            for part in recipe.inputs:
                collected += self.recipe_tree(part.name, path | {name})
        return collected

    def crafting_commands(self, goal: str, rng: random.Random, max_distractors: int = MAX_DISTRACTORS) -> list[str]:
        """The commands one task shows: its tree and up to 10 distractors, shuffled (``reset``).

        AgentGym iterates Python sets of command strings here, whose order changes with the
        process's hash seed; we take them sorted, so a task's commands are the same every time.
        """
        tree = self.recipe_tree(goal)
        candidates: list[TreeRecipe] = []
        for recipe in tree:
            for part in recipe.inputs:
                uses = self.uses.get(part.name)
                if uses:
                    candidates += rng.sample(uses, min(len(uses), USES_SAMPLED))
        commands = {recipe.command() for recipe in tree}
        distractors = sorted({recipe.command() for recipe in candidates} - commands)
        listing = sorted(commands) + rng.sample(distractors, min(len(distractors), max_distractors))
        rng.shuffle(listing)
        return listing


def _depth(tree: AgentGymTree, name: str, found: dict[str, int], in_progress: set[str]) -> int:
    if name in found:
        return found[name]
    recipes = tree.recipes_of(name)
    if not recipes:
        return 0
    if name in in_progress:  # AgentGym would recurse forever; no recipe set it serves has such a cycle
        raise ValueError(f"textcraft-v0: recipes for {name} form a cycle; AgentGym cannot order these goals")
    in_progress.add(name)
    depth = min(max(_depth(tree, part.name, found, in_progress) + 1 for part in recipe.inputs) for recipe in recipes)
    in_progress.discard(name)
    found[name] = depth
    return depth


def build_tree(recipes: Iterable[PackRecipe]) -> AgentGymTree:
    """AgentGym's crafting tree of ``recipes``, taken in the given order (module docstring, rules 1-5)."""
    tree = AgentGymTree()
    made_from: dict[str, set[str]] = {}
    for pack in recipes:
        for part in pack.ingredients:
            (tree.tags if part.is_tag else tree.item_ids).add(part.name)
        tree.item_ids.add(pack.output)
        if len(pack.ingredients) == 1 and pack.ingredients[0].name.endswith("_block"):
            continue
        output_tag = None if pack.group is None else NAMESPACE + pack.group
        if output_tag is not None and output_tag != pack.output:
            tree.tags.add(output_tag)
            tree.tag_of_item[pack.output] = output_tag
        dependencies = made_from.setdefault(pack.output, set())
        if any(pack.output in made_from.get(part.name, ()) for part in pack.ingredients):
            continue
        inputs = tuple(TreeInput(part.name, part.is_tag, part.count) for part in pack.ingredients)
        recipe = TreeRecipe(inputs, pack.output, output_tag, pack.count)
        tree.item_recipes.setdefault(pack.output, []).append(recipe)
        for part in pack.ingredients:
            dependencies.add(part.name)
            dependencies.update(made_from.get(part.name, ()))
        if output_tag is not None:
            tree.tag_recipes.setdefault(output_tag, []).append(recipe)
    _untag_uncraftable(tree)
    return tree


def _untag_uncraftable(tree: AgentGymTree) -> None:
    """Rule 5 (``clean_up_recipes``): such a tag becomes an item, in every recipe that names it."""
    used = {part.name for recipes in tree.item_recipes.values() for recipe in recipes for part in recipe.inputs
            if part.is_tag}
    members = {tag: [item for item, of in tree.tag_of_item.items() if of == tag] for tag in used}
    plain = {tag for tag in used if not any(item in tree.item_recipes for item in members[tag])}
    tree.tags -= plain
    tree.item_ids |= plain

    def untagged(recipe: TreeRecipe) -> TreeRecipe:
        inputs = tuple(replace(part, is_tag=False) if part.name in plain else part for part in recipe.inputs)
        return replace(recipe, inputs=inputs)

    for recipes_by_name in (tree.item_recipes, tree.tag_recipes):
        for name, recipes in recipes_by_name.items():
            recipes_by_name[name] = [untagged(recipe) for recipe in recipes]


_loaded_trees: dict[str | None, AgentGymTree] = {}


def loaded_agentgym_tree(recipes_dir: str | None) -> AgentGymTree | None:
    """The tree if this process has built it already (a dict lookup, safe on the event loop), else None."""
    return _loaded_trees.get(recipes_dir)


def load_agentgym_tree(recipes_dir: str | None) -> AgentGymTree:
    """The tree of a data-pack folder (file-name order), or of minecraft-data for None; once per process."""
    tree = _loaded_trees.get(recipes_dir)
    if tree is None:
        tree = _loaded_trees.setdefault(recipes_dir, _build_agentgym_tree(recipes_dir))
    return tree


def _build_agentgym_tree(recipes_dir: str | None) -> AgentGymTree:
    if recipes_dir is None:
        from envhub.envs.textcraft.pack_mcdata import pack_recipes_from_minecraft_data
        return build_tree(pack_recipes_from_minecraft_data())
    from envhub.envs.textcraft.pack import read_pack_folder
    return build_tree(read_pack_folder(recipes_dir))


def goal_items(recipes_dir: str | None = None) -> Sequence[str]:
    """Task id -> goal item id under the agentgym dialect (the mapping to an AgentGym server's data_idx)."""
    return load_agentgym_tree(recipes_dir).goals
