"""``textcraft-v0``: the TextCraft crafting game (ADaPT), as AgentGym serves it.

The conversation start is AgentGym's TextCraft instruction and one worked example; the first
observation gives the crafting commands of the goal's recipe tree mixed with distractors, and the goal. The agent replies
``Thought: ...`` then ``Action: <action>`` with ``get N item``, ``craft N item using a X, b Y``
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
from envhub.envs.textcraft.catalog import Catalog, Goal, load_catalog
from envhub.envs.textcraft.commands import Craft, Get, ShowInventory, Unparsable, parse_command
from envhub.envs.textcraft.crafting import Workbench
from envhub.envs.textcraft.example import worked_example
from envhub.envs.textcraft.recipes import display_name
from envhub.envs.textcraft.tasks import crafting_commands, task_observation

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
        recipes_dir: folder of vanilla data-pack recipe JSON files (e.g. ADaPT's recipes, 544 goals);
            None (default) builds Minecraft 1.16 recipes from the ``minecraft-data`` package (546 goals).
        num_distractors: recipes not in the goal's tree added to the crafting commands (default 10).
    """

    # Wins task 0 of the default recipe set (acacia planks); uses a member of the acacia_logs tag.
    example_actions = (
        "Thought: I need acacia logs first.\nAction: get 1 acacia log",
        "Thought: Now craft the planks.\nAction: craft 4 acacia planks using 1 acacia log",
    )

    def __init__(self, recipes_dir: str | None = None, num_distractors: int = DEFAULT_NUM_DISTRACTORS) -> None:
        self.recipes_dir = _checked_recipes_dir(recipes_dir)
        self.num_distractors = _checked_num_distractors(num_distractors)
        self._workbench: Workbench | None = None
        self._goal: Goal | None = None
        self._done = True

    @classmethod
    def task_splits(cls, recipes_dir: str | None = None, num_distractors: int = DEFAULT_NUM_DISTRACTORS,
                    **unknown: Any) -> dict[str, list[int]]:
        if unknown:
            raise TypeError(f"textcraft-v0: unknown options {sorted(unknown)}; known: recipes_dir, num_distractors")
        _checked_num_distractors(num_distractors)
        return load_catalog(_checked_recipes_dir(recipes_dir)).splits()

    @classmethod
    def conversation_start(cls, recipes_dir: str | None = None, num_distractors: int = DEFAULT_NUM_DISTRACTORS,
                           **unknown: Any) -> ConversationStart:
        """AgentGym's instruction, and one worked example (a won depth-1 training goal), shown by default."""
        cls.task_splits(recipes_dir, num_distractors, **unknown)  # the same checks
        catalog = load_catalog(_checked_recipes_dir(recipes_dir))
        return ConversationStart(INSTRUCTION, examples=(worked_example(catalog, num_distractors),),
                                 default_examples=1)

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        catalog = await asyncio.to_thread(load_catalog, self.recipes_dir)
        self._goal = _goal_of(catalog, task_id)
        rng = random.Random(f"textcraft-v0:{task_id}:{int(seed)}")
        commands = crafting_commands(catalog, self._goal.item, rng, self.num_distractors)
        self._workbench = Workbench(catalog.book)
        self._done = False
        return task_observation(commands, self._goal.item), self._info(success=False)

    async def step(self, action: str) -> StepResult:
        if self._done or self._workbench is None:
            raise RuntimeError("step() called after the episode ended; call reset() first")
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

    async def close(self) -> None:
        self._workbench, self._goal, self._done = None, None, True

    def _result(self, observation: str, parsed: bool = True, valid: bool | None = None) -> StepResult:
        """``parsed``: the reply held a command in the game's grammar; ``valid``: the game carried it out."""
        assert self._workbench is not None and self._goal is not None
        actions = {"action_parsed": parsed, "action_valid": parsed if valid is None else valid}
        if self._workbench.holds(self._goal.item):
            self._done = True
            return StepResult(observation, 1.0, True, False, self._info(success=True) | actions)
        return StepResult(observation, 0.0, False, False, self._info(success=False) | actions)

    def _info(self, success: bool) -> dict[str, Any]:
        assert self._goal is not None
        return {"success": success, "goal": display_name(self._goal.item), "depth": self._goal.depth}



def _goal_of(catalog: Catalog, task_id: str) -> Goal:
    number = int(task_id)
    if not 0 <= number < len(catalog.goals):
        raise ValueError(f"textcraft-v0: task {task_id!r} out of range; there are {len(catalog.goals)} goals")
    return catalog.goals[number]


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
