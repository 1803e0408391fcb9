"""One data-pack crafting recipe as AgentGym's TextCraft reads it, and reading a folder of them.

AgentGym builds its crafting tree (agentenv-textcraft/agentenv_textcraft/crafting_tree.py,
``CraftingTree._load_recipes``) from ADaPT's vanilla recipe JSON files. What it keeps of a file:

- only ``crafting_shaped`` and ``crafting_shapeless`` files (every other type is skipped unread);
- a shaped recipe: one ingredient per ``key`` entry, in the key's order, counted by how often the
  pattern shows that key; a shapeless one: ingredients in list order, repeats summed;
- an ingredient given as a list of alternatives means its first alternative;
- an ingredient is an item (``"item"``) or a tag (``"tag"``); names keep the ``minecraft:`` namespace;
- the ``group`` and the result (item and count, 1 when absent).

AgentGym reads the files in ``os.listdir`` order, which differs between file systems; we read
them sorted by file name as Python sorts strings (``LC_ALL=C ls`` order; a UTF-8 locale's ``ls``
ignores the underscores and gives another goal order), the one fixed order we document.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CRAFTING_TYPES = ("minecraft:crafting_shaped", "minecraft:crafting_shapeless")


@dataclass(frozen=True)
class PackIngredient:
    """``count`` of one item or tag, as one recipe file names it."""

    name: str
    """Namespaced id (``minecraft:oak_log``, ``minecraft:planks``)."""

    is_tag: bool
    """The file wrote ``"tag"`` (a group of items) rather than ``"item"``."""

    count: int
    """How many one craft consumes."""


@dataclass(frozen=True)
class PackRecipe:
    """The part of one crafting recipe file that AgentGym's TextCraft uses."""

    output: str
    """Namespaced id of the item made."""

    count: int
    """How many one craft makes."""

    ingredients: tuple[PackIngredient, ...]
    """In the file's order (shaped: key order; shapeless: first appearance)."""

    group: str | None = None
    """The file's recipe-book ``group`` (``planks``), without namespace; AgentGym derives tags from it."""


class RecipeFileError(ValueError):
    """A recipe file is not valid data-pack JSON of a crafting recipe."""


def read_pack_folder(recipes_dir: str | Path) -> list[PackRecipe]:
    """The crafting recipes of a data-pack folder (or its ``recipes/`` subfolder), in file-name order."""
    folder = Path(recipes_dir)
    if not any(folder.glob("*.json")) and (folder / "recipes").is_dir():
        folder = folder / "recipes"
    files = sorted(folder.glob("*.json"), key=lambda path: path.name)
    if not files:
        raise FileNotFoundError(f"no recipe *.json files in {folder}")
    recipes = []
    for path in files:
        try:
            parsed = parse_pack_recipe(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise RecipeFileError(f"{path}: {error!r}") from None
        if parsed is not None:
            recipes.append(parsed)
    return recipes


def parse_pack_recipe(data: dict[str, Any]) -> PackRecipe | None:
    """One file's JSON as a PackRecipe; None for a type AgentGym skips."""
    if data["type"] == "minecraft:crafting_shaped":
        ingredients = [_ingredient(entry, sum(row.count(key) for row in data["pattern"]))
                       for key, entry in data["key"].items()]
    elif data["type"] == "minecraft:crafting_shapeless":
        ingredients = _summed([_ingredient(entry, 1) for entry in data["ingredients"]])
    else:
        return None
    result = data["result"]
    output, count = (result, 1) if isinstance(result, str) else (result["item"], result.get("count") or 1)
    return PackRecipe(output, int(count), tuple(ingredients), data.get("group"))


def _ingredient(entry: Any, count: int) -> PackIngredient:
    if isinstance(entry, list):  # alternatives: AgentGym reads the first only
        entry = entry[0]
    if "item" in entry:
        return PackIngredient(entry["item"], False, count)
    if "tag" in entry:
        return PackIngredient(entry["tag"], True, count)
    raise ValueError(f"ingredient has neither 'item' nor 'tag': {entry!r}")


def _summed(ingredients: list[PackIngredient]) -> list[PackIngredient]:
    """Repeats of one name summed into its first appearance (shapeless recipes)."""
    merged: dict[str, PackIngredient] = {}
    for ingredient in ingredients:
        seen = merged.get(ingredient.name)
        merged[ingredient.name] = ingredient if seen is None else PackIngredient(
            seen.name, seen.is_tag, seen.count + ingredient.count)
    return list(merged.values())
