"""What the agent sees, as text: objects in its egocentric 7x7 view, nearby walls, what it carries.

Objects (keys, balls, boxes, doors) get a stable name on first sight, ``<colour> <type> <n>``
("red ball 1", "red ball 2" in the order they were first seen), kept for the whole episode even
when the object is carried, dropped elsewhere or out of sight. Those names are what actions refer to.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable

from envhub.envs.babyai.planner import DIR_TO_VEC, cell_is_walkable

NAMED_TYPES = ("key", "ball", "box", "door")
SIDE_VIEW_CELLS = 3
"""How far the 7x7 view reaches to either side of the agent."""


@dataclass(frozen=True)
class VisibleObject:
    """One named object in view, with its offset from the agent in the agent's own frame."""

    obj: Any
    forward: int
    """Cells ahead of the agent (0: level with it)."""

    right: int
    """Cells to the agent's right (negative: to its left)."""


class ObjectMemory:
    """Names of every object seen so far in the episode, in first-seen order."""

    def __init__(self) -> None:
        self._names: dict[Any, str] = {}  # minigrid objects hash by identity
        self._counts: Counter[str] = Counter()

    def remember(self, objects: Iterable[Any]) -> None:
        for obj in objects:
            if obj is not None and obj.type in NAMED_TYPES and obj not in self._names:
                kind = f"{obj.color} {obj.type}"
                self._counts[kind] += 1
                self._names[obj] = f"{kind} {self._counts[kind]}"

    def name(self, obj: Any) -> str:
        return self._names[obj]

    def known(self) -> list[tuple[Any, str]]:
        return list(self._names.items())


def visible_objects(game: Any) -> list[VisibleObject]:
    """Named objects the agent sees now (minigrid's occlusion applies), nearest first."""
    _, visibility = game.gen_obs_grid()
    agent_x, agent_y = (int(v) for v in game.agent_pos)
    forward_x, forward_y = DIR_TO_VEC[game.agent_dir]
    right_x, right_y = -forward_y, forward_x
    top_x, top_y, bottom_x, bottom_y = game.get_view_exts()
    seen = []
    for x in range(max(top_x, 0), min(bottom_x, game.grid.width)):
        for y in range(max(top_y, 0), min(bottom_y, game.grid.height)):
            cell = game.grid.get(x, y)
            view_xy = game.relative_coords(x, y)
            if cell is None or cell.type not in NAMED_TYPES or view_xy is None or not visibility[view_xy]:
                continue
            dx, dy = x - agent_x, y - agent_y
            seen.append(VisibleObject(cell, dx * forward_x + dy * forward_y, dx * right_x + dy * right_y))
    return sorted(seen, key=lambda v: (abs(v.forward) + abs(v.right), v.forward, v.right))


def _steps(count: int, direction: str) -> str:
    return f"{count} step{'s' if count != 1 else ''} {direction}"


def relative_phrase(forward: int, right: int) -> str:
    """E.g. "2 steps forward and 1 step to the left"; "right in front of you" for (1, 0)."""
    if (forward, right) == (1, 0):
        return "right in front of you"
    parts = [_steps(forward, "forward")] if forward > 0 else []
    if right:
        parts.append(_steps(abs(right), "to the right" if right > 0 else "to the left"))
    return " and ".join(parts)


def object_phrase(obj: Any, name: str) -> str:
    """The object's name, with a door's state: "yellow door 1 (locked)"."""
    if obj.type != "door":
        return name
    state = "open" if obj.is_open else "locked" if obj.is_locked else "closed"
    return f"{name} ({state})"


def wall_phrase(game: Any) -> str:
    """Walls straight ahead, left and right of the agent, as far as it sees in those directions."""
    agent_x, agent_y = (int(v) for v in game.agent_pos)
    forward_x, forward_y = DIR_TO_VEC[game.agent_dir]
    rays = (("forward", (forward_x, forward_y), game.agent_view_size - 1),
            ("to the left", (forward_y, -forward_x), SIDE_VIEW_CELLS),
            ("to the right", (-forward_y, forward_x), SIDE_VIEW_CELLS))
    walls = []
    for direction, (step_x, step_y), reach in rays:
        for distance in range(1, reach + 1):
            x, y = agent_x + step_x * distance, agent_y + step_y * distance
            cell = game.grid.get(x, y) if 0 <= x < game.grid.width and 0 <= y < game.grid.height else None
            if cell is not None and cell.type == "wall":
                walls.append("a wall " + _steps(distance, direction))
            if not cell_is_walkable(game.grid, x, y):
                break
    if not walls:
        return ""
    return f"There is {walls[0]}." if len(walls) == 1 else f"There is {', '.join(walls[:-1])} and {walls[-1]}."


def locate_objects(game: Any) -> dict[Any, tuple[int, int]]:
    """Where every named object on the grid is (carried and boxed objects are not on it)."""
    width = game.grid.width
    return {cell: (index % width, index // width) for index, cell in enumerate(game.grid.grid)
            if cell is not None and cell.type in NAMED_TYPES}


def describe(game: Any, memory: ObjectMemory, in_view: list[VisibleObject],
             positions: dict[Any, tuple[int, int]]) -> str:
    """The text view of one turn: objects in view, walls, remembered objects, what is carried."""
    lines = ["You see:" if in_view else "You see no objects."]
    lines += [f"- {object_phrase(v.obj, memory.name(v.obj))}, {relative_phrase(v.forward, v.right)}"
              for v in in_view]
    walls = wall_phrase(game)
    if walls:
        lines.append(walls)
    in_view_objects = {v.obj for v in in_view}
    remembered = [object_phrase(obj, name) for obj, name in memory.known()
                  if obj not in in_view_objects and obj in positions]
    if remembered:
        lines.append(f"Seen before, now out of sight: {', '.join(remembered)}.")
    carried = game.carrying
    lines.append(f"You are carrying a {carried.color} {carried.type} ({memory.name(carried)})."
                 if carried is not None else "You are carrying nothing.")
    return "\n".join(lines)
