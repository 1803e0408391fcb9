"""The crafting rules over one inventory, as in ADaPT's TextCraft.

- ``get N item`` works only for base items (no recipe); a crafted item or a tag is refused.
- ``craft`` needs the written ingredients in the inventory and must match one recipe of the
  output exactly: every recipe ingredient matched by one written item (the item itself, or any
  member of a tag ingredient) with exactly the recipe's count, and nothing extra. It consumes
  the written ingredients and adds the recipe's yield (the output count written is not checked).
"""

from __future__ import annotations

from envhub.envs.textcraft.commands import Craft, Get
from envhub.envs.textcraft.recipes import Recipe, RecipeBook, display_name

MAX_GET_COUNT = 10_000


class Workbench:
    """An inventory and the get / craft / inventory rules over one RecipeBook."""

    def __init__(self, book: RecipeBook) -> None:
        self.book = book
        self.inventory: dict[str, int] = {}

    def holds(self, item: str) -> bool:
        """True when the inventory has at least one ``item``."""
        return self.inventory.get(item, 0) > 0

    def describe_inventory(self) -> str:
        """``Inventory: [oak planks] (4) [stick] (4)``."""
        if not self.inventory:
            return "Inventory: You are not carrying anything."
        return "Inventory: " + " ".join(f"[{display_name(item)}] ({count})" for item, count in self.inventory.items())

    def get(self, command: Get) -> str:
        """Add a base item, or explain why not."""
        name = display_name(command.item)
        refusal = self._get_refusal(command.item, name)
        if refusal is None and not 1 <= command.count <= MAX_GET_COUNT:
            refusal = f"Could not get {command.count} {name}: the count must be between 1 and {MAX_GET_COUNT}."
        if refusal is not None:
            return refusal
        self.inventory[command.item] = self.inventory.get(command.item, 0) + command.count
        return f"Got {command.count} {name}"

    def _get_refusal(self, item: str, name: str) -> str | None:
        if item in self.book.tags:
            example = display_name(min(self.book.tags[item]))
            return f"Could not find {name}: it is a group of items; get or craft a specific kind, e.g. {example}."
        if item in self.book.recipes:
            return f"Could not find {name}: it is crafted, not gathered; craft it with a crafting command."
        if item not in self.book.items:
            return f"Could not find {name}: there is no such item."
        return None

    def craft(self, command: Craft) -> tuple[str, Recipe | None]:
        """(observation, the recipe used or None when refused)."""
        name = display_name(command.item)
        if command.item not in self.book.recipes:
            known = command.item in self.book.items
            return (f"Could not find a valid recipe for {name}: "
                    + ("it is a base item; get it instead." if known else "there is no such item."), None)
        missing = self._missing(command)
        if missing is not None:
            return f"Could not find enough items to craft {name}: {missing}", None
        recipe = next((recipe for recipe in self.book.recipes[command.item] if self._matches(recipe, command)), None)
        if recipe is None:
            return (f"Could not find a valid recipe for {name}: the ingredients and their counts must match "
                    f"a crafting command exactly (a group such as planks accepts any one kind of it).", None)
        for item, count in command.ingredients:
            self.inventory[item] -= count
            if self.inventory[item] == 0:
                del self.inventory[item]
        self.inventory[recipe.output] = self.inventory.get(recipe.output, 0) + recipe.count
        return f"Crafted {recipe.count} {display_name(recipe.output)}", recipe

    def _missing(self, command: Craft) -> str | None:
        for item, count in command.ingredients:
            if item in self.book.tags:
                example = display_name(min(self.book.tags[item]))
                return f"{display_name(item)} is a group; name the specific kind you hold, e.g. {example}."
            held = self.inventory.get(item, 0)
            if held < count:
                return f"you have {held} {display_name(item)}, the command uses {count}."
        return None

    def _matches(self, recipe: Recipe, command: Craft) -> bool:
        unused = dict(command.ingredients)
        for ingredient in recipe.ingredients:
            exact = ingredient.name if ingredient.name in unused else None
            item = exact or next((item for item in unused if self.book.accepts(ingredient.name, item)), None)
            if item is None or unused.pop(item) != ingredient.count:
                return False
        return not unused
