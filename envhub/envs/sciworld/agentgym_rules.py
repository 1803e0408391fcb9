"""The ``agentgym`` dialect: ScienceWorld as AgentGym's server and client serve it.

Followed (WooooDyy/AgentGym): agentenv-sciworld/agentenv_sciworld/environment.py (``SciWorldEnv``:
``reset``, ``step``) over scienceworld's ``ScienceWorldEnv`` (default ``envStepLimit=100``), and
agentenv/agentenv/envs/sciworld.py (``SciworldEnvClient``: ``reset``, ``step``; the ReAct
instruction of ``SciWorldAdapter``) with ``BaseAdapter.parse_react`` (agentenv/controller/utils.py).

1. Reply: a reply ending in ``</s>`` loses its last five characters (the client's own slice); the
   action is everything after the last ``Action:`` (case-sensitive), stripped, line breaks and all;
   without ``Action:`` it is empty (the whole reply if it holds ``search[`` or ``click[``). It goes
   to the simulator as it is: no hint action, nothing refused, nothing rewritten (``look around`` and
   a trailing line after it is "No known action matches that input.").
2. First observation: the task description, a newline, then the answer to a ``look around``
   command (a game move, as AgentGym's reset takes it).
3. ``info["score"]``: ScienceWorld's score after the step, what the client returns as its step
   reward (-100 once a task failed). Done when ScienceWorld completes the task, the score turns
   negative, or the game passes 100 moves (``truncated``: the wrapper's step limit). ``success``:
   score 100, AgentGym's evaluator's rule.
4. Training reward: AgentGym-RL trains on the last step's score (vllm_rollout.py); here scaled by
   1/100 and clipped into [0, 1], paid as rises of the best score so far (rules.BestScoreRewards).
"""

from __future__ import annotations

from typing import Any

from envhub.base import StepResult
from envhub.envs.sciworld.rules import MAX_SCORE, NO_KNOWN_ACTION, BestScoreRewards, Simulate, SimulatorState

STEP_LIMIT = 100
"""scienceworld's ``ScienceWorldEnv(envStepLimit=100)``, which AgentGym's server builds: done past it."""

# SciWorldAdapter.conversation_start_dict[ActionFormat.REACT], word for word.
AGENTGYM_INSTRUCTION = (
    'You are an agent for science world. Every round I will give you an observation, you have to respond an '
    'action based on the observation to finish the given task. Here are the actions you may take: [{"action": '
    '"open/close OBJ", "description": "open/close a container"}, {"action": "de/activate OBJ", "description": '
    '"activate/deactivate a device"}, {"action": "connect OBJ to OBJ", "description": "connect electrical '
    'components"}, {"action": "disconnect OBJ", "description": "disconnect electrical components"}, {"action": '
    '"use OBJ [on OBJ]", "description": "use a device/item"}, {"action": "look around", "description": "describe '
    'the current room"}, {"action": "look at OBJ", "description": "describe an object in detail"}, {"action": '
    '"look in OBJ", "description": "describe a container\'s contents"}, {"action": "read OBJ", "description": '
    '"read a note or book"}, {"action": "move OBJ to OBJ", "description": "move an object to a container"}, '
    '{"action": "pick up OBJ", "description": "move an object to the inventory"}, {"action": "put down OBJ", '
    '"description": "drop an inventory item"}, {"action": "pour OBJ into OBJ", "description": "pour a liquid into '
    'a container"}, {"action": "dunk OBJ into OBJ", "description": "dunk a container into a liquid"}, {"action": '
    '"mix OBJ", "description": "chemically mix a container"}, {"action": "go to LOC", "description": "move to a new '
    'location"}, {"action": "eat OBJ", "description": "eat a food"}, {"action": "flush OBJ", "description": "flush '
    'a toilet"}, {"action": "focus on OBJ", "description": "signal intent on a task object"}, {"action": "wait", '
    '"description": "take no action for 10 iterations"}, {"action": "wait1", "description": "take no action for 1 '
    'iteration"}, {"action":"examine OBJ","description":"provides a description of the objects present on or in a '
    'receptacle."}, {"action": "task", "description": "describe current task"}, {"action": "inventory", '
    '"description": "list your inventory"}]\nYour response should use the following format:\nThought:\nyour '
    'thoughts.\n\nAction:\nyour next action'
)


def parse_reply(reply: str) -> tuple[str, bool]:
    """(the command AgentGym's client sends, whether the reply held ``Action:``)."""
    if reply.endswith("</s>"):
        reply = reply[:-5]  # the client cuts five characters for the four of "</s>": kept as it is
    _, marker, action = reply.rpartition("Action:")
    if marker:
        return action.strip(), True
    if "search[" in reply or "click[" in reply:  # parse_react's rule for other envs, shared by all
        return reply.strip(), False
    return "", False


class AgentGymRules:
    """One episode under AgentGym's rules."""

    opening_look_is_a_move = True

    def __init__(self) -> None:
        self._rewards = BestScoreRewards()

    def first_observation(self, task_description: str, room: str) -> tuple[str, dict[str, Any]]:
        # The client shows task_description + '\n' + observation and starts its score at 0.
        return f"{task_description}\n{room}", {"score": 0.0, "success": False, "moves": 0}

    def interpret(self, reply: str) -> Simulate:
        command, marked = parse_reply(reply)
        return Simulate(command, action_parsed=marked and bool(command))

    def after_command(self, state: SimulatorState, action_parsed: bool) -> StepResult:
        terminated = state.completed or state.score < 0
        truncated = not terminated and state.moves > STEP_LIMIT
        info = {"score": float(state.score), "success": state.score >= MAX_SCORE, "moves": state.moves,
                "action_parsed": action_parsed, "action_valid": not state.observation.startswith(NO_KNOWN_ACTION)}
        return StepResult(state.observation, self._rewards.reward_for(state.score), terminated, truncated, info)

    def after_hint(self, valid_actions: list[str]) -> StepResult:
        raise RuntimeError("sciworld: the agentgym dialect has no hint action")
