"""What AgentGym's BabyAI server sees each turn, and how it words it.

Follows ``BabyAI.postprocess_obs`` (first half) in AgentGym's agentenv-babyai/agentenv_babyai/
environment.py: the scene is read from minigrid's egocentric 7x7 image (so only visible cells count),
every door, key, ball, box, goal, lava and wall in it is named "<colour> <type>" (doors "<colour>
<state> <type>": "red closed door"), and objects are ordered by Manhattan distance, ties in AgentGym's
scan order (the farthest view row first, each row left to right). Walls and boxes straight ahead are
barriers. The grid bounds a route may use (``x_range``, ``y_range``) are AgentGym's, including their
asymmetry (some directions reach one cell behind the agent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envhub.envs.babyai.planner import DIR_TO_VEC

NOTABLE_TYPES = ("door", "key", "ball", "box", "goal", "lava", "wall")
BARRIER_TYPES = ("box", "wall")
# minigrid's encoding (minigrid.core.constants), as AgentGym's tables spell it.
TYPE_NAMES = ("unseen", "empty", "wall", "floor", "door", "key", "ball", "box", "goal", "lava", "agent")
COLOUR_NAMES = ("red", "green", "blue", "purple", "yellow", "grey")
DOOR_STATES = ("open", "closed", "locked")


@dataclass(frozen=True)
class SeenObject:
    """One notable cell in view."""

    name: str
    """"red ball", "red closed door", "green goal", "grey wall"."""
    position: tuple[int, int]
    """Absolute grid cell."""
    distance: int
    """Manhattan distance from the agent."""


@dataclass(frozen=True)
class Barrier:
    """A wall or box straight ahead of the agent."""

    kind: str
    distance: int


@dataclass(frozen=True)
class Scene:
    agent: tuple[int, int]
    direction: int
    objects: tuple[SeenObject, ...]
    """Nearest first (AgentGym's stable sort by distance)."""
    barriers: tuple[Barrier, ...]
    """Nearest first."""
    x_range: range
    y_range: range
    carrying: Any
    """The minigrid object carried, or None."""

    def relative(self, position: tuple[int, int]) -> tuple[int, int]:
        """(cells ahead, cells to the right) of ``position``."""
        dx, dy = position[0] - self.agent[0], position[1] - self.agent[1]
        forward_x, forward_y = DIR_TO_VEC[self.direction]
        right_x, right_y = DIR_TO_VEC[(self.direction + 1) % 4]
        return dx * forward_x + dy * forward_y, dx * right_x + dy * right_y


def read_scene(game: Any, image: Any) -> Scene:
    """The scene of minigrid ``game`` (unwrapped) as AgentGym's server reads it from ``image``, the
    observation image minigrid last returned. That is not always the world now: PutNext levels that
    start with an object in hand return a reset image still showing it on the floor, and AgentGym
    describes it there."""
    view = game.agent_view_size
    agent = (int(game.agent_pos[0]), int(game.agent_pos[1]))
    direction = int(game.agent_dir)
    forward, right = DIR_TO_VEC[direction], DIR_TO_VEC[(direction + 1) % 4]
    top_left = (agent[0] + forward[0] * (view - 1) - right[0] * (view // 2),
                agent[1] + forward[1] * (view - 1) - right[1] * (view // 2))
    objects, barriers = [], []
    for row in range(view):  # row 0: the farthest from the agent
        for column in range(view):
            x = top_left[0] - forward[0] * row + right[0] * column
            y = top_left[1] - forward[1] * row + right[1] * column
            distance = abs(agent[0] - x) + abs(agent[1] - y)
            if x < 0 or y < 0 or distance == 0:  # the agent's own cell shows what it carries
                continue
            kind_index, colour_index, state_index = (int(v) for v in image[column, row])
            kind = TYPE_NAMES[kind_index]
            if kind not in NOTABLE_TYPES:
                continue
            colour = COLOUR_NAMES[colour_index]
            name = f"{colour} {DOOR_STATES[state_index]} door" if kind == "door" else f"{colour} {kind}"
            objects.append(SeenObject(name, (x, y), distance))
            ahead = (x - agent[0]) * forward[0] + (y - agent[1]) * forward[1]
            sideways = (x - agent[0]) * right[0] + (y - agent[1]) * right[1]
            if kind in BARRIER_TYPES and sideways == 0:
                barriers.append(Barrier(kind, ahead))
    objects.sort(key=lambda obj: obj.distance)
    barriers.sort(key=lambda barrier: barrier.distance)
    x_range, y_range = _route_bounds(top_left, forward, right, view)
    return Scene(agent, direction, tuple(objects), tuple(barriers), x_range, y_range, game.carrying)


def _route_bounds(top_left: tuple[int, int], forward: tuple[int, int], right: tuple[int, int],
                  view: int) -> tuple[range, range]:
    """AgentGym's ``xrange``/``yrange``: from the view's far-left corner, ``view`` cells back and right."""
    bounds = []
    for axis in (0, 1):
        border = top_left[axis] + view * (right[axis] - forward[axis])
        bounds.append(range(border, top_left[axis] + 1) if border < top_left[axis] else range(top_left[axis], border))
    return bounds[0], bounds[1]


def describe_scene(scene: Scene) -> str:
    """AgentGym's description: objects in view, the barrier ahead, what is carried (its spacing kept)."""
    if scene.objects:
        text = "In front of you in this room, you can see several objects: "
        counts: dict[str, int] = {}
        for obj in scene.objects:
            if "wall" in obj.name:
                continue
            counts[obj.name] = counts.get(obj.name, 0) + 1
            text += f"There is a {obj.name} {counts[obj.name]} {_place(*scene.relative(obj.position))} "
    else:
        text = "You cannot see any objects within sight."
    text += "The room has walls around you. "
    if scene.barriers:
        text += f"You are facing a {scene.barriers[0].kind} {scene.barriers[0].distance} steps away. "
    carried = scene.carrying
    return text + (f"You are carrying a {carried.color} {carried.type}." if carried is not None
                   else "You are not carrying anything.")


def _place(ahead: int, right: int) -> str:
    if right == 0:
        return f"right in front of you {ahead} steps away. "
    side = f"{right} steps to your right" if right > 0 else f"{-right} steps to your left"
    return f"{ahead} steps in front of you and {side}. "
