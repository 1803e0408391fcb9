"""TextCraft's worked example: a won depth-1 training goal, played through the real game rules.

A small model copies the format of an exchange it has seen far more readily than it follows an
instruction (SmolLM2-135M on TextCraft at temperature 1.0: 0 of 16 first replies parse without one,
4 of 16 with it; format bench). The example is played here by the same ``Workbench`` the env uses,
so its observations are the game's own words, and it is drawn from the training split, never from
the goals held out for evaluation.
"""

from __future__ import annotations

import random

from envhub.envs.textcraft.agentgym_game import AgentGymGame, first_observation
from envhub.envs.textcraft.agentgym_tree import AgentGymTree, TreeRecipe, display
from envhub.envs.textcraft.catalog import Catalog, Goal
from envhub.envs.textcraft.commands import Craft, Get
from envhub.envs.textcraft.crafting import Workbench
from envhub.envs.textcraft.recipes import Recipe, display_name
from envhub.envs.textcraft.tasks import crafting_commands, task_observation


def worked_example(catalog: Catalog, num_distractors: int) -> tuple[tuple[str, str], ...]:
    """(observation, reply) turns of a won episode: get each base ingredient, then craft the goal."""
    goal, recipe, commands = _example_goal(catalog, num_distractors)
    bench, turns, observation = Workbench(catalog.book), [], task_observation(commands, goal.item)
    for ingredient in recipe.ingredients:
        name = display_name(ingredient.name)
        reply = _reply(f"I need {ingredient.count} {name} for the {display_name(goal.item)}. I will get it first.",
                       f"get {ingredient.count} {name}")
        turns.append((observation, reply))
        observation = bench.get(Get(ingredient.count, ingredient.name))
    craft = recipe.command()
    turns.append((observation, _reply("I have the ingredients now, so I can craft the goal.", craft)))
    ingredients = tuple((ingredient.name, ingredient.count) for ingredient in recipe.ingredients)
    observation, used = bench.craft(Craft(recipe.count, goal.item, ingredients))
    if used is None or not bench.holds(goal.item):
        raise RuntimeError(f"textcraft-v0: the worked example failed to craft {goal.item}: {observation}")
    return tuple(turns)


def _example_goal(catalog: Catalog, num_distractors: int) -> tuple[Goal, Recipe, list[str]]:
    """The first depth-1 training goal with one recipe of one or two base ingredients and, where the
    recipes allow, distractors among its commands (so the example shows picking the right one)."""
    candidates = []
    for number in catalog.splits()["depth1_train"]:
        goal = catalog.goals[number]
        recipes = catalog.book.recipes.get(goal.item, ())
        if len(recipes) == 1 and len(recipes[0].ingredients) <= 2 and all(
                catalog.book.is_base(i.name) for i in recipes[0].ingredients):
            rng = random.Random(f"textcraft-v0:worked-example:{goal.item}")
            candidates.append((goal, recipes[0], crafting_commands(catalog, goal.item, rng, num_distractors)))
            if len(candidates[-1][2]) > min(num_distractors, 2):
                return candidates[-1]
    if candidates:
        return candidates[0]
    raise ValueError("textcraft-v0: no depth-1 training goal made of base items to show as a worked example")


def _reply(thought: str, action: str) -> str:
    """AgentGym's reply format, as its instruction spells it."""
    return f"Thought:\n{thought}\n\nAction:\n{action}"


def agentgym_worked_examples(tree: AgentGymTree, depth1_train: list[int], num_distractors: int, seed: int,
                             count: int) -> tuple[tuple[tuple[str, str], ...], ...]:
    """Up to ``count`` examples of the same kind under the agentgym dialect, played by AgentGym's
    rules (agentgym_game.py), each on a different depth-1 training goal whose first recipe takes one
    or two gettable items, those whose commands hold distractors first (they show picking the right
    one). Each shows the commands the env itself shows that task (drawn with ``seed``, as its reset
    does). Several, since an episode sees the ones its task id picks: shown one, a small model learns
    to repeat its answer (BabyAI)."""
    recipes = {goal: tree.item_recipes[goal][0] for goal in (tree.goals[number] for number in depth1_train)}
    playable = [goal for goal, recipe in recipes.items() if _playable(tree, recipe)]
    if not playable:
        raise ValueError("textcraft-v0: no depth-1 training goal made of gettable items to show as a worked example")
    listings = {goal: tree.crafting_commands(goal, random.Random(seed), num_distractors) for goal in playable}
    ranked = sorted(playable, key=lambda goal: len(listings[goal]) == 1)  # stable: training order
    chosen = _varied(ranked, {goal: {part.name for part in recipes[goal].inputs} for goal in ranked}, count)
    return tuple(_play_agentgym(tree, goal, recipes[goal], listings[goal]) for goal in chosen)


def _varied(goals: list[str], ingredients: dict[str, set[str]], count: int) -> list[str]:
    """The first ``count`` goals, preferring those that share no ingredient with one taken before
    (six blackstone recipes would show one answer six times)."""
    fresh, seen = [], set()
    for goal in goals:
        if not ingredients[goal] & seen:
            fresh.append(goal)
            seen |= ingredients[goal]
    return (fresh + [goal for goal in goals if goal not in fresh])[:count]


def _playable(tree: AgentGymTree, recipe: TreeRecipe) -> bool:
    return len(recipe.inputs) <= 2 and all(_gettable(tree, part.name) for part in recipe.inputs)


def _gettable(tree: AgentGymTree, name: str) -> bool:
    return name in tree.item_ids and name not in tree.tags and not tree.is_craftable(name)


def _play_agentgym(tree: AgentGymTree, goal: str, recipe: TreeRecipe,
                   commands: list[str]) -> tuple[tuple[str, str], ...]:
    """A won episode that opens with the craft the game refuses (no ingredients yet) and recovers:
    get what the command uses, then craft. Shown examples that got first, SmolLM2 still crafted
    first (93 of 102 training episodes, 25 of 25 greedy held-out ones) and never learned what to do
    next; the mistake it makes is the one an example had better show the way out of (shown three of
    these, it gets after the refusal: 2 of 100 sampled held-out episodes won, 0 of 50 before)."""
    game, turns = AgentGymGame(tree, goal), []
    observation = first_observation(commands, goal)
    turns.append((observation, _reply(f"I can craft the {display(goal)} with this command.", recipe.command())))
    observation = game.step(recipe.command()).observation
    uses = ", ".join(f"{part.count} {display(part.name)}" for part in recipe.inputs)
    for k, part in enumerate(recipe.inputs):
        wanted = f"{part.count} {display(part.name)}"
        if k == 0:
            thought = f"The command uses {uses}, and I do not have them. I will get {wanted} first."
        else:
            thought = f"I need {wanted} for the {display(goal)}. I will get it first."
        action = f"get {wanted}"
        turns.append((observation, _reply(thought, action)))
        observation = game.step(action).observation
    turns.append((observation, _reply("I have the ingredients now, so I can craft the goal.", recipe.command())))
    if not game.step(recipe.command()).done:
        raise RuntimeError(f"textcraft-v0: the worked example failed to craft {goal}")
    return tuple(turns)
