"""What the vanilla 1.16 data pack says about its crafting recipes that minecraft-data does not.

Used by pack_mcdata.py to rebuild AgentGym's recipe files (ADaPT's copy of the data pack).
Names are ids without namespace; a recipe is told apart by (output, sorted ingredient names).
Every entry was read off ADaPT's files; tests/test_fidelity_textcraft.py compares the rebuilt
recipes with those files whenever they are at hand, so a wrong or missing entry fails there.
"""

from __future__ import annotations

WOODS = ("oak", "spruce", "birch", "jungle", "acacia", "dark_oak", "crimson", "warped")
COLORS = ("white", "orange", "magenta", "light_blue", "yellow", "lime", "pink", "gray", "light_gray", "cyan",
          "purple", "blue", "brown", "green", "red", "black")

WOOD_FAMILIES = (
    ("_fence_gate", "wooden_fence_gate"), ("_pressure_plate", "wooden_pressure_plate"), ("_planks", "planks"),
    ("_button", "wooden_button"), ("_door", "wooden_door"), ("_fence", "wooden_fence"), ("_sign", "sign"),
    ("_slab", "wooden_slab"), ("_stairs", "wooden_stairs"), ("_trapdoor", "wooden_trapdoor"), ("_boat", "boat"),
    ("_wood", "bark"), ("_hyphae", "bark"),
)
"""(suffix of ``<wood><suffix>`` or ``stripped_<wood><suffix>``, group) for the wooden families."""

COLOR_FAMILIES = (
    ("_stained_glass_pane", "stained_glass_pane"), ("_stained_glass", "stained_glass"),
    ("_concrete_powder", "concrete_powder"), ("_terracotta", "stained_terracotta"), ("_banner", "banner"),
    ("_carpet", "carpet"),
)
"""(suffix of ``<color><suffix>``, group) for the dyed families (beds and wool: see group_of)."""

OWN_NAME_GROUPS = frozenset({
    "black_dye", "blue_dye", "brown_dye", "light_blue_dye", "light_gray_dye", "magenta_dye", "orange_dye",
    "pink_dye", "red_dye", "white_dye", "yellow_dye", "gold_ingot", "iron_ingot", "netherite_ingot",
    "rabbit_stew", "sugar",
})
"""Items whose every recipe names the item itself as its group (AgentGym then keeps a tag list of that name)."""

OTHER_GROUPS = {"bone_meal": "bonemeal", "stick": "sticks"}

RECOLORED_SOURCES = frozenset({"white_bed", "white_carpet", "glass_pane"})
"""Ingredients of the ``<color>_<x>_from_<source>`` files, which sort after the item's own file."""

FILE_ORDER: dict[str, tuple[tuple[str, ...], ...]] = {
    "black_dye": (("ink_sac",), ("wither_rose",)),
    "blue_dye": (("lapis_lazuli",), ("cornflower",)),
    "light_blue_dye": (("blue_orchid",), ("blue_dye", "white_dye")),
    "light_gray_dye": (("azure_bluet",), ("black_dye", "white_dye"), ("gray_dye", "white_dye"), ("oxeye_daisy",),
                       ("white_tulip",)),
    "magenta_dye": (("allium",), ("blue_dye", "pink_dye", "red_dye"), ("blue_dye", "red_dye", "white_dye"), ("lilac",),
                    ("pink_dye", "purple_dye")),
    "orange_dye": (("orange_tulip",), ("red_dye", "yellow_dye")),
    "pink_dye": (("peony",), ("pink_tulip",), ("red_dye", "white_dye")),
    "rabbit_stew": (("baked_potato", "bowl", "brown_mushroom", "carrot", "cooked_rabbit"),
                    ("baked_potato", "bowl", "carrot", "cooked_rabbit", "red_mushroom")),
    "red_dye": (("beetroot",), ("poppy",), ("rose_bush",), ("red_tulip",)),
    "stick": (("planks",), ("bamboo",)),
    "sugar": (("honey_bottle",), ("sugar_cane",)),  # after sugar.json, the ungrouped duplicate
    "white_dye": (("bone_meal",), ("lily_of_the_valley",)),
    "yellow_dye": (("dandelion",), ("sunflower",)),
}
"""Items with several (non-recoloring) recipes: their ingredient names in file-name order. The order
of an item's recipes decides which distractors a task draws, through AgentGym's seeded sampling."""


def group_of(output: str, ingredients: tuple[str, ...]) -> str | None:
    """The recipe-book group of a recipe of ``output`` made from ``ingredients``."""
    if output in OWN_NAME_GROUPS:
        return output
    if output in OTHER_GROUPS:
        return OTHER_GROUPS[output]
    wood_kind = output.removeprefix("stripped_")
    for suffix, group in WOOD_FAMILIES:
        if wood_kind.endswith(suffix) and wood_kind[:-len(suffix)] in WOODS:
            return group
    for suffix, group in COLOR_FAMILIES:
        if output.endswith(suffix) and output[:-len(suffix)] in COLORS:
            return group
    if output.endswith("_bed") and output[:-len("_bed")] in COLORS:
        return "dyed_bed" if "white_bed" in ingredients else "bed"
    if output.endswith("_wool") and any(name.endswith("_dye") for name in ingredients):
        return "wool"  # white wool from string has no group
    return None


