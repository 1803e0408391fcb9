"""AgentGym's recipe files, rebuilt from the ``minecraft-data`` package (pc 1.16.2).

AgentGym's TextCraft reads ADaPT's copy of the vanilla 1.16 data-pack recipes (860 files). We do
not ship those files; minecraft-data carries the same recipes with tags expanded (see mcdata.py,
whose variant collapsing and tag naming we reuse). What minecraft-data lacks is written down here:

- recipe-book groups (``planks``, ``wooden_door``, ``bed`` vs ``dyed_bed``, ...): derived from the
  output's name by family rules (pack_tables.group_of);
- a list of alternatives in a file (``torch`` from ``[coal, charcoal]``): AgentGym reads its
  first entry only, while minecraft-data lists one recipe per alternative (ALTERNATIVES_DROPPED);
- the key order of shaped recipes, which sets the ingredient order of a crafting command: vanilla's
  order comes from its generator code, not from the pattern, so the recipes whose order is not the
  pattern's reading order are listed (KEY_ORDER);
- file names, whose order sets the order of an item's recipes (RECOLORED_SOURCES, FILE_ORDER);
- tags minecraft-data cannot tell apart from others or from a list of alternatives, and one duplicated
  file (TOOL_TAG, COAL_ALTERNATIVES, UNGROUPED_DUPLICATES).

tests/test_fidelity_textcraft.py checks the result against ADaPT's files when they are at hand.
Recipes come out ordered by output id, an item's own recipes in their files' order. ADaPT's files
in ``ls`` order (their names start with the output id) build the very same crafting tree from this:
the same goals in the same order, and the same crafting commands and distractors for every task.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable

from envhub.envs.textcraft.mcdata import MINECRAFT_VERSION, _collapse, _read_data, _variant_clusters
from envhub.envs.textcraft.pack import PackIngredient, PackRecipe
from envhub.envs.textcraft.pack_tables import (
    ALTERNATIVES_DROPPED,
    COAL_ALTERNATIVES,
    FILE_ORDER,
    KEY_ORDER,
    RECOLORED_SOURCES,
    UNGROUPED_DUPLICATES,
    group_of,
)

NAMESPACE = "minecraft:"
TOOL_TAG = "stone_tool_materials"
"""1.16's stone tools take tag ``stone_tool_materials``; minecraft-data shows the same members as the
furnace's ``stone_crafting_materials``, so mcdata.py names both alike."""
_TOOLS = ("_axe", "_hoe", "_pickaxe", "_shovel", "_sword")


def pack_recipes_from_minecraft_data(version: str = MINECRAFT_VERSION) -> list[PackRecipe]:
    """AgentGym's crafting recipes, as its data-pack files hold them (see the module docstring)."""
    raw_recipes, item_names = _read_data(version)
    recipes: list[PackRecipe] = []
    for output_id in raw_recipes:
        output = item_names[int(output_id)]
        for count, variants in _variant_clusters(raw_recipes[output_id]):
            for slots in _collapse(variants, item_names, {}):
                recipe = _pack_recipe(output, count, slots, item_names)
                if recipe is not None:
                    recipes.append(recipe)
    recipes += [replace(recipe, group=None) for recipe in recipes
                if (recipe.output.removeprefix(NAMESPACE), _names(recipe)) in UNGROUPED_DUPLICATES]
    return sorted(recipes, key=_order_key)


def _pack_recipe(output: str, count: int, slots: Iterable[Any], item_names: dict[int, str]) -> PackRecipe | None:
    counted: dict[tuple[str, bool], int] = {}
    for slot in slots:
        if slot is not None:
            key = _ingredient_name(output, slot) if isinstance(slot, str) else (item_names[slot], False)
            counted[key] = counted.get(key, 0) + 1
    names = tuple(sorted(name for name, _ in counted))
    if (output, names) in ALTERNATIVES_DROPPED:
        return None
    order = KEY_ORDER.get((output, names))
    keys = sorted(counted, key=lambda key: order.index(key[0])) if order else list(counted)
    ingredients = tuple(PackIngredient(NAMESPACE + name, is_tag, counted[(name, is_tag)]) for name, is_tag in keys)
    return PackRecipe(NAMESPACE + output, count, ingredients, group_of(output, names))


def _ingredient_name(output: str, tag: str) -> tuple[str, bool]:
    """(name, is_tag) of a tag slot as the data pack writes it."""
    if tag == "coals" and output in COAL_ALTERNATIVES:
        return "coal", False
    if tag == "stone_crafting_materials" and output.endswith(_TOOLS):
        return TOOL_TAG, True
    return tag, True


def _names(recipe: PackRecipe) -> tuple[str, ...]:
    return tuple(sorted(ingredient.name.removeprefix(NAMESPACE) for ingredient in recipe.ingredients))


def _order_key(recipe: PackRecipe) -> tuple[str, int, str]:
    """Output id, then the item's recipes in their files' name order (``red_bed.json`` before
    ``red_bed_from_white_bed.json``; FILE_ORDER where names alone cannot tell), then text."""
    output, names = recipe.output.removeprefix(NAMESPACE), _names(recipe)
    if recipe.group is None and (output, names) in UNGROUPED_DUPLICATES:
        rank = -1  # the item's own file (sugar.json)
    elif output in FILE_ORDER:
        rank = FILE_ORDER[output].index(names)
    else:
        rank = int(any(name in RECOLORED_SOURCES for name in names))
    text = ",".join(f"{part.count} {part.name} {part.is_tag}" for part in recipe.ingredients)
    return recipe.output, rank, f"{recipe.count} {text} {recipe.group}"
