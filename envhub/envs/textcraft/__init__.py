"""TextCraft (``textcraft-v0``): craft a Minecraft item from base items by following crafting commands.

Modules, one concern each. The default ``agentgym`` dialect (AgentGym's TextCraft, exactly):
    pack.py           one data-pack recipe file as AgentGym reads it; reading a folder in ``ls`` order
    pack_mcdata.py    AgentGym's recipe files rebuilt from minecraft-data, with pack_tables.py (what it lacks)
    agentgym_tree.py  AgentGym's crafting tree: items, tags, kept recipes, goals, crafting commands
    agentgym_game.py  AgentGym's client parsing and server step (observations, reward)
    fidelity.py       scripted episodes with AgentGym's answers
The ``lenient`` dialect:
    recipes.py   the in-memory recipe set (items, tags, recipes) and the pruning rules
    datapack.py  loading a vanilla data-pack recipe folder (ADaPT's recipes)
    mcdata.py    the default recipe set, built from the minecraft-data package (tags derived)
    catalog.py   crafting depth, goals in (depth, name) order, splits; cached per recipe set
    tasks.py     the crafting commands one task shows (recipe tree + distractors)
    commands.py  parsing get / craft / inventory actions
    crafting.py  the inventory and the crafting rules
    example.py   the worked example of the conversation start (both dialects)
    env.py       the envhub Environment (both dialects)
"""

from envhub.envs.textcraft.env import TextCraftEnv

__all__ = ["TextCraftEnv"]
