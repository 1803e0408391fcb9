"""Shortest routes over the full grid, in minigrid's primitive actions (turn left/right, forward).

One breadth-first search over agent states (x, y, direction) from the agent's current state;
then any number of "route to face cell (x, y)" queries. A forward move is allowed only into a
cell the agent can stand on (empty, an open door, floor, goal), never into lava, a wall, a
closed door or an object, so a route never changes the world on its way.
"""

from __future__ import annotations

from collections import deque
from typing import Any

TURN_LEFT, TURN_RIGHT, FORWARD, PICKUP, DROP, TOGGLE = 0, 1, 2, 3, 4, 5
"""minigrid's primitive action numbers (``minigrid.core.actions.Actions``)."""

DIR_TO_VEC = ((1, 0), (0, 1), (-1, 0), (0, -1))
"""minigrid's direction numbers: 0 east (+x), 1 south (+y), 2 west, 3 north."""

AgentState = tuple[int, int, int]


def cell_is_walkable(grid: Any, x: int, y: int) -> bool:
    """True when the agent may step onto (x, y) without changing the world."""
    if not (0 <= x < grid.width and 0 <= y < grid.height):
        return False
    cell = grid.get(x, y)
    return cell is None or (cell.can_overlap() and cell.type != "lava")


def front_of(state: AgentState) -> tuple[int, int]:
    x, y, direction = state
    dx, dy = DIR_TO_VEC[direction]
    return x + dx, y + dy


def _successors(grid: Any, state: AgentState) -> list[tuple[int, AgentState]]:
    x, y, direction = state
    moves = [(TURN_LEFT, (x, y, (direction - 1) % 4)), (TURN_RIGHT, (x, y, (direction + 1) % 4))]
    front_x, front_y = front_of(state)
    if cell_is_walkable(grid, front_x, front_y):
        moves.insert(0, (FORWARD, (front_x, front_y, direction)))
    return moves


class RoutePlanner:
    """Shortest primitive-action routes from one agent state over one grid snapshot."""

    def __init__(self, grid: Any, start: AgentState) -> None:
        self.start = start
        self._parent: dict[AgentState, tuple[AgentState, int] | None] = {start: None}
        self._distance: dict[AgentState, int] = {start: 0}
        frontier = deque([start])
        while frontier:
            state = frontier.popleft()
            for action, next_state in _successors(grid, state):
                if next_state not in self._parent:
                    self._parent[next_state] = (state, action)
                    self._distance[next_state] = self._distance[state] + 1
                    frontier.append(next_state)

    def route_to_face(self, x: int, y: int) -> tuple[list[int], AgentState] | None:
        """(actions, end state) of a shortest route ending next to (x, y) and facing it, or None."""
        facing_states = [
            (x - dx, y - dy, direction) for direction, (dx, dy) in enumerate(DIR_TO_VEC)
        ]
        reached = [state for state in facing_states if state in self._distance]
        if not reached:
            return None
        end = min(reached, key=lambda state: (self._distance[state], state[2]))
        return self._actions_to(end), end

    def _actions_to(self, end: AgentState) -> list[int]:
        actions: list[int] = []
        state = end
        while (link := self._parent[state]) is not None:
            state, action = link
            actions.append(action)
        return actions[::-1]
