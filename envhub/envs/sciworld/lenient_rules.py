"""The ``lenient`` dialect: envhub's own ScienceWorld rules (the behaviour before the AgentGym dialect).

1. Reply: the action is the first line after the last ``Action:`` (any case, envhub/actions.py),
   its whitespace collapsed; a reply without one is answered with how to write it (no game move).
   ``valid actions`` (or ``hint``) lists some actions valid here (spread over verbs, at most
   ``hint_max_actions``) without advancing the game, though it costs the agent a turn; ``reset
   task`` is refused (it would restart the episode and its score); anything else goes to the simulator.
2. First observation: the task description and ScienceWorld's free ``look()`` (no game move).
3. Reward: the rise of the best clipped score so far (rules.BestScoreRewards); ``info["score"]`` is
   their sum. ``terminated`` when the task completes (``success``: score 100) or fails (negative
   score), with a closing line saying which; ``truncated`` never (the actor's turn cap bounds episodes).
"""

from __future__ import annotations

from typing import Any

from envhub.actions import MalformedAction, extract_action
from envhub.base import StepResult
from envhub.envs.sciworld.agentgym_rules import AGENTGYM_INSTRUCTION
from envhub.envs.sciworld.rules import MAX_SCORE, BestScoreRewards, ListValidActions, Simulate, SimulatorState

HINT_COMMANDS = ("valid actions", "hint")
REFUSED_COMMANDS = ("reset task",)
DEFAULT_HINT_MAX_ACTIONS = 30

# AgentGym's instruction, then one line on the hint command, which AgentGym's server does not have.
LENIENT_INSTRUCTION = (AGENTGYM_INSTRUCTION + '\n\nThe action "valid actions" lists some actions possible here; '
                       'it does not change the world but uses a turn.')


def hint_text(valid_actions: list[str], max_actions: int) -> str:
    """Up to `max_actions` valid actions, taken in turn from each verb so that hundreds of
    ``connect X to Y`` do not crowd out the rest."""
    by_verb: dict[str, list[str]] = {}
    for action in valid_actions:
        if action not in REFUSED_COMMANDS:
            by_verb.setdefault(action.split(" ", 1)[0], []).append(action)
    queues = [by_verb[verb] for verb in sorted(by_verb)]
    chosen: list[str] = []
    for depth in range(max((len(queue) for queue in queues), default=0)):
        chosen += [queue[depth] for queue in queues if depth < len(queue)][: max_actions - len(chosen)]
    total = sum(len(queue) for queue in queues)
    return f"Some valid actions here ({len(chosen)} of {total}):\n" + "\n".join(sorted(chosen))


class LenientRules:
    """One episode under envhub's own rules."""

    opening_look_is_a_move = False

    def __init__(self, hint_max_actions: int) -> None:
        self._hint_max_actions = hint_max_actions
        self._rewards = BestScoreRewards()

    def first_observation(self, task_description: str, room: str) -> tuple[str, dict[str, Any]]:
        return f"{task_description.strip()}\n{room.strip()}", self._info(success=False)

    def interpret(self, reply: str) -> Simulate | ListValidActions | StepResult:
        parsed = extract_action(reply)
        if isinstance(parsed, MalformedAction):
            return self._unscored(parsed.feedback, malformed_action=True, action_parsed=False)
        command = " ".join(parsed.split())
        keyword = command.lower().rstrip(".!")
        if keyword in HINT_COMMANDS:
            return ListValidActions()
        if keyword in REFUSED_COMMANDS:
            return self._unscored("Resetting the task is not allowed here; the episode goes on.")
        return Simulate(command, action_parsed=True)

    def after_hint(self, valid_actions: list[str]) -> StepResult:
        return self._unscored(hint_text(valid_actions, self._hint_max_actions), hint=True)

    def after_command(self, state: SimulatorState, action_parsed: bool) -> StepResult:
        reward = self._rewards.reward_for(state.score)
        success = state.completed and state.score >= MAX_SCORE
        done = state.completed or state.score < 0
        observation = state.observation
        if done:
            outcome = "completed" if success else "failed"
            observation = f"{observation}\nThe task is {outcome} (score {state.score} of {MAX_SCORE})."
        info = {**self._info(success), "raw_score": state.score}
        return StepResult(observation, reward, done, False, info)

    def _unscored(self, observation: str, **flags: bool) -> StepResult:
        return StepResult(observation, 0.0, False, False, {**self._info(success=False), **flags})

    def _info(self, success: bool) -> dict[str, Any]:
        paid = self._rewards.paid
        return {"success": success, "best_score": paid, "score": paid, "action_parsed": True}
