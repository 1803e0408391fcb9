"""Scripted ``textcraft-v0`` episodes with AgentGym's answers (see envhub/fidelity.py).

Expected texts come from reading AgentGym's code: the server's ``TextCraftEnv.step``
(agentenv-textcraft/agentenv_textcraft/environment.py: "Got ...", "Crafted {count} {item_id}",
"Could not find ...", the ``ItemTagWithCount`` repr, "Inventory: [..] (n) ") and the client's
``TextCraftEnvClient.step`` (agentenv/agentenv/envs/textcraft.py: Action-line extraction, character
stripping, the two-actions error). Task ids are those of the default recipes under the agentgym
dialect: 0 = acacia planks, 183 = crafting table (AgentGym's order, recipe files in ``ls`` order).
"""

from __future__ import annotations

from envhub.fidelity import ExpectedStep, FidelityCase

SERVER = "agentenv-textcraft/agentenv_textcraft/environment.py TextCraftEnv.step"
CLIENT = "agentenv/agentenv/envs/textcraft.py TextCraftEnvClient.step"
ACACIA_PLANKS, CRAFTING_TABLE = "0", "183"


def reply(action: str) -> str:
    """A reply in the format AgentGym's instruction asks for."""
    return f"Thought:\nNext step.\n\nAction:\n{action}"


def fidelity_cases() -> list[FidelityCase]:
    return [_win_from_logs(), _win_through_a_tag(), _refusals(), _client_parsing()]


def _win_from_logs() -> FidelityCase:
    return FidelityCase(
        name="acacia planks from the acacia logs item (a tag with no craftable member is an item)",
        task_id=ACACIA_PLANKS, source=f"{SERVER}; crafting_tree.py clean_up_recipes",
        first_observation_contains=("Crafting commands:\ncraft 4 acacia planks using 1 acacia logs",
                                    "\n\nGoal: craft acacia planks."),
        steps=(
            ExpectedStep(reply("get 1 acacia logs"), observation="Got 1 acacia logs", score=0.0, done=False),
            ExpectedStep(reply("craft 4 acacia planks using 1 acacia logs"),
                         observation="Crafted 4 minecraft:acacia_planks", score=1.0, done=True),
        ),
        success=True)


def _win_through_a_tag() -> FidelityCase:
    return FidelityCase(
        name="crafting table from oak planks where the recipe asks for the planks group",
        task_id=CRAFTING_TABLE, source=f"{SERVER}; crafting_tree.py CraftingTree.craft, find_matching_item",
        first_observation_contains=("craft 1 crafting table using 4 planks", "Goal: craft crafting table."),
        steps=(
            ExpectedStep(reply("get 1 oak logs"), observation="Got 1 oak logs", score=0.0, done=False),
            ExpectedStep(reply("craft 4 oak planks using 1 oak logs"), observation="Crafted 4 minecraft:oak_planks",
                         score=0.0, done=False),
            ExpectedStep(reply("inventory"), observation="Inventory: [oak planks] (4) ", score=0.0, done=False),
            ExpectedStep(reply("craft 1 crafting table using 4 oak planks"),
                         observation="Crafted 1 minecraft:crafting_table", score=1.0, done=True),
        ),
        success=True)


def _refusals() -> FidelityCase:
    recipe_repr = "ItemTagWithCount(item_tag=ItemTag(tag=None, item_id='minecraft:acacia_planks'), count=4)"
    return FidelityCase(
        name="the server's refusals: crafted and unknown items, missing items, wrong counts, groups",
        task_id=ACACIA_PLANKS, source=SERVER,
        steps=(
            ExpectedStep(reply("inventory"), observation="Inventory: You are not carrying anything.", score=0.0),
            ExpectedStep(reply("get 1 acacia planks"), observation="Could not find acacia planks", score=0.0),
            ExpectedStep(reply("get 1 planks"), observation="Could not find planks", score=0.0),
            ExpectedStep(reply("get 1 acacia log"), observation="Got 1 acacia log", score=0.0),
            ExpectedStep(reply("craft 4 acacia planks using 1 acacia logs"),
                         observation="Could not find enough items to craft minecraft:acacia_planks", score=0.0),
            ExpectedStep(reply("craft 4 planks using 1 acacia logs"),
                         observation="Could not find enough items to craft None", score=0.0),
            ExpectedStep(reply("get 2 acacia logs"), observation="Got 2 acacia logs", score=0.0),
            ExpectedStep(reply("craft 4 acacia planks using 2 acacia logs"),
                         observation=f"Could not find a valid recipe for {recipe_repr}", score=0.0, done=False),
            ExpectedStep(reply("craft 4 planks using 2 acacia logs"), observation=(
                "Could not find a valid recipe for ItemTagWithCount(item_tag=ItemTag(tag='minecraft:planks', "
                "item_id=None), count=4)"), score=0.0),
            ExpectedStep(reply("craft 4 acacia planks using acacia logs"),
                         observation="Wrong item format: acacia logs", score=0.0),
            ExpectedStep(reply("inventory"), observation="Inventory: [acacia log] (1) [acacia logs] (2) ",
                         score=0.0, done=False),
        ))


def _client_parsing() -> FidelityCase:
    return FidelityCase(
        name="the client: case, stripped characters, a missing or a second Action line",
        task_id=ACACIA_PLANKS, source=CLIENT,
        steps=(
            ExpectedStep(reply("Get 1 acacia logs"), observation="Could not execute Get 1 acacia logs", score=0.0),
            ExpectedStep("Thought:\nI will get logs.", observation="Could not execute ", score=0.0, done=False),
            ExpectedStep(reply("get 1 minecraft:acacia_logs"), observation="Could not find minecraftacacialogs"),
            ExpectedStep(reply("get 1 acacia logs.") + "\nAction:\ninventory",
                         observation="Error: Only one 'Action' is allowed per response. Please adjust your response.",
                         score=0.0, done=False),
            ExpectedStep(reply("get  1   acacia logs!!"), observation="Got 1 acacia logs", score=0.0),
            ExpectedStep(reply("inventory please"), observation="Inventory: [acacia logs] (1) ", score=0.0),
            ExpectedStep(reply("craft 4 acacia planks using 1 acacia logs"),
                         observation="Crafted 4 minecraft:acacia_planks", score=1.0, done=True),
        ),
        success=True)
