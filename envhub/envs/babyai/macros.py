"""Checking and compiling parsed commands (envhub/envs/babyai/commands.py) into primitive plans.

Each verb has one small handler returning a ``Plan`` (minigrid primitive actions plus the message
for the agent) or an ``Invalid`` explanation. ``available_actions`` lists what would pass now.
"""

from __future__ import annotations

from typing import Any, Callable

from envhub.envs.babyai.commands import Command, Invalid, Plan, TurnState
from envhub.envs.babyai.planner import (
    DROP,
    FORWARD,
    PICKUP,
    TOGGLE,
    TURN_LEFT,
    TURN_RIGHT,
    cell_is_walkable,
    front_of,
)
from envhub.envs.babyai.view import object_phrase


def _blocker(state: TurnState, cell: Any) -> str:
    if cell.type == "wall":
        return "a wall"
    try:
        return object_phrase(cell, state.memory.name(cell))
    except KeyError:
        return f"a {cell.type}"


def _turn_left(target: str, state: TurnState) -> Plan | Invalid:
    return Plan([TURN_LEFT], "You turned left.")


def _turn_right(target: str, state: TurnState) -> Plan | Invalid:
    return Plan([TURN_RIGHT], "You turned right.")


def _move_forward(target: str, state: TurnState) -> Plan | Invalid:
    if state.front_is_free():
        return Plan([FORWARD], "You moved forward.")
    return Invalid(f"You cannot move forward: {_blocker(state, state.front_cell())} is right in front of you.")


def _go_to(target: str, state: TurnState) -> Plan | Invalid:
    resolved = state.resolve(target)
    if isinstance(resolved, Invalid):
        return resolved
    obj, name = resolved
    route = state.route_to(obj, name)
    if isinstance(route, Invalid):
        return route
    actions, _ = route
    if not actions:
        return Plan([], f"You are already facing {name}.")
    return Plan(actions, f"You went to {name}; it is right in front of you.")


def _pick_up(target: str, state: TurnState) -> Plan | Invalid:
    front = state.front_cell()
    if not target and (front is None or not front.can_pickup()):
        return Invalid('There is nothing to pick up right in front of you. Use "pick up <object>".')
    resolved = (front, state.memory.name(front)) if not target else state.resolve(target)
    if isinstance(resolved, Invalid):
        return resolved
    obj, name = resolved
    carried = state.game.carrying
    if carried is not None:
        return Invalid(f"You are already carrying {state.memory.name(carried)}; drop it first.")
    if not obj.can_pickup():
        return Invalid(f"You cannot pick up {name}: only keys, balls and boxes can be carried.")
    route = state.route_to(obj, name)
    if isinstance(route, Invalid):
        return route
    return Plan([*route[0], PICKUP], f"You picked up {name}.")


def _drop(target: str, state: TurnState) -> Plan | Invalid:
    carried = state.game.carrying
    if carried is None:
        return Invalid("You are not carrying anything.")
    name = state.memory.name(carried)
    if target:
        resolved = state.resolve(target)
        if isinstance(resolved, Invalid) or resolved[0] is not carried:
            return Invalid(f"You are carrying {name}, not {target}.")
    front = state.front_cell()
    if front is not None:
        return Invalid(f"You cannot drop {name} here: {_blocker(state, front)} is right in front of you. "
                       "Face a free cell first.")
    return Plan([DROP], f"You dropped {name} right in front of you.")


def _toggle(target: str, state: TurnState) -> Plan | Invalid:
    front = state.front_cell()
    if front is None or front.type not in ("door", "box"):
        return Invalid("There is nothing to toggle right in front of you: toggle opens or closes the door, "
                       "or opens the box, right in front of you.")
    name = state.memory.name(front)
    if target:
        resolved = state.resolve(target)
        if isinstance(resolved, Invalid) or resolved[0] is not front:
            return Invalid(f"toggle acts on what is right in front of you, which is {name}; "
                           f'use "go to {target}" first.')
    if front.type == "box":
        return Plan([TOGGLE], f"You opened {name}.")
    if front.is_locked and not state.has_key_for(front):
        return Invalid(f"{name.capitalize()} is locked; you need to carry a {front.color} key to unlock it.")
    verb = "closed" if front.is_open else "unlocked and opened" if front.is_locked else "opened"
    return Plan([TOGGLE], f"You {verb} {name}.")


def _go_through(target: str, state: TurnState) -> Plan | Invalid:
    resolved = state.resolve(target)
    if isinstance(resolved, Invalid):
        return resolved
    door, name = resolved
    if door.type != "door":
        return Invalid(f"{name.capitalize()} is not a door.")
    if door.is_locked and not state.has_key_for(door):
        return Invalid(f"{name.capitalize()} is locked; you need to carry a {door.color} key to unlock it.")
    route = state.route_to(door, name)
    if isinstance(route, Invalid):
        return route
    actions, (_, _, direction) = route
    door_x, door_y = state.positions[door]
    opening = [] if door.is_open else [TOGGLE]
    if not cell_is_walkable(state.game.grid, *front_of((door_x, door_y, direction))):
        return Plan([*actions, *opening, FORWARD],
                    f"You stepped into the doorway of {name}; the way beyond is blocked.")
    return Plan([*actions, *opening, FORWARD, FORWARD], f"You went through {name}.")


HANDLERS: dict[str, Callable[[str, TurnState], Plan | Invalid]] = {
    "turn left": _turn_left, "turn right": _turn_right, "move forward": _move_forward, "go to": _go_to,
    "pick up": _pick_up, "drop": _drop, "toggle": _toggle, "go through": _go_through,
}


def compile_command(command: Command, state: TurnState) -> Plan | Invalid:
    return HANDLERS[command.verb](command.target, state)


def available_actions(state: TurnState) -> list[str]:
    """Every action that would be accepted now, in a stable order."""
    carried, front = state.game.carrying, state.front_cell()
    actions = ["turn left", "turn right"] + (["move forward"] if state.front_is_free() else [])
    if front is not None and (front.type == "box" or (
            front.type == "door" and (not front.is_locked or state.has_key_for(front)))):
        actions.append("toggle")
    if carried is not None and front is None:
        actions.append("drop")
    for obj, name in state.memory.known():
        if obj not in state.positions or state.planner.route_to_face(*state.positions[obj]) is None:
            continue
        actions.append(f"go to {name}")
        if obj.can_pickup() and carried is None:
            actions.append(f"pick up {name}")
        if obj.type == "door" and (not obj.is_locked or state.has_key_for(obj)):
            actions.append(f"go through {name}")
    return actions
