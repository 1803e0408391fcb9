"""Goals of a recipe set: every craftable item, ordered by (crafting depth, name), and splits.

Crafting depth follows ADaPT's TextCraft: a base item has depth 0; a recipe's depth is one more
than its deepest ingredient; an item's depth is that of its shallowest recipe; a tag's depth is
that of its shallowest member. Task id ``i`` is the i-th goal of that order.
Splits: ``depth1``, ``depth2``, ... (one per depth present), ``all``, and ``train``/``test``:
within each depth, every 5th goal (positions 0, 5, 10, ...) is held out for ``test``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from envhub.envs.textcraft.recipes import Recipe, RecipeBook

TEST_EVERY = 5


@dataclass(frozen=True)
class Goal:
    """One task: craft ``item``."""

    item: str
    """Item id to craft."""

    depth: int
    """Crafting depth (>= 1)."""


@dataclass(frozen=True)
class Catalog:
    """A loaded recipe set with its goals in task-id order."""

    book: RecipeBook
    """The recipes."""

    goals: tuple[Goal, ...]
    """Task id i -> goals[i]."""

    uses: Mapping[str, tuple[Recipe, ...]]
    """Recipes that consume each item or tag name (distractors are drawn from these)."""

    def splits(self) -> dict[str, list[int]]:
        """Task ids per split (see the module docstring)."""
        return splits_by_depth([goal.depth for goal in self.goals])


def splits_by_depth(depths: Sequence[int]) -> dict[str, list[int]]:
    """Splits of goals with these crafting depths (task id i has ``depths[i]``; module docstring)."""
    by_depth: dict[int, list[int]] = {}
    for task_number, depth in enumerate(depths):
        by_depth.setdefault(depth, []).append(task_number)
    test = sorted(number for numbers in by_depth.values() for number in numbers[::TEST_EVERY])
    held_out = set(test)
    splits = {f"depth{depth}": numbers for depth, numbers in sorted(by_depth.items())}
    for depth, numbers in sorted(by_depth.items()):  # held-out goals of one depth, for curricula
        splits[f"depth{depth}_train"] = [number for number in numbers if number not in held_out]
        splits[f"depth{depth}_test"] = [number for number in numbers if number in held_out]
    splits["train"] = [number for number in range(len(depths)) if number not in held_out]
    splits["test"] = test
    splits["all"] = list(range(len(depths)))
    return splits


def crafting_depths(book: RecipeBook) -> dict[str, int]:
    """Depth of every item and tag that recipes mention (see the module docstring)."""
    depths: dict[str, int] = {}
    in_progress: set[str] = set()

    def depth(name: str) -> int:
        if name in depths:
            return depths[name]
        if name in in_progress:  # a cycle through tags: this path cannot be the shallowest
            return 1_000_000
        in_progress.add(name)
        if name in book.recipes:
            found = min(max(depth(part.name) + 1 for part in recipe.ingredients) for recipe in book.recipes[name])
        elif name in book.tags:
            found = min((depth(member) for member in book.tags[name]), default=0)
        else:
            found = 0
        in_progress.discard(name)
        depths[name] = found
        return found

    for name in sorted(set(book.recipes) | set(book.tags)):
        depth(name)
    return depths


def build_catalog(book: RecipeBook) -> Catalog:
    """Goals of ``book``: its craftable items ordered by (depth, name)."""
    depths = crafting_depths(book)
    goals = sorted((Goal(item, depths[item]) for item in book.recipes), key=lambda goal: (goal.depth, goal.item))
    uses: dict[str, list[Recipe]] = {}
    for output in sorted(book.recipes):
        for recipe in book.recipes[output]:
            for ingredient in recipe.ingredients:
                uses.setdefault(ingredient.name, []).append(recipe)
    return Catalog(book=book, goals=tuple(goals), uses={name: tuple(found) for name, found in uses.items()})


@functools.cache
def load_catalog(recipes_dir: str | None) -> Catalog:
    """The catalog of a data-pack folder, or of minecraft-data's 1.16 recipes for None; loaded once per process."""
    if recipes_dir is None:
        from envhub.envs.textcraft.mcdata import load_minecraft_data
        return build_catalog(load_minecraft_data())
    from envhub.envs.textcraft.datapack import load_datapack
    return build_catalog(load_datapack(Path(recipes_dir).resolve()))