COAL_ALTERNATIVES = frozenset({"torch", "soul_torch", "fire_charge"})
"""Recipes whose file lists ``[coal, charcoal]`` as alternatives (AgentGym reads coal) where minecraft-data
shows the tag ``coals`` (which the campfire's file does use)."""

ALTERNATIVES_DROPPED = frozenset({
    ("purpur_slab", ("purpur_pillar",)), ("purpur_stairs", ("purpur_pillar",)),
    ("quartz_slab", ("quartz_block",)), ("quartz_slab", ("quartz_pillar",)),
    ("quartz_stairs", ("quartz_block",)), ("quartz_stairs", ("quartz_pillar",)),
    ("red_sandstone_slab", ("chiseled_red_sandstone",)), ("red_sandstone_stairs", ("chiseled_red_sandstone",)),
    ("red_sandstone_stairs", ("cut_red_sandstone",)), ("sandstone_slab", ("chiseled_sandstone",)),
    ("sandstone_stairs", ("chiseled_sandstone",)), ("sandstone_stairs", ("cut_sandstone",)),
    ("tnt", ("gunpowder", "red_sand")),
})
"""minecraft-data recipes that are a later alternative within one data-pack file (AgentGym reads the first)."""

UNGROUPED_DUPLICATES = frozenset({("sugar", ("sugar_cane",))})
"""Recipes the data pack holds twice, the second file without a group (sugar.json, sugar_from_sugar_cane.json)."""

