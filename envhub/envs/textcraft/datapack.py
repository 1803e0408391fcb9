"""Load a vanilla Minecraft data-pack recipe folder (one JSON file per recipe) into a RecipeBook.

Only ``crafting_shaped`` and ``crafting_shapeless`` recipes count (smelting, stonecutting and the
special recipes are skipped), as in ADaPT's TextCraft. Files are read in sorted name order, so
the result never depends on the filesystem. The original's readings, kept for parity:

- a shaped recipe needs, per key, as many of it as the pattern shows that key;
- an ingredient given as a list of alternatives means its first alternative;
- data packs carry no tag membership here, so a tag's members are the items whose recipes
  carry that ``group`` (``oak_planks`` has group ``planks``: it satisfies tag ``planks``);
  a tag without any craftable member (``logs``, ``oak_logs``) becomes a plain base item.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envhub.envs.textcraft.recipes import (
    Recipe,
    RecipeBook,
    group_by_output,
    is_block_decompression,
    merge_ingredients,
    prune,
    strip_namespace,
)

CRAFTING_TYPES = ("minecraft:crafting_shaped", "minecraft:crafting_shapeless")


class RecipeFormatError(ValueError):
    """A recipe file is not valid data-pack JSON of a crafting recipe."""


def recipe_files(recipes_dir: Path) -> list[Path]:
    """The recipe files of a folder (or of its ``recipes/`` subfolder, the data-pack layout)."""
    if not any(recipes_dir.glob("*.json")) and (recipes_dir / "recipes").is_dir():
        recipes_dir = recipes_dir / "recipes"
    files = sorted(recipes_dir.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no recipe *.json files in {recipes_dir}")
    return files


def load_datapack(recipes_dir: str | Path) -> RecipeBook:
    """The RecipeBook of a data-pack recipe folder (see the module docstring)."""
    recipes: list[Recipe] = []
    tag_names: set[str] = set()
    for path in recipe_files(Path(recipes_dir)):
        try:
            parsed = parse_recipe(json.loads(path.read_text()), tag_names)
        except (ValueError, KeyError, TypeError) as error:
            raise RecipeFormatError(f"{path}: {error!r}") from None
        if parsed is not None:
            recipes.append(parsed)
    return _resolve_group_tags(recipes, tag_names)


def parse_recipe(data: dict[str, Any], tag_names: set[str]) -> Recipe | None:
    """One recipe file's JSON as a Recipe (None for non-crafting types); adds tags it uses to ``tag_names``."""
    if data["type"] == "minecraft:crafting_shaped":
        names = [_ingredient_name(data["key"][symbol], tag_names)
                 for row in data["pattern"] for symbol in row if symbol != " "]
    elif data["type"] == "minecraft:crafting_shapeless":
        names = [_ingredient_name(entry, tag_names) for entry in data["ingredients"]]
    else:
        return None
    result = data["result"]
    output, count = (result, 1) if isinstance(result, str) else (result["item"], result.get("count") or 1)
    group = data.get("group")
    return Recipe(strip_namespace(output), int(count), merge_ingredients(names), group=group)


def _ingredient_name(entry: dict[str, Any] | list[dict[str, Any]], tag_names: set[str]) -> str:
    if isinstance(entry, list):  # alternatives: the original takes the first
        entry = entry[0]
    if "item" in entry:
        return strip_namespace(entry["item"])
    if "tag" in entry:
        tag_names.add(strip_namespace(entry["tag"]))
        return strip_namespace(entry["tag"])
    raise ValueError(f"ingredient has neither 'item' nor 'tag': {entry!r}")


def _resolve_group_tags(parsed: list[Recipe], tag_names: set[str]) -> RecipeBook:
    unpacked = [recipe for recipe in parsed if not is_block_decompression(recipe)]
    group_of: dict[str, str] = {}  # an item's last group wins, as in the original
    for recipe in unpacked:
        if recipe.group is not None and recipe.group != recipe.output:
            group_of[recipe.output] = recipe.group
    recipes = group_by_output(prune(unpacked))
    members: dict[str, set[str]] = {}
    for item, group in group_of.items():
        members.setdefault(group, set()).add(item)
    tags = {tag: frozenset(members.get(tag, ())) for tag in tag_names | set(members)}
    tags = {tag: found for tag, found in tags.items() if any(item in recipes for item in found)}
    items = {recipe.output for recipe in parsed} | {
        ingredient.name for recipe in parsed for ingredient in recipe.ingredients}
    return RecipeBook(recipes=recipes, tags=tags, items=frozenset(items - set(tags)))
