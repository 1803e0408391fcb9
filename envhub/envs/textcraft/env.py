"""``textcraft-v0``: the TextCraft crafting game (ADaPT), as AgentGym serves it.

Two dialects (option ``dialect``). ``agentgym`` (default) is AgentGym's client and server: its tree,
goal order, parsing, observation texts and reward (agentgym_tree.py, agentgym_game.py); task id N is
AgentGym's data_idx N with its recipe files read in ``LC_ALL=C ls`` order (``agentgym_tree.goal_items`` lists
them). AgentGym's server always seeds its random draws with 42, so the ``seed`` does not change a
task there. Reward: AgentGym's step reward (1 on the step that crafts the goal, else 0, which is
also ``info["score"]`` and AgentGym-RL's training reward); a reply with two ``Action:`` lines is
answered by AgentGym's client without a step. ``lenient`` is the earlier behaviour, described below.

The conversation start is AgentGym's TextCraft instruction and one worked example; the first
observation gives the crafting commands of the goal's recipe tree mixed with distractors, and the
goal. The agent replies ``Thought: ...`` then ``Action: <action>`` with ``get N item``, ``craft N item using a X, b Y``
or ``inventory``. Reward 1 and ``terminated`` (success) once the goal item is crafted; there is
no failing end, the actor's turn cap ends unsuccessful episodes. Task id i is the i-th goal in
(crafting depth, name) order (envhub/envs/textcraft/catalog.py has the splits).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

from envhub.actions import MalformedAction, extract_action
from envhub.base import ConversationStart, Environment, StepResult
from envhub.envs.textcraft.agentgym_game import (
    TOO_MANY_ACTIONS,
    AgentGymGame,
    Outcome,
    client_action,
    first_observation,
)
from envhub.envs.textcraft.agentgym_tree import AgentGymTree, load_agentgym_tree, loaded_agentgym_tree
from envhub.envs.textcraft.catalog import Catalog, Goal, load_catalog, splits_by_depth
from envhub.envs.textcraft.commands import Craft, Get, ShowInventory, Unparsable, parse_command
from envhub.envs.textcraft.crafting import Workbench
from envhub.envs.textcraft.example import agentgym_worked_example, worked_example
from envhub.envs.textcraft.recipes import display_name
from envhub.envs.textcraft.tasks import crafting_commands, task_observation

DEFAULT_NUM_DISTRACTORS = 10
DIALECTS = ("agentgym", "lenient")
AGENTGYM_SEED = 42
"""``TextCraftEnv.reset``'s default seed; AgentGym's server never passes another."""

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
        self._workbench: Workbench | None = None
        self._game: AgentGymGame | None = None
        self._goal: Goal | None = None
        self._done = True

    @classmethod
    def task_splits(cls, recipes_dir: str | None = None, num_distractors: int = DEFAULT_NUM_DISTRACTORS,
                    dialect: str = "agentgym", **unknown: Any) -> dict[str, list[int]]:
        if unknown:
            raise TypeError(f"textcraft-v0: unknown options {sorted(unknown)}; "
                            "known: dialect, recipes_dir, num_distractors")
        _checked_num_distractors(num_distractors)
        if _checked_dialect(dialect) == "agentgym":
            tree = load_agentgym_tree(_checked_recipes_dir(recipes_dir))
            return splits_by_depth([tree.depths[goal] for goal in tree.goals])
        return load_catalog(_checked_recipes_dir(recipes_dir)).splits()

    @classmethod
    def conversation_start(cls, recipes_dir: str | None = None, num_distractors: int = DEFAULT_NUM_DISTRACTORS,
                           dialect: str = "agentgym", **unknown: Any) -> ConversationStart:
        """AgentGym's instruction, and one worked example (a won depth-1 training goal): shown by default
        under lenient; under agentgym only when the run asks (``rollout.num_examples``), since AgentGym's
        evaluation shows none and a model should be trained on the prompt it is scored on."""
        splits = cls.task_splits(recipes_dir, num_distractors, dialect, **unknown)  # the same checks
        if dialect == "agentgym":
            if not splits.get("depth1_train"):  # a recipe folder with no depth-1 goal: nothing to show
                return ConversationStart(INSTRUCTION)
            tree = load_agentgym_tree(_checked_recipes_dir(recipes_dir))
            example = agentgym_worked_example(tree, splits["depth1_train"], random.Random(AGENTGYM_SEED))
        else:
            example = worked_example(load_catalog(_checked_recipes_dir(recipes_dir)), num_distractors)
        return ConversationStart(INSTRUCTION, examples=(example,), default_examples=int(dialect != "agentgym"))

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        if self.dialect == "agentgym":
            # Built once per process; after that a reset is ~0.1 ms, less than a thread hand-off costs.
            tree = loaded_agentgym_tree(self.recipes_dir) or await asyncio.to_thread(load_agentgym_tree,
                                                                                      self.recipes_dir)
            return self._reset_agentgym(tree, task_id)
        catalog = await asyncio.to_thread(load_catalog, self.recipes_dir)
        self._goal = _goal_of(catalog, task_id)
        rng = random.Random(f"textcraft-v0:{task_id}:{int(seed)}")
        commands = crafting_commands(catalog, self._goal.item, rng, self.num_distractors)
        self._workbench = Workbench(catalog.book)
        self._done = False
        return task_observation(commands, self._goal.item), self._info(success=False)

    def _reset_agentgym(self, tree: AgentGymTree, task_id: str) -> tuple[str, dict[str, Any]]:
        number = int(task_id)
        if not 0 <= number < len(tree.goals):
            raise ValueError(f"textcraft-v0: task {task_id!r} out of range; there are {len(tree.goals)} goals")
        goal = tree.goals[number]
        self._goal = Goal(goal, tree.depths[goal])
        self._game = AgentGymGame(tree, goal)
        self._done = False
        commands = tree.crafting_commands(goal, random.Random(AGENTGYM_SEED), self.num_distractors)
        return first_observation(commands, goal), self._info(success=False)

    async def step(self, action: str) -> StepResult:
        if self._done or (self._workbench is None and self._game is None):
            raise RuntimeError("step() called after the episode ended; call reset() first")
        if self.dialect == "agentgym":
            return self._step_agentgym(action)
        assert self._workbench is not None
        reply = extract_action(action)
        if isinstance(reply, MalformedAction):
            return self._result(reply.feedback, parsed=False)
        command = parse_command(reply)
        if isinstance(command, Unparsable):
            return self._result(command.feedback, parsed=False)
        if isinstance(command, Get):
            inventory_before = dict(self._workbench.inventory)
            observation = self._workbench.get(command)
            return self._result(observation, valid=self._workbench.inventory != inventory_before)
        if isinstance(command, ShowInventory):
            return self._result(self._workbench.describe_inventory())
        assert isinstance(command, Craft)
        observation, recipe = self._workbench.craft(command)
        return self._result(observation, valid=recipe is not None)

    def _step_agentgym(self, reply: str) -> StepResult:
        """The client's parsing, then the server's step; reward and score are AgentGym's step reward."""
        assert self._game is not None
        action = client_action(reply)
        outcome = Outcome(TOO_MANY_ACTIONS, 0, False, False, False) if action is None else self._game.step(action)
        self._done = outcome.done
        info = self._info(success=outcome.reward == 1) | {
            "score": float(outcome.reward), "action_parsed": outcome.parsed, "action_valid": outcome.valid}
        return StepResult(outcome.observation, float(outcome.reward), outcome.done, False, info)

    async def close(self) -> None:
        self._workbench, self._game, self._goal, self._done = None, None, None, True

    def _result(self, observation: str, parsed: bool = True, valid: bool | None = None) -> StepResult:
        """``parsed``: the reply held a command in the game's grammar; ``valid``: the game carried it out."""
        assert self._workbench is not None and self._goal is not None
        actions = {"action_parsed": parsed, "action_valid": parsed if valid is None else valid}
        if self._workbench.holds(self._goal.item):
            self._done = True
            return StepResult(observation, 1.0, True, False, self._info(success=True) | actions | {"score": 1.0})
        return StepResult(observation, 0.0, False, False, self._info(success=False) | actions | {"score": 0.0})

    def _info(self, success: bool) -> dict[str, Any]:
        assert self._goal is not None
        return {"success": success, "goal": display_name(self._goal.item), "depth": self._goal.depth}


def _goal_of(catalog: Catalog, task_id: str) -> Goal:
    number = int(task_id)
    if not 0 <= number < len(catalog.goals):
        raise ValueError(f"textcraft-v0: task {task_id!r} out of range; there are {len(catalog.goals)} goals")
    return catalog.goals[number]


def _checked_dialect(dialect: Any) -> str:
    if dialect not in DIALECTS:
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
