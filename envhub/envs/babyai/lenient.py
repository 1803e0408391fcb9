"""babyai-v0's ``lenient`` dialect: this env's own grammar (stable object names, "go through" that
opens doors, explanations for refused actions), unchanged from before the agentgym dialect.

One turn:
1. read the action from the reply (``Thought: ... Action: <action>``);
2. parse and check it against the current world (an invalid one gets an explanation, no step spent);
3. run its primitive actions in minigrid until done, or until the level ends (success, failure, or
   minigrid's own step limit, which every primitive counts towards);
4. answer with what happened, the new view and the actions available now.
Reward 1.0 on success, else 0.0; ``info["score"]`` is minigrid's time-discounted reward (0 until the end).
"""

from __future__ import annotations

from typing import Any

from envhub.actions import MalformedAction, extract_action
from envhub.base import StepResult
from envhub.envs.babyai.commands import Invalid, TurnState, parse_command
from envhub.envs.babyai.levels import TaskLayout, make_level, quiet_minigrid
from envhub.envs.babyai.macros import available_actions, compile_command
from envhub.envs.babyai.view import ObjectMemory, describe, visible_objects


class LenientGame:
    """One BabyAI episode at a time in this env's own grammar; minigrid levels are kept for reuse."""

    def __init__(self, layout: TaskLayout, require_action_marker: bool) -> None:
        self._layout = layout
        self._require_action_marker = require_action_marker
        self._levels: dict[str, Any] = {}  # minigrid env per level id, reused across resets
        self._game: Any = None
        self._level_id, self._level_seed = "", 0
        self._memory = ObjectMemory()
        self._turn: TurnState | None = None
        self._done = True

    def reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self._level_id, self._level_seed = self._layout.level_and_seed(task_id)
        if self._level_id not in self._levels:
            self._levels[self._level_id] = make_level(self._level_id)
        self._game = self._levels[self._level_id]
        with quiet_minigrid():
            self._game.reset(seed=self._level_seed)
        self._memory, self._done = ObjectMemory(), False
        self._memory.remember([self._game.carrying])  # some levels start with an object in hand
        observation = f"Your goal: {self._game.mission}\n{self._look()}"
        return observation, self._info(success=False, score=0.0, valid=True)

    def step(self, action: str) -> StepResult:
        if self._done or self._turn is None:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        reply = extract_action(action, require_marker=self._require_action_marker)
        if isinstance(reply, MalformedAction):
            return self._refuse(reply.feedback, parsed=False)
        command = parse_command(reply)
        if isinstance(command, Invalid):
            return self._refuse(command.explanation, parsed=False)
        plan = compile_command(command, self._turn)
        if isinstance(plan, Invalid):
            return self._refuse(plan.explanation, parsed=True)
        score, terminated, truncated, steps_run = self._run(plan.actions)
        if terminated or truncated:
            # The plan's message would claim more than happened when the level ended mid-plan.
            return self._finish(plan.message if steps_run == len(plan.actions) else "", score, terminated)
        return StepResult(f"{plan.message}\n{self._look()}", 0.0, False, False,
                          self._info(success=False, score=0.0, valid=True))

    def _run(self, primitive_actions: list[int]) -> tuple[float, bool, bool, int]:
        """Step minigrid through the plan, stopping early when the level ends; (score, terminated,
        truncated, primitive steps run)."""
        for steps_run, primitive_action in enumerate(primitive_actions, start=1):
            _, reward, terminated, truncated, _ = self._game.step(primitive_action)
            if terminated or truncated:
                return float(reward), bool(terminated), bool(truncated), steps_run
        return 0.0, False, False, len(primitive_actions)

    def _finish(self, message: str, score: float, terminated: bool) -> StepResult:
        self._done, self._turn = True, None
        success = terminated and score > 0.0
        if success:
            ending = "You completed the mission!"
        elif terminated:
            ending = "The mission failed."
        else:
            ending = f"Time is up: the level's limit of {self._game.max_steps} primitive steps ran out."
        # A success on the very last allowed step is a success, not a time-out.
        return StepResult(f"{message}\n{ending}".strip(), 1.0 if success else 0.0, terminated, not terminated,
                          self._info(success=success, score=score, valid=True))

    def _refuse(self, explanation: str, parsed: bool) -> StepResult:
        """``parsed``: the reply named an action of the grammar, one that cannot be done here."""
        assert self._turn is not None
        options = ", ".join(available_actions(self._turn))
        return StepResult(f"{explanation}\nAvailable actions: {options}.", 0.0, False, False,
                          self._info(success=False, score=0.0, valid=False) | {"action_parsed": parsed})

    def _look(self) -> str:
        """Update what the agent knows, and render the view with the available actions."""
        in_view = visible_objects(self._game)
        self._memory.remember(v.obj for v in in_view)
        self._turn = TurnState(self._game, self._memory)
        view = describe(self._game, self._memory, in_view, self._turn.positions)
        return f"{view}\nAvailable actions: {', '.join(available_actions(self._turn))}."

    def _info(self, success: bool, score: float, valid: bool) -> dict[str, Any]:
        return {
            "success": success, "score": score, "action_parsed": True, "action_valid": valid, "level": self._level_id,
            "level_seed": self._level_seed, "primitive_steps": int(self._game.step_count),
            "max_primitive_steps": int(self._game.max_steps),
        }

    def close(self) -> None:
        for game in self._levels.values():
            game.close()
        self._levels.clear()
        self._game = self._turn = None
        self._done = True
