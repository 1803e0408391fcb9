"""One TextCraft episode as AgentGym's client and server play it (agentgym dialect of ``textcraft-v0``).

Client (agentenv/agentenv/envs/textcraft.py, ``TextCraftEnvClient.step``): the reply's ``Action:``
lines are found; two or more answer an error without reaching the server; the last (only) one,
or "" when there is none, loses every character outside ``[A-Za-z0-9, ]`` (removed, not spaced)
and has its whitespace collapsed. Server (agentenv_textcraft/environment.py, ``TextCraftEnv.step``):
case-sensitive prefix matches of ``craft X using Y``, ``get N X`` and ``inventory``; every failure
is an observation (its texts, item ids and Python reprs included, are AgentGym's word for word);
reward 1 and done once the goal item is crafted, else 0. A server error ends the episode unwon, as
it does under AgentGym-RL (its rollout catches the client's failure: score 0, done).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envhub.envs.agentgym_protocol.replies import ONE_ACTION_ONLY, single_line_client_action
from envhub.envs.textcraft.agentgym_tree import NAMESPACE, AgentGymTree, TreeRecipe, display

CRAFT = re.compile(r"craft (.*) using (.*)")
GET = re.compile(r"get ([0-9]+) (.*)")
INVENTORY = re.compile(r"inventory")
COUNTED = re.compile(r"([0-9]+) (.*)")
TOO_MANY_ACTIONS = ONE_ACTION_ONLY
client_action = single_line_client_action
"""The action text AgentGym's client sends for a reply; None when it refuses the reply itself."""


@dataclass(frozen=True)
class Named:
    """AgentGym's ``ItemTag`` of a name the agent wrote: a tag when the tree knows it as one."""

    name: str
    is_tag: bool

    def __repr__(self) -> str:  # the repr AgentGym's "Could not find a valid recipe" message prints
        tag, item = (repr(self.name), None) if self.is_tag else (None, repr(self.name))
        return f"ItemTag(tag={tag}, item_id={item})"

    @property
    def item_id(self) -> str | None:
        return None if self.is_tag else self.name


@dataclass(frozen=True)
class Counted:
    named: Named
    count: int

    def __repr__(self) -> str:
        return f"ItemTagWithCount(item_tag={self.named!r}, count={self.count})"


class ActionFailed(Exception):
    """The server's refusal; its message is the observation."""


@dataclass(frozen=True)
class Outcome:
    """What the server answers to one action, and how the action fared."""

    observation: str
    reward: int
    done: bool
    parsed: bool
    """The action fit one of the three commands."""
    valid: bool
    """The server carried it out."""


class AgentGymGame:
    """The inventory of one episode and the server's three commands over one tree."""

    def __init__(self, tree: AgentGymTree, goal: str) -> None:
        self.tree = tree
        self.goal = goal
        self.inventory: dict[str, int] = {}

    def step(self, action: str) -> Outcome:
        """The server's answer to an action text the client sent (``TextCraftEnv.step``)."""
        craft, get = CRAFT.match(action), GET.match(action)
        try:
            if craft:
                return self._craft(craft.group(1), craft.group(2))
            if get:
                return self._get(_count(get.group(1)), get.group(2))
            if INVENTORY.match(action):
                return Outcome(self.describe_inventory(), 0, False, True, True)
            raise ActionFailed(f"Could not execute {action}")
        except ActionFailed as failure:
            return Outcome(str(failure), 0, False, bool(craft or get), False)
        except ServerFailed as error:
            return Outcome(str(error), 0, True, True, False)

    def describe_inventory(self) -> str:
        listed = "".join(f"[{display(item)}] ({count}) " for item, count in self.inventory.items())
        return "Inventory: " + (listed or "You are not carrying anything.")

    def _named(self, text: str) -> Named:
        name = NAMESPACE + text.replace(" ", "_")
        return Named(name, name in self.tree.tags)

    def _get(self, count: int, text: str) -> Outcome:
        named = self._named(text)
        if self.tree.is_craftable(named.name) or named.is_tag or named.name not in self.tree.item_ids:
            raise ActionFailed(f"Could not find {text}")
        self.inventory[named.name] = self.inventory.get(named.name, 0) + count
        won = named.name == self.goal
        return Outcome(f"Got {count} {text}", int(won), won, True, True)

    def _craft(self, output_text: str, inputs_text: str) -> Outcome:
        counted = COUNTED.match(output_text)
        output = Counted(self._named(counted.group(2)), _count(counted.group(1))) if counted else \
            Counted(self._named(output_text), 1)
        inputs = [self._counted_input(written.strip()) for written in inputs_text.split(",")]
        if not all(part.named.item_id is not None and self.inventory.get(part.named.name, -1) >= part.count
                   for part in inputs):
            raise ActionFailed(f"Could not find enough items to craft {output.named.item_id}")
        recipe = self._matching_recipe(output, inputs)
        if recipe is None:
            raise ActionFailed(f"Could not find a valid recipe for {output!r}")
        for part in inputs:
            # Two written inputs naming one item, both matched (a tag and an item ingredient of one
            # recipe): the first takes it, the second is the server's KeyError.
            if part.named.name not in self.inventory:
                raise ServerFailed(repr(part.named.name))
            self.inventory[part.named.name] -= part.count
            if self.inventory[part.named.name] == 0:
                del self.inventory[part.named.name]
        self.inventory[recipe.output] = self.inventory.get(recipe.output, 0) + recipe.count
        won = recipe.output == self.goal
        return Outcome(f"Crafted {recipe.count} {recipe.output}", int(won), won, True, True)

    def _counted_input(self, written: str) -> Counted:
        counted = COUNTED.match(written)
        if counted is None:
            raise ActionFailed(f"Wrong item format: {written}")
        return Counted(self._named(counted.group(2)), _count(counted.group(1)))

    def _matching_recipe(self, output: Counted, inputs: list[Counted]) -> TreeRecipe | None:
        """The first recipe of the output whose every ingredient meets one written input with its exact
        count, leaving none over (``CraftingTree.craft``); a tag ingredient takes its group's members."""
        for recipe in self.tree.item_recipes.get(output.named.item_id or "", ()):
            unused = list(inputs)
            for part in recipe.inputs:
                match = next((written for written in unused if self._fits(part.name, part.is_tag, written.named)), None)
                if match is None or match.count != part.count:
                    break
                unused.remove(match)
            else:
                if not unused:
                    return recipe
        return None

    def _fits(self, name: str, is_tag: bool, written: Named) -> bool:
        if not is_tag:
            return written.item_id == name
        return (written.is_tag and written.name == name) or self.tree.tag_of_item.get(written.item_id or "") == name


class ServerFailed(Exception):
    """Where AgentGym's server raises (a count past Python's 4300-digit int limit, an ingredient written
    twice): it answers {"error": ...}, its client then fails reading the observation, and AgentGym-RL
    ends the episode with score 0. So do we."""


def _count(digits: str) -> int:
    try:
        return int(digits)
    except ValueError as error:  # only past the int-digit limit: the patterns admit digits alone
        raise ServerFailed(str(error)) from None


def first_observation(commands: list[str], goal: str) -> str:
    """``reset``'s observation: the crafting commands, then the goal."""
    return "Crafting commands:\n{}\n\nGoal: craft {}.".format("\n".join(commands), display(goal))
