"""AgentGym's BabyAI action table: every action it accepts this turn, the minigrid primitives each
one runs, and its refusal text for actions it knows cannot be done (``BabyAI.postprocess_obs``,
second half, in AgentGym's agentenv-babyai/agentenv_babyai/environment.py).

Names are renumbered every turn from what is in view, nearest first: "pickup red ball 1", "go to red
closed door 2", "go through red open door 1", "toggle and go through red locked door 1", "go to
goal". The table's order is AgentGym's, which is the order of its "Available actions" list. Its
checks are AgentGym's, loose ones included (e.g. "move forward" is offered towards a ball, and
"toggle" only for a door right in front).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envhub.envs.babyai.agentgym_paths import find_path, obstacle_cells
from envhub.envs.babyai.agentgym_scene import Scene, SeenObject
from envhub.envs.babyai.planner import DIR_TO_VEC, DROP, FORWARD, PICKUP, TOGGLE, TURN_LEFT, TURN_RIGHT

CHECK_ACTIONS = "check available actions"
DROP_BLOCKERS = ("wall", "box", "lava", "ball", "key")


@dataclass
class ActionTable:
    """Action name -> primitive actions (insertion order is AgentGym's), and refusal texts."""

    primitives: dict[str, list[int]] = field(default_factory=dict)
    refusals: dict[str, str] = field(default_factory=dict)


def build_action_table(scene: Scene) -> ActionTable:
    table = ActionTable({"turn left": [TURN_LEFT], "turn right": [TURN_RIGHT]})
    blocked = obstacle_cells(scene)
    if not scene.barriers or scene.barriers[0].distance > 1:
        table.primitives["move forward"] = [FORWARD]
    else:
        table.refusals["move forward"] = "There is a barrier in front of you, you can't move forward."
    if scene.carrying is None:
        _add_numbered(table, scene, blocked, "pickup", [PICKUP], skip=("wall", "door", "goal"))
    _add_drop(table, scene)
    _add_doors(table, scene, blocked)
    for obj in scene.objects:
        if "goal" in obj.name:
            path = find_path(scene, obj.position, True, blocked)
            if path is not None:
                table.primitives["go to goal"] = path
            else:
                table.refusals["go to goal"] = "You cannot go to the goal, as there is no path leading to it."
    _add_numbered(table, scene, blocked, "go to", [], skip=("wall", "goal"))
    table.primitives[CHECK_ACTIONS] = []
    return table


def _add_numbered(table: ActionTable, scene: Scene, blocked: set[tuple[int, int]], verb: str,
                  finish: list[int], skip: tuple[str, ...]) -> None:
    """"<verb> <name> <n>" for objects a route faces; n counts only the reachable ones of that name,
    as AgentGym does ("pickup ..." ends with a pickup, "go to ..." with nothing)."""
    counts: dict[str, int] = {}
    for obj in scene.objects:
        if any(word in obj.name for word in skip):
            continue
        path = find_path(scene, obj.position, False, blocked)
        first = f"{verb} {obj.name} 1"
        if path is not None:
            counts[obj.name] = 1 if first not in table.primitives else counts[obj.name] + 1
            table.primitives[f"{verb} {obj.name} {counts[obj.name]}"] = path + finish
        else:
            action = first if first not in table.primitives else f"{verb} {obj.name} {counts[obj.name] + 1}"
            table.refusals[action] = f"You cannot {verb} {action[len(verb) + 1:]}, as there is no path leading to it."


def _add_drop(table: ActionTable, scene: Scene) -> None:
    if scene.carrying is None:
        table.refusals["drop"] = "You cannot drop the object, as you are not carrying anything."
        return
    dx, dy = DIR_TO_VEC[scene.direction]
    ahead = (scene.agent[0] + dx, scene.agent[1] + dy)
    if any(obj.position == ahead and any(word in obj.name for word in DROP_BLOCKERS) for obj in scene.objects):
        table.refusals["drop"] = "You cannot drop the object, as there is already an object in front of you."
    else:
        table.primitives["drop"] = [DROP]


def _add_doors(table: ActionTable, scene: Scene, blocked: set[tuple[int, int]]) -> None:
    counts: dict[str, int] = {}
    for obj in scene.objects:
        if "door" not in obj.name:
            continue
        counts[obj.name] = counts.get(obj.name, 0) + 1
        numbered = f"{obj.name} {counts[obj.name]}"
        if "open door" in obj.name:
            path = find_path(scene, obj.position, True, blocked)
            if path is not None:
                table.primitives[f"go through {numbered}"] = path
            else:
                table.refusals[f"go through {numbered}"] = (
                    f"You cannot go through {numbered}, as there is no path leading to it.")
        elif "closed door" in obj.name:
            _add_toggle_through(table, scene, blocked, obj, numbered, counts)
            table.refusals[f"go through {numbered}"] = (
                f"You cannot go through {numbered}, as it is closed. You should toggle it first.")
        elif "locked door" in obj.name:
            refusal = _locked_door_refusal(scene, obj)
            if refusal:
                table.refusals[f"toggle and go through {numbered}"] = (
                    f"You cannot toggle and go through {numbered}, as {refusal}.")
            else:
                _add_toggle_through(table, scene, blocked, obj, numbered, counts)


def _add_toggle_through(table: ActionTable, scene: Scene, blocked: set[tuple[int, int]], door: SeenObject,
                        numbered: str, counts: dict[str, int]) -> None:
    path = find_path(scene, door.position, False, blocked)
    action = f"toggle and go through {numbered}"
    if path is not None:
        table.primitives[action] = path + [TOGGLE, FORWARD]
    else:
        # AgentGym prints its whole door-count dict here (str(cnt_door)), not the door's number.
        table.refusals[action] = (
            f"You cannot toggle and go through {door.name} {counts}, as there is no path leading to it.")
    if path == []:
        table.primitives["toggle"] = [TOGGLE]


def _locked_door_refusal(scene: Scene, door: SeenObject) -> str:
    carried = scene.carrying
    if carried is None or carried.type != "key":
        return "you are not carrying a key"
    if carried.color != door.name.split(" ")[0]:
        return "the color of the key you are carrying does not match the color of door"
    return ""
