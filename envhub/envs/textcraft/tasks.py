"""What one task shows the agent: the goal's crafting commands plus distractors, shuffled.

As in ADaPT's TextCraft, the commands are every recipe of the goal's recipe tree (the goal's
recipes, then recursively those of their ingredients; a tag ingredient brings the recipes of
all its members), plus ``num_distractors`` recipes that use the same ingredients but are not in
the tree: up to ``USES_SAMPLED`` uses per ingredient are drawn, then the distractors among them.
All draws come from one ``random.Random`` seeded by (task, seed), over sorted candidates.
"""

from __future__ import annotations

import random
from collections import deque

from envhub.envs.textcraft.catalog import Catalog
from envhub.envs.textcraft.recipes import Recipe, RecipeBook, display_name

USES_SAMPLED = 10


def recipe_tree(book: RecipeBook, goal: str) -> list[Recipe]:
    """Every recipe that can take part in crafting ``goal``, breadth first from the goal."""
    seen: set[str] = set()
    queue = deque([goal])
    tree: list[Recipe] = []
    while queue:
        name = queue.popleft()
        if name in seen:
            continue
        seen.add(name)
        for recipe in recipes_making(book, name):
            tree.append(recipe)
            queue.extend(ingredient.name for ingredient in recipe.ingredients)
    return tree


def recipes_making(book: RecipeBook, name: str) -> tuple[Recipe, ...]:
    """Recipes of an item, or of every member of a tag (members in name order)."""
    if name in book.recipes:
        return book.recipes[name]
    members = sorted(book.tags.get(name, ()))
    return tuple(recipe for member in members for recipe in book.recipes.get(member, ()))


def pick_distractors(catalog: Catalog, tree: list[Recipe], rng: random.Random, count: int) -> list[str]:
    """Commands of up to ``count`` recipes sharing ingredients with ``tree`` but not in it."""
    tree_commands = {recipe.command() for recipe in tree}
    candidates: set[str] = set()
    for name in sorted({ingredient.name for recipe in tree for ingredient in recipe.ingredients}):
        uses = catalog.uses.get(name, ())
        candidates.update(recipe.command() for recipe in rng.sample(uses, min(len(uses), USES_SAMPLED)))
    pool = sorted(candidates - tree_commands)
    return rng.sample(pool, min(count, len(pool)))


def crafting_commands(catalog: Catalog, goal: str, rng: random.Random, num_distractors: int) -> list[str]:
    """The goal's tree commands and the distractors, shuffled."""
    tree = recipe_tree(catalog.book, goal)
    commands = list(dict.fromkeys(recipe.command() for recipe in tree))
    commands += pick_distractors(catalog, tree, rng, num_distractors)
    rng.shuffle(commands)
    return commands


def task_observation(commands: list[str], goal_item: str) -> str:
    """What AgentGym's TextCraft server shows first: the crafting commands, then the goal."""
    return "Crafting commands:\n" + "\n".join(commands) + f"\n\nGoal: craft {display_name(goal_item)}."
