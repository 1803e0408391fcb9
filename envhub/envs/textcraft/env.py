"""``textcraft-v0``: the TextCraft crafting game (ADaPT), as AgentGym serves it.

Two dialects (option ``dialect``). ``agentgym`` (default) is AgentGym's client and server: its tree,
goal order, parsing, observation texts and reward (agentgym_tree.py, agentgym_game.py); task id N is
AgentGym's data_idx N with its recipe files read in ``LC_ALL=C ls`` order (``agentgym_tree.goal_items`` lists
them). AgentGym's server always seeds its random draws with 42, so the ``seed`` does not change a
task there. Reward: AgentGym's step reward (1 on the step that crafts the goal, else 0, which is
also ``info["score"]`` and AgentGym-RL's training reward); a reply with two ``Action:`` lines is
answered by AgentGym's client without a step. ``lenient`` is the earlier behaviour, described below.

The conversation start is AgentGym's TextCraft instruction and worked examples; the first
observation gives the crafting commands of the goal's recipe tree mixed with distractors, and the
goal. The agent replies ``Thought: ...`` then ``Action: <action>`` with ``get N item``, ``craft N item using a X, b Y``
or ``inventory``. Reward 1 and ``terminated`` (success) once the goal item is crafted; there is
no failing end, the actor's turn cap ends unsuccessful episodes. Task id i is the i-th goal in
(crafting depth, name) order (envhub/envs/textcraft/catalog.py has the splits).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envhub.base import ConversationStart, Environment, StepResult
from envhub.envs.textcraft.dialects import DIALECTS, Episode, goal_info

DEFAULT_NUM_DISTRACTORS = 10

# AgentGym's TextCraft client opens every episode with this user turn, word for word
# (agentenv/envs/textcraft.py, conversation_start), then "OK. I'll follow your instructions ...".
INSTRUCTION = (
    'You are given few useful crafting recipes to craft items in Minecraft. Crafting commands are of the format '
    '"craft [target object] using [input ingredients]".\nEvery round I will give you an observation, you have to '
    'respond an action based on the state and instruction. You can "get" an object (ingredients) from the inventory '
    'or the environment, look-up the game inventory by "inventory", or "craft" (target) using any of the crafting '
    'commands.\nYour output must strictly follow this format:"Thought:\nyour thoughts.\n\nAction:\nyour next '
    'action"\n\nReminder: \n1. Always specify the quantity when using "get" and "craft" commands. - Example of get: '
    'get 1 lapis lazuli - Example1 of craft: craft 1 blue dye using 1 lapis lazuli - Example2 of craft: craft 1 '
    'golden carrot using 8 gold nugget, 1 carrot\n2. When using "get" command, do not specify whether the item '
    'comes from the inventory or the environment.\n3. You can use ONLY crafting commands provided, do not use your '
    'own crafting commands. However, if the crafting command uses a generic ingredient like "planks", you can use '
    'special types of the same ingredient e.g. "dark oak planks" in the command instead.\n\n'
)


class TextCraftEnv(Environment):
    """Craft the goal item from base items, following the given crafting commands.

    Options (``envhub.env_options: {textcraft-v0: {...}}``):
        dialect: "agentgym" (default) or "lenient" (module docstring).
        recipes_dir: folder of vanilla data-pack recipe JSON files (e.g. ADaPT's recipes, 544 goals);
            None (default) builds Minecraft 1.16 recipes from the ``minecraft-data`` package (agentgym:
            AgentGym's 544 goals, rebuilt by pack_mcdata.py; lenient: 546 goals).
        num_distractors: the most recipes not in the goal's tree added to the crafting commands (default
            10, AgentGym's ``max_distractor``; another value departs from AgentGym under agentgym).
    """

    # Win task 0 (acacia planks) of the default recipes under the default (agentgym) dialect.
    example_actions = (
        "Thought:\nI need acacia logs first.\n\nAction:\nget 1 acacia logs",
        "Thought:\nNow craft the planks.\n\nAction:\ncraft 4 acacia planks using 1 acacia logs",
    )

    def __init__(self, recipes_dir: str | None = None, num_distractors: int = DEFAULT_NUM_DISTRACTORS,
                 dialect: str = "agentgym") -> None:
        self.dialect = _checked_dialect(dialect)
        self.recipes_dir = _checked_recipes_dir(recipes_dir)
        self.num_distractors = _checked_num_distractors(num_distractors)
        self._episode: Episode | None = None

    @classmethod
    def task_splits(cls, recipes_dir: str | None = None, num_distractors: int = DEFAULT_NUM_DISTRACTORS,
                    dialect: str = "agentgym", **unknown: Any) -> dict[str, list[int]]:
        if unknown:
            raise TypeError(f"textcraft-v0: unknown options {sorted(unknown)}; "
                            "known: dialect, recipes_dir, num_distractors")
        _checked_num_distractors(num_distractors)
        return DIALECTS[_checked_dialect(dialect)].splits(_checked_recipes_dir(recipes_dir))

    @classmethod
    def conversation_start(cls, recipes_dir: str | None = None, num_distractors: int = DEFAULT_NUM_DISTRACTORS,
                           dialect: str = "agentgym", **unknown: Any) -> ConversationStart:
        """AgentGym's instruction, and worked examples (won depth-1 training goals; one under lenient,
        shown by default; six under agentgym, shown only when the run asks, ``rollout.num_examples``,
        since AgentGym's evaluation shows none and a model should be trained on the prompt it is scored on)."""
        splits = cls.task_splits(recipes_dir, num_distractors, dialect, **unknown)  # the same checks
        rules = DIALECTS[dialect]
        examples = rules.worked_examples(_checked_recipes_dir(recipes_dir), num_distractors, splits)
        if not examples:
            return ConversationStart(INSTRUCTION)
        return ConversationStart(INSTRUCTION, examples=examples, default_examples=rules.default_examples)

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        self._episode = None  # a reset that fails leaves no episode to step
        self._episode = await DIALECTS[self.dialect].episode(self.recipes_dir, self.num_distractors, task_id, seed)
        return self._episode.observation, goal_info(self._episode.goal, success=False)

    async def step(self, action: str) -> StepResult:
        if self._episode is None or self._episode.done:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        return self._episode.step(action)

    async def close(self) -> None:
        self._episode = None


def _checked_dialect(dialect: Any) -> str:
    if not isinstance(dialect, str) or dialect not in DIALECTS:
        raise ValueError(f"textcraft-v0: option dialect must be one of {', '.join(DIALECTS)}; got {dialect!r}")
    return dialect


def _checked_recipes_dir(recipes_dir: Any) -> str | None:
    if recipes_dir is None:
        return None
    if not isinstance(recipes_dir, (str, Path)):
        raise TypeError(f"textcraft-v0: recipes_dir must be a folder path or None, got {recipes_dir!r}")
    folder = Path(recipes_dir).expanduser().resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"textcraft-v0: recipes_dir {str(recipes_dir)!r} is not a folder")
    return str(folder)


def _checked_num_distractors(num_distractors: Any) -> int:
    if isinstance(num_distractors, bool) or not isinstance(num_distractors, int) or num_distractors < 0:
        raise ValueError(f"textcraft-v0: num_distractors must be an int >= 0, got {num_distractors!r}")
    return num_distractors
