"""Parsing TextCraft actions: ``get N item``, ``craft N item using a X, b Y``, ``inventory``.

Used by the ``lenient`` dialect (agentgym_game.py has AgentGym's own, stricter parsing). Text is
normalized before matching: lower case, the ``minecraft:``
prefix and underscores read as plain words, punctuation other than commas dropped, spaces
collapsed. Item names are then matched exactly (no plural/singular guessing, as in the original).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envhub.envs.textcraft.recipes import item_id

ACTIONS_HELP = 'Valid actions: "get N item", "craft N item using a X, b Y" or "inventory".'

_CRAFT = re.compile(r"^craft (?:(\d+) )?(.+?) using (.+)$")
_GET = re.compile(r"^get (\d+) (.+)$")
_COUNTED = re.compile(r"^(\d+) (.+)$")
_NOT_ALLOWED = re.compile(r"[^a-z0-9, ]+")


@dataclass(frozen=True)
class Get:
    """Take ``count`` of base item ``item`` from the world."""

    count: int
    """How many."""

    item: str
    """Item id."""


@dataclass(frozen=True)
class Craft:
    """Craft ``item`` from ``ingredients`` (the count written for the output is informational)."""

    count: int
    """Output count the agent wrote (1 when omitted); the recipe decides what is made."""

    item: str
    """Output item id."""

    ingredients: tuple[tuple[str, int], ...]
    """(item id, count) per written ingredient, repeats summed."""


@dataclass(frozen=True)
class ShowInventory:
    """List what the agent holds."""


@dataclass(frozen=True)
class Unparsable:
    """The action fits no format; ``feedback`` says why."""

    feedback: str
    """Observation for the agent."""


Command = Get | Craft | ShowInventory | Unparsable


def normalize(action: str) -> str:
    """Lower case, namespace and underscores removed, punctuation except commas dropped, single-spaced."""
    text = action.lower().replace("minecraft:", " ").replace("_", " ")
    return " ".join(_NOT_ALLOWED.sub(" ", text).split()).strip(" ,")


def parse_command(action: str) -> Command:
    """The command an action text asks for (see the module docstring)."""
    text = normalize(action)
    if text == "inventory":
        return ShowInventory()
    get_match = _GET.match(text)
    if get_match:
        return Get(int(get_match.group(1)), item_id(get_match.group(2)))
    craft_match = _CRAFT.match(text)
    if craft_match:
        return _parse_craft(*craft_match.groups())
    return Unparsable(f"Could not execute {text[:80]!r}. {ACTIONS_HELP}")


def _parse_craft(count: str | None, output: str, inputs: str) -> Craft | Unparsable:
    ingredients: dict[str, int] = {}
    for written in inputs.split(","):
        counted = _COUNTED.match(written.strip())
        if counted is None:
            return Unparsable(f"Wrong item format: {written.strip()!r}. Write each ingredient as "
                              f"'<count> <item>', e.g. craft 4 oak planks using 1 oak log.")
        name = item_id(counted.group(2))
        ingredients[name] = ingredients.get(name, 0) + int(counted.group(1))
    return Craft(int(count) if count else 1, item_id(output), tuple(ingredients.items()))
