"""The default recipe set: Minecraft 1.16 crafting recipes from the PyPI package ``minecraft-data``.

minecraft-data ships recipes with tags already expanded: "stick from any planks" appears as
eight recipes, one per kind of planks. Tags are derived back from those *variants*:

1. recipes of one output with the same shape, the same empty cells and the same yield are
   variants of one recipe; the cells that differ between them, grouped by which cells always
   hold the same item, are tag slots, and the items seen in a slot are its members;
2. a slot becomes a tag only when its members form a known kind, named as the vanilla tag
   (planks, wooden_slabs, logs, <wood>_logs, wool, coals, stone_crafting_materials,
   soul_fire_base_blocks); the variants then collapse into one recipe using the tag;
3. other variants (red dye from poppy / from red tulip) stay separate recipes, as in vanilla.

Then the same pruning as every recipe set applies (envhub/envs/textcraft/recipes.py), with
recipes taken in item-id order. Only the two JSON files needed are read, not the whole package.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Iterable

from envhub.envs.textcraft.recipes import Recipe, RecipeBook, group_by_output, merge_ingredients, prune

MINECRAFT_VERSION = "1.16.2"
WOODS = ("oak", "spruce", "birch", "jungle", "acacia", "dark_oak", "crimson", "warped")
FIXED_TAGS = {
    frozenset({"coal", "charcoal"}): "coals",
    frozenset({"cobblestone", "blackstone"}): "stone_crafting_materials",
    frozenset({"soul_sand", "soul_soil"}): "soul_fire_base_blocks",
}
_LOG_SUFFIXES = ("_log", "_wood", "_stem", "_hyphae")

Slots = tuple[Any, ...]  # item id (int), tag name (str) or None (empty cell), one per grid cell


def load_minecraft_data(version: str = MINECRAFT_VERSION) -> RecipeBook:
    """The RecipeBook of minecraft-data's pc ``version`` crafting recipes (see the module docstring)."""
    raw_recipes, item_names = _read_data(version)
    recipes: list[Recipe] = []
    tags: dict[str, set[str]] = {}
    for output_id in sorted(raw_recipes, key=int):
        output = item_names[int(output_id)]
        for count, variants in _variant_clusters(raw_recipes[output_id]):
            for slots in _collapse(variants, item_names, tags):
                names = [slot if isinstance(slot, str) else item_names[slot] for slot in slots if slot is not None]
                recipes.append(Recipe(output, count, merge_ingredients(names)))
    items = {recipe.output for recipe in recipes} | {part.name for recipe in recipes for part in recipe.ingredients}
    items = (items - set(tags)) | {member for members in tags.values() for member in members}
    return RecipeBook(recipes=group_by_output(prune(recipes)),
                      tags={tag: frozenset(members) for tag, members in tags.items()}, items=frozenset(items))


def _read_data(version: str) -> tuple[dict[str, list[dict[str, Any]]], dict[int, str]]:
    spec = importlib.util.find_spec("minecraft_data")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("textcraft's default recipes need the minecraft-data package "
                                  "(pip install minecraft-data), or set the env option recipes_dir")
    data_root = Path(spec.origin).parent / "data" / "data"
    paths = json.loads((data_root / "dataPaths.json").read_text())["pc"][version]
    recipes = json.loads((data_root / paths["recipes"] / "recipes.json").read_text())
    items = json.loads((data_root / paths["items"] / "items.json").read_text())
    return recipes, {item["id"]: item["name"] for item in items}


def _variant_clusters(raw: list[dict[str, Any]]) -> Iterable[tuple[int, list[Slots]]]:
    """(yield, slot lists) per group of variant recipes, in first-seen order."""
    clusters: dict[tuple[Any, ...], list[Slots]] = {}
    for recipe in raw:
        if "inShape" in recipe:
            rows = recipe["inShape"]
            slots = tuple(cell for row in rows for cell in row)
            shape: tuple[Any, ...] = ("shaped", len(rows), len(rows[0]), tuple(cell is None for cell in slots))
        else:
            slots = tuple(recipe["ingredients"])
            shape = ("shapeless", len(slots))
        clusters.setdefault((shape, recipe["result"]["count"]), []).append(slots)
    return ((key[1], variants) for key, variants in clusters.items())


def _collapse(variants: list[Slots], item_names: dict[int, str], tags: dict[str, set[str]]) -> list[Slots]:
    """Variants with every named tag slot replaced by its tag, duplicates removed (first kept)."""
    width = len(variants[0])
    columns: dict[tuple[Any, ...], list[int]] = {}
    for position in range(width):
        column = tuple(slots[position] for slots in variants)
        if len(set(column)) > 1:
            columns.setdefault(column, []).append(position)
    tag_at: dict[int, str] = {}
    for column, positions in columns.items():
        members = frozenset(item_names[item] for item in column)
        tag = tag_name(members)
        if tag is not None:
            tags.setdefault(tag, set()).update(members)
            tag_at.update((position, tag) for position in positions)
    collapsed = (tuple(tag_at.get(position, slot) for position, slot in enumerate(slots)) for slots in variants)
    return list(dict.fromkeys(collapsed))


def tag_name(members: frozenset[str]) -> str | None:
    """The vanilla tag name of a set of interchangeable items, or None for no known kind."""
    if members in FIXED_TAGS:
        return FIXED_TAGS[members]
    if all(member.endswith("_planks") for member in members):
        return "planks"
    if all(member.endswith("_wool") for member in members):
        return "wool"
    if all(member.endswith("_slab") and member[:-len("_slab")] in WOODS for member in members):
        return "wooden_slabs"
    woods = {_log_wood(member) for member in members}
    if None in woods:
        return None
    if len(woods) > 1:
        return "logs"
    wood = woods.pop()
    return f"{wood}_stems" if wood in ("crimson", "warped") else f"{wood}_logs"


def _log_wood(name: str) -> str | None:
    """``stripped_oak_wood`` -> ``oak``; None for anything that is not a log, wood, stem or hyphae."""
    base = name.removeprefix("stripped_")
    for suffix in _LOG_SUFFIXES:
        if base.endswith(suffix) and base[:-len(suffix)] in WOODS:
            return base[:-len(suffix)]
    return None
