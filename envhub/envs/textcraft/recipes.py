"""The in-memory recipe set both sources load into (a data-pack folder, or minecraft-data).

Names are Minecraft ids without the ``minecraft:`` namespace (``oak_planks``). An ingredient
names either an item or a *tag*: a group of interchangeable items (any kind of planks).
Two pruning rules of the original TextCraft (ADaPT) apply to every source, in load order:

1. block decompression (``9 iron ingot from 1 iron block``) is dropped: it only makes cycles;
2. a recipe whose output is already among the things its ingredients are made of is dropped
   (the first of ``ingot -> nuggets`` / ``nuggets -> ingot`` loaded wins).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

NAMESPACE = "minecraft:"


def strip_namespace(name: str) -> str:
    """``minecraft:oak_planks`` -> ``oak_planks``; other names unchanged."""
    return name[len(NAMESPACE):] if name.startswith(NAMESPACE) else name


def display_name(name: str) -> str:
    """Human-readable item or tag name: ``minecraft:dark_oak_planks`` -> ``dark oak planks``."""
    return strip_namespace(name).replace("_", " ")


def item_id(text: str) -> str:
    """Internal id of a name the agent wrote: ``Dark Oak planks`` -> ``dark_oak_planks``."""
    return "_".join(strip_namespace(text.strip().lower()).split())


@dataclass(frozen=True)
class Ingredient:
    """``count`` of one item or of any members of one tag."""

    name: str
    """Item or tag id."""

    count: int
    """How many the recipe consumes."""


@dataclass(frozen=True)
class Recipe:
    """One way to craft ``count`` of ``output`` from ingredients (no two name the same thing)."""

    output: str
    """Item id made."""

    count: int
    """How many one craft makes."""

    ingredients: tuple[Ingredient, ...]
    """What one craft consumes."""

    group: str | None = None
    """The data-pack recipe ``group`` (e.g. ``planks``); the original derives tags from it."""

    def command(self) -> str:
        """The crafting command the agent reads: ``craft 4 oak planks using 1 oak logs``."""
        inputs = ", ".join(f"{ingredient.count} {display_name(ingredient.name)}" for ingredient in self.ingredients)
        return f"craft {self.count} {display_name(self.output)} using {inputs}"


@dataclass(frozen=True)
class RecipeBook:
    """Every recipe of one recipe set, and which names are tags."""

    recipes: Mapping[str, tuple[Recipe, ...]]
    """Recipes by output item; an item absent here is a base item (gathered with ``get``)."""

    tags: Mapping[str, frozenset[str]]
    """Member items of each tag; a tag ingredient accepts any member."""

    items: frozenset[str]
    """Every item any recipe names (as output or ingredient), tags excluded."""

    def is_base(self, name: str) -> bool:
        """True for an item that exists but has no recipe: the agent may ``get`` it."""
        return name in self.items and name not in self.recipes and name not in self.tags

    def accepts(self, ingredient_name: str, item: str) -> bool:
        """Does ``item`` satisfy an ingredient named ``ingredient_name`` (itself, or a tag member)?"""
        return item == ingredient_name or item in self.tags.get(ingredient_name, ())


def merge_ingredients(names: Iterable[str]) -> tuple[Ingredient, ...]:
    """One ingredient per distinct name, counting repeats, in first-seen order."""
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return tuple(Ingredient(name, count) for name, count in counts.items())


def is_block_decompression(recipe: Recipe) -> bool:
    """``9 iron ingot using 1 iron block`` and the like (rule 1 of the module docstring)."""
    return len(recipe.ingredients) == 1 and recipe.ingredients[0].name.endswith("_block")


def drop_cycles(recipes: Iterable[Recipe]) -> list[Recipe]:
    """Keep recipes in order, skipping each whose output its ingredients depend on (rule 2).

    Dependencies are accumulated as recipes are accepted, as in the original, so the result
    depends on the order: callers pass recipes in a fixed order (sorted file names).
    """
    made_from: dict[str, set[str]] = {}
    kept: list[Recipe] = []
    for recipe in recipes:
        dependencies = made_from.setdefault(recipe.output, set())
        names = [ingredient.name for ingredient in recipe.ingredients]
        if any(recipe.output in made_from.get(name, ()) for name in names):
            continue
        kept.append(recipe)
        for name in names:
            dependencies.add(name)
            dependencies.update(made_from.get(name, ()))
    return kept


def prune(recipes: Iterable[Recipe]) -> list[Recipe]:
    """Both pruning rules of the module docstring, in order."""
    return drop_cycles(recipe for recipe in recipes if not is_block_decompression(recipe))


def group_by_output(recipes: Iterable[Recipe]) -> dict[str, tuple[Recipe, ...]]:
    """Recipes by output item, keeping their order."""
    by_output: dict[str, list[Recipe]] = {}
    for recipe in recipes:
        by_output.setdefault(recipe.output, []).append(recipe)
    return {output: tuple(found) for output, found in by_output.items()}
