"""TextCraft (``textcraft-v0``): craft a Minecraft item from base items by following crafting commands.

Modules, one concern each:
    recipes.py   the in-memory recipe set (items, tags, recipes) and the pruning rules
    datapack.py  loading a vanilla data-pack recipe folder (ADaPT's recipes)
    mcdata.py    the default recipe set, built from the minecraft-data package (tags derived)
    catalog.py   crafting depth, goals in (depth, name) order, splits; cached per recipe set
    tasks.py     the crafting commands one task shows (recipe tree + distractors)
    commands.py  parsing get / craft / inventory actions
    crafting.py  the inventory and the crafting rules
    env.py       the envhub Environment
"""

from envhub.envs.textcraft.env import TextCraftEnv

__all__ = ["TextCraftEnv"]