KEY_ORDER: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {
    ('acacia_fence', ('acacia_planks', 'stick')): ('stick', 'acacia_planks'),
    ('activator_rail', ('iron_ingot', 'redstone_torch', 'stick')): ('redstone_torch', 'stick', 'iron_ingot'),
    ('arrow', ('feather', 'flint', 'stick')): ('stick', 'flint', 'feather'),
    ('beacon', ('glass', 'nether_star', 'obsidian')): ('nether_star', 'glass', 'obsidian'),
    ('birch_fence', ('birch_planks', 'stick')): ('stick', 'birch_planks'),
    ('blast_furnace', ('furnace', 'iron_ingot', 'smooth_stone')): ('smooth_stone', 'furnace', 'iron_ingot'),
    ('cake', ('egg', 'milk_bucket', 'sugar', 'wheat')): ('milk_bucket', 'sugar', 'wheat', 'egg'),
    ('campfire', ('coals', 'logs', 'stick')): ('logs', 'stick', 'coals'),
    ('cartography_table', ('paper', 'planks')): ('planks', 'paper'),
    ('chain', ('iron_ingot', 'iron_nugget')): ('iron_ingot', 'iron_nugget'),
    ('crimson_fence', ('crimson_planks', 'stick')): ('stick', 'crimson_planks'),
    ('crossbow', ('iron_ingot', 'stick', 'string', 'tripwire_hook')):
        ('string', 'stick', 'iron_ingot', 'tripwire_hook'),
    ('dark_oak_fence', ('dark_oak_planks', 'stick')): ('stick', 'dark_oak_planks'),
    ('daylight_detector', ('glass', 'quartz', 'wooden_slabs')): ('quartz', 'glass', 'wooden_slabs'),
    ('detector_rail', ('iron_ingot', 'redstone', 'stone_pressure_plate')):
        ('redstone', 'stone_pressure_plate', 'iron_ingot'),
    ('diamond_axe', ('diamond', 'stick')): ('stick', 'diamond'),
    ('diamond_hoe', ('diamond', 'stick')): ('stick', 'diamond'),
    ('diamond_pickaxe', ('diamond', 'stick')): ('stick', 'diamond'),
    ('diamond_shovel', ('diamond', 'stick')): ('stick', 'diamond'),
    ('diamond_sword', ('diamond', 'stick')): ('stick', 'diamond'),
    ('diorite', ('cobblestone', 'quartz')): ('quartz', 'cobblestone'),
    ('dispenser', ('bow', 'cobblestone', 'redstone')): ('redstone', 'cobblestone', 'bow'),
    ('dropper', ('cobblestone', 'redstone')): ('redstone', 'cobblestone'),
    ('enchanting_table', ('book', 'diamond', 'obsidian')): ('book', 'obsidian', 'diamond'),
    ('end_crystal', ('ender_eye', 'ghast_tear', 'glass')): ('ghast_tear', 'ender_eye', 'glass'),
    ('end_rod', ('blaze_rod', 'popped_chorus_fruit')): ('popped_chorus_fruit', 'blaze_rod'),
    ('fletching_table', ('flint', 'planks')): ('planks', 'flint'),
    ('golden_axe', ('gold_ingot', 'stick')): ('stick', 'gold_ingot'),
    ('golden_hoe', ('gold_ingot', 'stick')): ('stick', 'gold_ingot'),
    ('golden_pickaxe', ('gold_ingot', 'stick')): ('stick', 'gold_ingot'),
    ('golden_shovel', ('gold_ingot', 'stick')): ('stick', 'gold_ingot'),
    ('golden_sword', ('gold_ingot', 'stick')): ('stick', 'gold_ingot'),
    ('hopper', ('chest', 'iron_ingot')): ('chest', 'iron_ingot'),
    ('iron_axe', ('iron_ingot', 'stick')): ('stick', 'iron_ingot'),
    ('iron_hoe', ('iron_ingot', 'stick')): ('stick', 'iron_ingot'),
    ('iron_pickaxe', ('iron_ingot', 'stick')): ('stick', 'iron_ingot'),
    ('iron_shovel', ('iron_ingot', 'stick')): ('stick', 'iron_ingot'),
    ('iron_sword', ('iron_ingot', 'stick')): ('stick', 'iron_ingot'),
    ('jungle_fence', ('jungle_planks', 'stick')): ('stick', 'jungle_planks'),
    ('lantern', ('iron_nugget', 'torch')): ('torch', 'iron_nugget'),
    ('lever', ('cobblestone', 'stick')): ('cobblestone', 'stick'),
    ('loom', ('planks', 'string')): ('planks', 'string'),
    ('oak_fence', ('oak_planks', 'stick')): ('stick', 'oak_planks'),
    ('observer', ('cobblestone', 'quartz', 'redstone')): ('quartz', 'redstone', 'cobblestone'),
    ('piston', ('cobblestone', 'iron_ingot', 'planks', 'redstone')):
        ('redstone', 'cobblestone', 'planks', 'iron_ingot'),
    ('powered_rail', ('gold_ingot', 'redstone', 'stick')): ('redstone', 'stick', 'gold_ingot'),
    ('rail', ('iron_ingot', 'stick')): ('stick', 'iron_ingot'),
    ('red_nether_bricks', ('nether_brick', 'nether_wart')): ('nether_wart', 'nether_brick'),
    ('redstone_torch', ('redstone', 'stick')): ('stick', 'redstone'),
    ('scaffolding', ('bamboo', 'string')): ('string', 'bamboo'),
    ('shulker_box', ('chest', 'shulker_shell')): ('chest', 'shulker_shell'),
    ('smithing_table', ('iron_ingot', 'planks')): ('planks', 'iron_ingot'),
    ('soul_campfire', ('logs', 'soul_fire_base_blocks', 'stick')): ('logs', 'stick', 'soul_fire_base_blocks'),
    ('soul_lantern', ('iron_nugget', 'soul_torch')): ('soul_torch', 'iron_nugget'),
    ('spruce_fence', ('spruce_planks', 'stick')): ('stick', 'spruce_planks'),
    ('sticky_piston', ('piston', 'slime_ball')): ('piston', 'slime_ball'),
    ('stone_axe', ('stick', 'stone_tool_materials')): ('stick', 'stone_tool_materials'),
    ('stone_hoe', ('stick', 'stone_tool_materials')): ('stick', 'stone_tool_materials'),
    ('stone_pickaxe', ('stick', 'stone_tool_materials')): ('stick', 'stone_tool_materials'),
    ('stone_shovel', ('stick', 'stone_tool_materials')): ('stick', 'stone_tool_materials'),
    ('stone_sword', ('stick', 'stone_tool_materials')): ('stick', 'stone_tool_materials'),
    ('target', ('hay_block', 'redstone')): ('hay_block', 'redstone'),
    ('tnt', ('gunpowder', 'sand')): ('sand', 'gunpowder'),
    ('torch', ('coal', 'stick')): ('stick', 'coal'),
    ('tripwire_hook', ('iron_ingot', 'planks', 'stick')): ('planks', 'stick', 'iron_ingot'),
    ('warped_fence', ('stick', 'warped_planks')): ('stick', 'warped_planks'),
    ('wooden_axe', ('planks', 'stick')): ('stick', 'planks'),
    ('wooden_hoe', ('planks', 'stick')): ('stick', 'planks'),
    ('wooden_pickaxe', ('planks', 'stick')): ('stick', 'planks'),
    ('wooden_shovel', ('planks', 'stick')): ('stick', 'planks'),
    ('wooden_sword', ('planks', 'stick')): ('stick', 'planks'),
}
"""Shaped recipes whose key order (the ingredient order of the crafting command) is not the order in
which the pattern, read row by row, first shows each ingredient."""
