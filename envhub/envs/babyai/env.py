"""BabyAIEnv: minigrid's BabyAI levels as a multi-turn text game with macro-actions.

One turn:
1. read the action from the reply (``Thought: ... Action: <action>``);
2. parse and check it against the current world (an invalid one gets an explanation, no step spent);
3. run its primitive actions in minigrid until done, or until the level ends (success, failure, or
   minigrid's own step limit, which every primitive counts towards);
4. answer with what happened, the new view and the actions available now.
Reward 1.0 on success, else 0.0; ``info["score"]`` is minigrid's time-discounted reward.
"""

from __future__ import annotations

import re
from typing import Any

from envhub.actions import MalformedAction, extract_action
from envhub.base import ConversationStart, Environment, StepResult
from envhub.envs.babyai.commands import Invalid, TurnState, parse_command
from envhub.envs.babyai.levels import TaskLayout, make_level, quiet_minigrid
from envhub.envs.babyai.macros import available_actions, compile_command
from envhub.envs.babyai.view import ObjectMemory, describe, visible_objects
from envhub.examples import play_worked_example

# AgentGym's BabyAI instruction (agentenv/envs/babyai.py, conversation_start), with the action list
# of this env's grammar in its layout ("go through" opens a closed door on the way; "drop" exists),
# and a line on how this env's view names objects.
INSTRUCTION = (
    "You are an exploration master that wants to finish every goal you are given. Every round I will give you an "
    "observation, and you have to respond an action and your thought based on the observation to finish the given "
    "task. You are placed in a room and you need to accomplish the given goal with actions.\n\n"
    "You can use the following actions: \n\n- turn right \n\n- turn left \n\n- move forward \n\n"
    "- go to <obj> <id> \n\n- pick up <obj> <id> \n\n- drop: put down what you carry in front of you. \n\n"
    "- go through <door> <id>: <door> can be an open or a closed door; a locked door needs a key of its colour "
    "in your hands. \n\n- toggle: there is a closed or locked door or a box right in front of you and you can "
    "toggle it.\n"
    "Each observation lists the objects in your 7x7 view (ahead of you and to your sides, not behind you) with "
    "their distance and direction, named by colour, type and number, e.g. \"red ball 1\".\n"
    "Your response should use the following format:\nThought:\n<Your Thought>\n\nAction:\n<Your Action>"
)
WORKED_EXAMPLE_TASKS = 200
"""Training GoTo tasks the worked example's scripted policy tries, in order, until it wins one."""


class BabyAIEnv(Environment):
    """BabyAI through minigrid: 40 levels, task id = level_index * seeds_per_level + seed_offset.

    Options (``envhub.env_options: {babyai-v0: {...}}``):
        seeds_per_level: task ids per level (default 1000).
        test_seeds_per_level: the last this-many seed offsets of each level are the test split (default 100).
        require_action_marker: replies must contain ``Action:`` (default True); False also takes a
            reply without it as the action (its first line).

    Splits: ``train`` (the first seeds_per_level - test_seeds_per_level seed offsets of every level),
    ``test`` (the rest), and per level family (envhub/envs/babyai/levels.py) ``goto``, ``open``,
    ``pickup``, ``putnext``, ``unlock``, ``other``, ``synth`` (train offsets) with ``<family>_test``.

    The ``seed`` of ``reset`` does not change the level: the task id alone fixes the layout and
    mission (so the test split stays held out); BabyAI is deterministic given the layout.
    """

    example_actions = (
        "Action: turn left", "Action: go to red ball 1", "Action: turn left", "Action: go to red ball 1",
        "Action: turn left", "Action: go to red ball 1", "Action: move forward", "Action: go to red ball 1",
    )

    def __init__(self, seeds_per_level: int = 1000, test_seeds_per_level: int = 100,
                 require_action_marker: bool = True) -> None:
        if not isinstance(require_action_marker, bool):
            raise ValueError(f"babyai-v0: require_action_marker must be a bool, got {require_action_marker!r}")
        self._layout = TaskLayout(seeds_per_level, test_seeds_per_level)
        self._require_action_marker = require_action_marker
        self._levels: dict[str, Any] = {}  # minigrid env per level id, reused across resets
        self._game: Any = None
        self._level_id, self._level_seed = "", 0
        self._memory = ObjectMemory()
        self._turn: TurnState | None = None
        self._done = True

    @classmethod
    def task_splits(cls, seeds_per_level: int = 1000, test_seeds_per_level: int = 100,
                    require_action_marker: bool = True) -> dict[str, range | list[int]]:
        return TaskLayout(seeds_per_level, test_seeds_per_level).splits()

    @classmethod
    def conversation_start(cls, seeds_per_level: int = 1000, test_seeds_per_level: int = 100,
                           require_action_marker: bool = True) -> ConversationStart:
        """AgentGym's instruction, and one worked example (a won GoTo training task), shown by default."""
        goto = [str(n) for n in TaskLayout(seeds_per_level, test_seeds_per_level).splits()["goto"]]
        example = play_worked_example(lambda: cls(seeds_per_level, test_seeds_per_level, require_action_marker),
                                      goto[:WORKED_EXAMPLE_TASKS], lambda task_id: GoToPolicy(), min_turns=2)
        return ConversationStart(INSTRUCTION, examples=(example,), default_examples=1)

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
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

    async def step(self, action: str) -> StepResult:
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

    async def close(self) -> None:
        for game in self._levels.values():
            game.close()
        self._levels.clear()
        self._game = self._turn = None
        self._done = True


class GoToPolicy:
    """The worked example's policy for "go to the <colour> <type>": go to the goal once it has been
    seen, turn left until then (the example is a task where the goal starts out of view)."""

    def __init__(self) -> None:
        self.goal = ""

    def __call__(self, observation: str) -> str:
        mission = re.match(r"Your goal: go to (?:the|a) ((?:\w+ )?\w+)\n", observation)
        self.goal = mission.group(1) if mission else self.goal
        actions = re.search(r"^Available actions: (.*)\.$", observation, re.MULTILINE)
        for action in actions.group(1).split(", ") if actions and self.goal else ():
            if re.fullmatch(rf"go to {self.goal} \d+", action):
                return _reply(f"I see the {self.goal}. I will go to it.", action)
        return _reply(f"The {self.goal} is not in view. I will turn to look for it.", "turn left")


def _reply(thought: str, action: str) -> str:
    return f"Thought:\n{thought}\n\nAction:\n{action}"
