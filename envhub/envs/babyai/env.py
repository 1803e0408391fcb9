"""BabyAIEnv: minigrid's BabyAI levels as a multi-turn text game, in one of two dialects.

``agentgym`` (default) plays as AgentGym's BabyAI server and client do (envhub/envs/babyai/
agentgym_game.py): AgentGym's task indexing, action names renumbered by distance every turn, its
observation text with the ``Available actions: [...]`` list, its step counting and its score.
``lenient`` (envhub/envs/babyai/lenient.py) is this env's own grammar: stable object names, a
"go through" that opens doors, explanations for refused actions, reward 1 on success.
"""

from __future__ import annotations

from typing import Any, Protocol

from envhub.base import ConversationStart, Environment, StepResult
from envhub.envs.babyai.agentgym_game import AgentGymGame
from envhub.envs.babyai.lenient import LenientGame
from envhub.envs.babyai.levels import TaskLayout, agentgym_splits
from envhub.envs.babyai.worked_example import GoToPolicy, mission_goal
from envhub.examples import play_worked_examples

DIALECTS = ("agentgym", "lenient")
AGENTGYM_INSTRUCTION = (
    # AgentGym's BabyAIEnvClient.conversation_start (agentenv/agentenv/envs/babyai.py), word for word.
    "You are an exploration master that wants to finish every goal you are given. Every round I will give you an "
    "observation, and you have to respond an action and your thought based on the observation to finish the given "
    "task. You are placed in a room and you need to accomplish the given goal with actions.\n\n"
    "You can use the following actions: \n\n- turn right \n\n- turn left \n\n- move forward \n\n"
    "- go to <obj> <id> \n\n- pick up <obj> <id> \n\n- go through <door> <id>: <door> must be an open door. \n\n"
    "- toggle and go through <door> <id>: <door> can be a closed door or a locked door. If you want to open a "
    "locked door, you need to carry a key that is of the same color as the locked door. \n\n"
    "- toggle: there is a closed or locked door right in front of you and you can toggle it.\n"
    "Your response should use the following format:\nThought:\n<Your Thought>\n\nAction:\n<Your Action>"
)

