"""Macro-actions: parse the agent's action text, check it, compile it into minigrid primitives.

Grammar (case and punctuation do not matter; "the" may precede an object):
    turn left | turn right | move forward | drop | toggle
    go to <object> | pick up <object> | go through <door>
An object is ``<colour> <type> <n>`` as named in the view ("red ball 1"); colour and number may
be left out when only one known object fits.

Design choice: only objects the agent has seen this episode can be targeted, but routes are
planned over the env's full grid (a navigation skill, like AgentGym's), crossing only free
cells and open doors. A closed door on the way is the agent's to open ("go through <door>").
Parsed commands are checked and compiled in envhub/envs/babyai/macros.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from envhub.envs.babyai.planner import RoutePlanner, cell_is_walkable, front_of
from envhub.envs.babyai.view import ObjectMemory, locate_objects

COLOURS = ("red", "green", "blue", "purple", "yellow", "grey")
_VERBS = (
    ("turn left", re.compile(r"^(?:turn )?left$")),
    ("turn right", re.compile(r"^(?:turn )?right$")),
    ("move forward", re.compile(r"^(?:move |go |step )?(?:forward|forwards|ahead)$")),
    ("go through", re.compile(r"^go through ?(.*)$")),
    ("go to", re.compile(r"^(?:go to|goto) ?(.*)$")),
    ("pick up", re.compile(r"^(?:pick up|pickup) ?(.*)$")),
    ("drop", re.compile(r"^drop ?(.*)$")),
    ("toggle", re.compile(r"^toggle ?(.*)$")),
)
_OBJECT = re.compile(rf"^(?:({'|'.join(COLOURS)}) )?(key|ball|box|door)(?: (\d+))?$")
_FILLER = {"the", "a", "an", "open", "closed", "locked"}


@dataclass(frozen=True)
class Command:
    """A parsed action: a verb and the words naming its object ("" for none)."""

    verb: str
    target: str


@dataclass(frozen=True)
class Plan:
    """Primitive actions to run, and what to tell the agent once they ran."""

    actions: list[int]
    message: str


@dataclass(frozen=True)
class Invalid:
    """Why an action cannot be done now (no step is spent)."""

    explanation: str


def parse_command(text: str) -> Command | Invalid:
    words = re.sub(r"[^a-z0-9 ]", " ", text.lower().replace("gray", "grey")).split()
    command = " ".join(words)
    for verb, pattern in _VERBS:
        match = pattern.match(command)
        if match:
            target = " ".join(w for w in (match.group(1) if pattern.groups else "").split() if w not in _FILLER)
            return Command(verb, target)
    shown = text if len(text) <= 60 else text[:60] + "..."
    return Invalid(f"Unknown action {shown!r}. Use one of: turn left, turn right, move forward, go to <object>, "
                   "pick up <object>, drop, toggle, go through <door>.")


class TurnState:
    """The world as it stands between two turns: object places, routes, names."""

    def __init__(self, game: Any, memory: ObjectMemory) -> None:
        self.game, self.memory = game, memory
        self.positions = locate_objects(game)
        agent_x, agent_y = (int(v) for v in game.agent_pos)
        self.agent_state = (agent_x, agent_y, int(game.agent_dir))
        self.planner = RoutePlanner(game.grid, self.agent_state)

    def front_cell(self) -> Any:
        x, y = front_of(self.agent_state)
        return self.game.grid.get(x, y)

    def front_is_free(self) -> bool:
        return cell_is_walkable(self.game.grid, *front_of(self.agent_state))

    def resolve(self, words: str) -> tuple[Any, str] | Invalid:
        """The known object that ``words`` names (e.g. "red ball 1", "ball")."""
        match = _OBJECT.match(words)
        if not match:
            return Invalid(f"{words!r} does not name an object; write e.g. \"red ball 1\" as in the view."
                           if words else "Name the object, e.g. \"go to red ball 1\".")
        colour, kind, number = match.groups()
        fits = [(obj, name) for obj, name in self.memory.known()
                if obj.type == kind and colour in (None, obj.color) and number in (None, name.split()[-1])]
        if len(fits) == 1:
            return fits[0]
        if not fits:
            return Invalid(f"You have not seen any {words}. Explore (turn, move, go through doors) to find it.")
        return Invalid(f"Which one? {', '.join(name for _, name in fits)}.")

    def route_to(self, obj: Any, name: str) -> tuple[list[int], tuple[int, int, int]] | Invalid:
        if obj is self.game.carrying:
            return Invalid(f"You are carrying {name}.")
        if obj not in self.positions:
            return Invalid(f"{name.capitalize()} is no longer there.")
        route = self.planner.route_to_face(*self.positions[obj])
        if route is None:
            return Invalid(f"There is no free path to {name}: walls, closed doors or objects block the way.")
        return route

    def has_key_for(self, door: Any) -> bool:
        carried = self.game.carrying
        return carried is not None and carried.type == "key" and carried.color == door.color
