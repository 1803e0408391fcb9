"""The two ways ``textcraft-v0`` plays (option ``dialect``), each one object: ``TextCraftEnv`` asks
its dialect for the task splits, the worked example and each episode, and never branches on it.

- ``agentgym`` (default): AgentGym's client and server (agentgym_tree.py, agentgym_game.py).
- ``lenient``: the earlier rules (catalog.py, crafting.py, commands.py).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, Protocol

from envhub.actions import MalformedAction, extract_action
from envhub.base import StepResult
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
from envhub.envs.textcraft.example import agentgym_worked_examples, worked_example
from envhub.envs.textcraft.recipes import display_name
from envhub.envs.textcraft.tasks import crafting_commands, task_observation

AGENTGYM_SEED = 42
"""``TextCraftEnv.reset``'s default seed; AgentGym's server never passes another."""
AGENTGYM_EXAMPLES = 6
"""Worked examples on offer under agentgym, each a different goal (``rollout.num_examples`` picks)."""

Exchange = tuple[tuple[str, str], ...]
"""A worked example: (observation, reply) turns."""


class Episode(Protocol):
    """One episode in play: its goal, and the answer to each reply."""

    goal: Goal
    observation: str
    """The first observation."""
    done: bool

    def step(self, reply: str) -> StepResult: ...


class Dialect(Protocol):
    default_examples: int
    """Worked examples shown when the run does not say how many."""

    def splits(self, recipes_dir: str | None) -> dict[str, list[int]]: ...

    def worked_examples(self, recipes_dir: str | None, num_distractors: int,
                        splits: dict[str, list[int]]) -> tuple[Exchange, ...]: ...

    async def episode(self, recipes_dir: str | None, num_distractors: int, task_id: str, seed: int) -> Episode: ...


def goal_info(goal: Goal, success: bool) -> dict[str, Any]:
    return {"success": success, "goal": display_name(goal.item), "depth": goal.depth}


# ---------------------------------------------------------------------------------- agentgym


class AgentGymDialect:
    """Task id N is AgentGym's data_idx N; its server seeds every draw with 42, so ``seed`` changes
    nothing; reward is AgentGym's step reward (1 on the step that crafts the goal), also the score."""

    default_examples = 0  # AgentGym's evaluation shows none: train on the prompt that is scored

    def splits(self, recipes_dir: str | None) -> dict[str, list[int]]:
        tree = load_agentgym_tree(recipes_dir)
        return splits_by_depth([tree.depths[goal] for goal in tree.goals])

    def worked_examples(self, recipes_dir: str | None, num_distractors: int,
                        splits: dict[str, list[int]]) -> tuple[Exchange, ...]:
        if not splits.get("depth1_train"):  # a recipe folder with no depth-1 goal: nothing to show
            return ()
        tree = load_agentgym_tree(recipes_dir)
        return agentgym_worked_examples(tree, splits["depth1_train"], num_distractors, AGENTGYM_SEED,
                                        AGENTGYM_EXAMPLES)

    async def episode(self, recipes_dir: str | None, num_distractors: int, task_id: str,
                      seed: int) -> AgentGymEpisode:
        # Built once per process; after that a reset is ~0.1 ms, less than a thread hand-off costs.
        tree = loaded_agentgym_tree(recipes_dir) or await asyncio.to_thread(load_agentgym_tree, recipes_dir)
        number = int(task_id)
        if not 0 <= number < len(tree.goals):
            raise ValueError(f"textcraft-v0: task {task_id!r} out of range; there are {len(tree.goals)} goals")
        return AgentGymEpisode(tree, tree.goals[number], num_distractors)


class AgentGymEpisode:
    def __init__(self, tree: AgentGymTree, goal: str, num_distractors: int) -> None:
        self.goal = Goal(goal, tree.depths[goal])
        self.game = AgentGymGame(tree, goal)
        self.done = False
        commands = tree.crafting_commands(goal, random.Random(AGENTGYM_SEED), num_distractors)
        self.observation = first_observation(commands, goal)

    def step(self, reply: str) -> StepResult:
        """The client's parsing, then the server's step; a reply with two ``Action:`` lines is
        answered by the client without a step."""
        action = client_action(reply)
        outcome = Outcome(TOO_MANY_ACTIONS, 0, False, False, False) if action is None else self.game.step(action)
        self.done = outcome.done
        info = goal_info(self.goal, success=outcome.reward == 1) | {
            "score": float(outcome.reward), "action_parsed": outcome.parsed, "action_valid": outcome.valid}
        return StepResult(outcome.observation, float(outcome.reward), outcome.done, False, info)


# ---------------------------------------------------------------------------------- lenient


class LenientDialect:
    """Task id i is the i-th goal in (crafting depth, name) order; ``seed`` draws the distractors."""

    default_examples = 1

    def splits(self, recipes_dir: str | None) -> dict[str, list[int]]:
        return load_catalog(recipes_dir).splits()

    def worked_examples(self, recipes_dir: str | None, num_distractors: int,
                        splits: dict[str, list[int]]) -> tuple[Exchange, ...]:
        return (worked_example(load_catalog(recipes_dir), num_distractors),)

    async def episode(self, recipes_dir: str | None, num_distractors: int, task_id: str,
                      seed: int) -> LenientEpisode:
        catalog = await asyncio.to_thread(load_catalog, recipes_dir)
        rng = random.Random(f"textcraft-v0:{task_id}:{int(seed)}")
        return LenientEpisode(catalog, _goal_of(catalog, task_id), rng, num_distractors)


class LenientEpisode:
    def __init__(self, catalog: Catalog, goal: Goal, rng: random.Random, num_distractors: int) -> None:
        self.goal = goal
        self.workbench = Workbench(catalog.book)
        self.done = False
        self.observation = task_observation(crafting_commands(catalog, goal.item, rng, num_distractors), goal.item)

    def step(self, reply: str) -> StepResult:
        action = extract_action(reply)
        if isinstance(action, MalformedAction):
            return self._result(action.feedback, parsed=False)
        command = parse_command(action)
        if isinstance(command, Unparsable):
            return self._result(command.feedback, parsed=False)
        if isinstance(command, Get):
            inventory_before = dict(self.workbench.inventory)
            observation = self.workbench.get(command)
            return self._result(observation, valid=self.workbench.inventory != inventory_before)
        if isinstance(command, ShowInventory):
            return self._result(self.workbench.describe_inventory())
        assert isinstance(command, Craft)
        observation, recipe = self.workbench.craft(command)
        return self._result(observation, valid=recipe is not None)

    def _result(self, observation: str, parsed: bool = True, valid: bool | None = None) -> StepResult:
        """``parsed``: the reply held a command in the game's grammar; ``valid``: the game carried it out."""
        actions = {"action_parsed": parsed, "action_valid": parsed if valid is None else valid}
        won = self.workbench.holds(self.goal.item)
        self.done = won
        return StepResult(observation, float(won), won, False,
                          goal_info(self.goal, success=won) | actions | {"score": float(won)})


def _goal_of(catalog: Catalog, task_id: str) -> Goal:
    number = int(task_id)
    if not 0 <= number < len(catalog.goals):
        raise ValueError(f"textcraft-v0: task {task_id!r} out of range; there are {len(catalog.goals)} goals")
    return catalog.goals[number]


DIALECTS: dict[str, Dialect] = {"agentgym": AgentGymDialect(), "lenient": LenientDialect()}
