"""AgentGym's BabyAI route finder, quirks included (``BabyAI.find_path`` in AgentGym's
agentenv-babyai/agentenv_babyai/environment.py).

A breadth-first search over (cell, direction) inside AgentGym's bounds, trying forward, left, right.
Only cells seen holding a wall, box, lava, ball or key block it: unseen cells and doors (even closed
or locked ones) count as free, so a route may run into them; minigrid then refuses the move and
AgentGym stops the macro there. States are marked when taken from the queue, not when queued, so a
state can be queued several times and keeps the parent of its latest queuing: the route found is
not always a shortest one. Those quirks set how many minigrid steps a macro-action costs, which is
what AgentGym's score counts, so they are kept.
"""

from __future__ import annotations

from collections import deque

from envhub.envs.babyai.agentgym_scene import Scene
from envhub.envs.babyai.planner import DIR_TO_VEC, FORWARD, TURN_LEFT, TURN_RIGHT

OBSTACLE_WORDS = ("wall", "box", "lava", "ball", "key")
State = tuple[tuple[int, int], int]


def obstacle_cells(scene: Scene) -> set[tuple[int, int]]:
    return {obj.position for obj in scene.objects if any(word in obj.name for word in OBSTACLE_WORDS)}


def find_path(scene: Scene, goal: tuple[int, int], arrive: bool,
              blocked: set[tuple[int, int]]) -> list[int] | None:
    """Primitive actions that end on ``goal`` (``arrive``) or facing it; None when there are none."""
    start: State = (scene.agent, scene.direction)
    queue = deque([start])
    parents: dict[State, tuple[State, int]] = {}
    taken: set[State] = set()
    while queue:
        state = queue.popleft()
        taken.add(state)
        if _is_goal(state, goal, arrive):
            return _route(parents, state, start)
        for action in (FORWARD, TURN_LEFT, TURN_RIGHT):
            following = _after(state, action)
            (x, y), _ = following
            if x in scene.x_range and y in scene.y_range and following not in taken and (x, y) not in blocked:
                queue.append(following)
                parents[following] = (state, action)
    return None


def _is_goal(state: State, goal: tuple[int, int], arrive: bool) -> bool:
    (x, y), direction = state
    if arrive:
        return (x, y) == goal
    dx, dy = DIR_TO_VEC[direction]
    return (goal[0] - x, goal[1] - y) == (dx, dy)


def _after(state: State, action: int) -> State:
    (x, y), direction = state
    if action == TURN_LEFT:
        return (x, y), (direction - 1) % 4
    if action == TURN_RIGHT:
        return (x, y), (direction + 1) % 4
    dx, dy = DIR_TO_VEC[direction]
    return (x + dx, y + dy), direction


def _route(parents: dict[State, tuple[State, int]], end: State, start: State) -> list[int]:
    actions = []
    state = end
    while state != start:
        state, action = parents[state]
        actions.append(action)
    return actions[::-1]