# lenient: AgentGym's BabyAI instruction (agentenv/envs/babyai.py, conversation_start), with the action list
# of this env's grammar in its layout ("go through" opens a closed door on the way; "drop" exists),
# and a line on how this env's view names objects.
LENIENT_INSTRUCTION = (
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
"""Training GoTo tasks, evenly spaced over the split, the worked examples' scripted policy tries in order."""
WORKED_EXAMPLES = 6
"""Won GoTo tasks with as many different goals: an episode sees the ones its task id picks
(envhub.base.ConversationStart.turns), so repeating an example's answer wins only its own goal."""
LENIENT_ONLY = ("seeds_per_level", "test_seeds_per_level", "require_action_marker")


class BabyAIGame(Protocol):
    """One dialect's episode logic; BabyAIEnv delegates to it."""

    def reset(self, task_id: str) -> tuple[str, dict[str, Any]]: ...
    def step(self, reply: str) -> StepResult: ...
    def close(self) -> None: ...


class BabyAIEnv(Environment):
    """BabyAI through minigrid: 40 levels (envhub/envs/babyai/levels.py says how task ids map to them).

    Options (``envhub.env_options: {babyai-v0: {...}}``):
        dialect: "agentgym" (default) or "lenient" (see the module docstring).
        seeds_per_level, test_seeds_per_level, require_action_marker: lenient only (an error under
            agentgym, whose task ids and parsing are AgentGym's): task ids per level (default 1000),
            the last this-many seed offsets of each level held out (default 100), and whether replies
            must contain ``Action:`` (default True).

    Splits: ``train``, ``test``, and per level family (goto, open, pickup, putnext, unlock, other,
    synth) ``<family>`` (training ids) and ``<family>_test``. Under agentgym ``test`` is ids 0-399
    (seeds 0-9 of every level); under lenient the last seed offsets of every level.

    The ``seed`` of ``reset`` does not change the level: the task id alone fixes the layout and
    mission (so the test split stays held out); BabyAI is deterministic given the layout.
    """

    example_actions = (
        "Action: turn left", "Action: check available actions", "Action: move forward", "Action: turn right",
        "Action: go to red ball 1", "Action: turn left", "Action: go to red ball 1", "Action: go to red ball 1",
    )

    def __init__(self, dialect: str = "agentgym", **lenient_options: Any) -> None:
        dialect = _check_options(dialect, lenient_options)
        self.dialect = dialect
        self._game: BabyAIGame = AgentGymGame() if dialect == "agentgym" else _lenient_game(**lenient_options)

    @classmethod
    def task_splits(cls, dialect: str = "agentgym", **lenient_options: Any) -> dict[str, range | list[int]]:
        if _check_options(dialect, lenient_options) == "agentgym":
            return agentgym_splits()
        return _layout(**lenient_options).splits()

    @classmethod
    def conversation_start(cls, dialect: str = "agentgym", **lenient_options: Any) -> ConversationStart:
        """The dialect's instruction, and worked examples (won GoTo training tasks, each with its own
        goal), one shown by default under lenient; under agentgym only when the run asks
        (``rollout.num_examples``), since AgentGym's evaluation shows none and a model should be
        trained on the prompt it is scored on."""
        examples = play_worked_examples(lambda: cls(dialect, **lenient_options),
                                        worked_example_tasks(cls.task_splits(dialect, **lenient_options)["goto"]),
                                        lambda task_id: GoToPolicy(dialect), WORKED_EXAMPLES,
                                        distinct_by=mission_goal, min_turns=2)
        instruction = AGENTGYM_INSTRUCTION if dialect == "agentgym" else LENIENT_INSTRUCTION
        return ConversationStart(instruction, examples=examples, default_examples=int(dialect != "agentgym"))

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        return self._game.reset(task_id)

    async def step(self, action: str) -> StepResult:
        return self._game.step(action)

    async def close(self) -> None:
        self._game.close()


def worked_example_tasks(goto: range | list[int]) -> list[str]:
    """``WORKED_EXAMPLE_TASKS`` of the GoTo training split, evenly spaced: lenient numbers its tasks
    level by level, and its first 200 share one goal."""
    return [str(n) for n in goto[::max(1, len(goto) // WORKED_EXAMPLE_TASKS)]]


def _check_options(dialect: Any, lenient_options: dict[str, Any]) -> str:
    if dialect not in DIALECTS:
        raise ValueError(f"babyai-v0: option dialect must be one of {DIALECTS}, got {dialect!r}")
    unknown = sorted(set(lenient_options) - set(LENIENT_ONLY))
    if unknown:
        raise ValueError(f"babyai-v0: unknown option(s) {unknown}; options: dialect, {', '.join(LENIENT_ONLY)}")
    if dialect == "agentgym" and lenient_options:
        raise ValueError(f"babyai-v0: option(s) {sorted(lenient_options)} apply only to dialect 'lenient' "
                         "(agentgym uses AgentGym's task ids and parsing)")
    return dialect


def _layout(seeds_per_level: int = 1000, test_seeds_per_level: int = 100, **parsing: Any) -> TaskLayout:
    """The lenient task layout; ``parsing`` (require_action_marker) does not change the tasks."""
    return TaskLayout(seeds_per_level, test_seeds_per_level)


def _lenient_game(seeds_per_level: int = 1000, test_seeds_per_level: int = 100,
                  require_action_marker: bool = True) -> LenientGame:
    if not isinstance(require_action_marker, bool):
        raise ValueError(f"babyai-v0: require_action_marker must be a bool, got {require_action_marker!r}")
    return LenientGame(_layout(seeds_per_level, test_seeds_per_level), require_action_marker)
