"""A scripted policy that solves the offline tasks through the env's own interface.

It reads each observation as an agent would (finds elements by role and name in the
accessibility tree, reads answers off the page) and replies with one WebArena action, so a
solved task shows the task is solvable and its evaluator agrees with the pages. One plan per
task family (offline_tasks.py); a plan is a generator that receives observations and yields
actions. Used by the tests and by tests/bench/webnav_bench.py.

    policy = ScriptedPolicy(task_id)
    reply = policy.act(observation)    # "... ```click [12]```", until it says stop [...]
"""

from __future__ import annotations

import re
from typing import Any, Callable, Generator

from envhub.envs.webnav.offline_tasks import FAMILIES, INSTANCES, instantiation

Plan = Generator[str, str, None]
MAX_SCROLLS = 6


def element_id(observation: str, role: str, name: str) -> int | None:
    """Id of the first element with this role and exact name in the observation, or None."""
    found = re.search(rf"\[(\d+)\] {re.escape(role)} {re.escape(repr(name))}", observation)
    return int(found.group(1)) if found else None


def read(observation: str, pattern: str) -> str:
    found = re.search(pattern, observation)
    if found is None:
        raise LookupError(f"scripted policy: {pattern!r} not on the page:\n{observation[-3000:]}")
    return found.group(1)


def seek(observation: str, role: str, name: str) -> Generator[str, str, tuple[int, str]]:
    """Scroll down until the element shows; returns its id and the observation showing it."""
    for _ in range(MAX_SCROLLS):
        found = element_id(observation, role, name)
        if found is not None:
            return found, observation
        observation = yield "scroll [down]"
    raise LookupError(f"scripted policy: no {role} {name!r} after {MAX_SCROLLS} scrolls:\n{observation[-3000:]}")


def click(observation: str, role: str, name: str) -> Generator[str, str, str]:
    found, observation = yield from seek(observation, role, name)
    return (yield f"click [{found}]")


def type_into(observation: str, role: str, name: str, text: Any, enter: bool) -> Generator[str, str, str]:
    found, observation = yield from seek(observation, role, name)
    return (yield f"type [{found}] [{text}] [{int(enter)}]")


def clear_field(observation: str, role: str, name: str) -> Generator[str, str, str]:
    """Empty a prefilled field: WebArena's type (the agentgym dialect's) clicks it and types, keeping its text."""
    observation = yield from click(observation, role, name)
    observation = yield "press [Control+a]"
    return (yield "press [Backspace]")


def search_product(observation: str, product: str) -> Generator[str, str, str]:
    observation = yield from type_into(observation, "searchbox", "Search products", product, enter=True)
    return (yield from click(observation, "link", product))


def open_post(observation: str, forum: str, title: str) -> Generator[str, str, str]:
    observation = yield from click(observation, "link", f"f/{forum}")
    return (yield from click(observation, "link", title))


def shop_price(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from search_product(observation, args["product"])
    price = read(observation, r"Price: (\$[0-9,.]+)")
    yield f"stop [{price}]"


def shop_category_count(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from click(observation, "link", args["category"])
    count = read(observation, r"(\d+) items")
    yield f"stop [{count}]"


def shop_search(observation: str, args: dict[str, Any]) -> Plan:
    yield from type_into(observation, "searchbox", "Search products", args["query"], enter=True)
    yield "stop []"


def shop_product_page(observation: str, args: dict[str, Any]) -> Plan:
    yield from search_product(observation, args["product"])
    yield "stop []"


def add_to_cart(observation: str, args: dict[str, Any]) -> Generator[str, str, str]:
    observation = yield from search_product(observation, args["product"])
    observation = yield from clear_field(observation, "spinbutton", "Qty")
    observation = yield from type_into(observation, "spinbutton", "Qty", args["qty"], enter=False)
    return (yield from click(observation, "button", "Add to Cart"))


def shop_cart(observation: str, args: dict[str, Any]) -> Plan:
    yield from add_to_cart(observation, args)
    yield "stop []"


def shop_order(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from add_to_cart(observation, args)
    observation = yield from click(observation, "link", "Proceed to Checkout")
    if args["shipping"] == "express":
        observation = yield from click(observation, "radio", "Express shipping ($15.00)")
    yield from click(observation, "button", "Place Order")
    yield "stop []"


def shop_order_status(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from click(observation, "link", "My Orders")
    observation = yield from click(observation, "link", f"View order #{args['order']}")
    status = read(observation, r"Status: (\w+)")
    yield f"stop [{status}]"


def shop_unanswerable(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from type_into(observation, "searchbox", "Search products", args["product"], enter=True)
    read(observation, r"StaticText '(0) results'")
    yield "stop [N/A]"


def admin_customer_orders(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from click(observation, "link", "Customers")
    observation = yield from click(observation, "link", args["customer"])
    count = read(observation, r"Orders placed: (\d+)")
    yield f"stop [{count}]"


def admin_status_count(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from click(observation, "link", "Orders")
    observation = yield from click(observation, "link", args["status"].title())
    count = read(observation, r"(\d+) orders")
    yield f"stop [{count}]"


def admin_order_status(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from click(observation, "link", "Orders")
    observation = yield from click(observation, "link", f"#{args['order']}")
    status = read(observation, r"\[(\d+)\] combobox 'Status'")
    observation = yield f"type [{status}] [{args['status'].title()}] [0]"
    yield from click(observation, "button", "Update Status")
    yield "stop []"


def admin_price(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from click(observation, "link", "Products")
    observation = yield from click(observation, "link", args["product"])
    observation = yield from clear_field(observation, "textbox", "Price")
    observation = yield from type_into(observation, "textbox", "Price", args["price"].lstrip("$"), enter=False)
    yield from click(observation, "button", "Save Product")
    yield "stop []"


def forum_author(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from open_post(observation, args["forum"], args["title"])
    author = read(observation, r"StaticText 'Submitted by'\s+\[\d+\] link '([^']+)'")
    yield f"stop [{author}]"


def forum_comment_count(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from open_post(observation, args["forum"], args["title"])
    count = read(observation, r"heading '(\d+) comments'")
    yield f"stop [{count}]"


def forum_open_post(observation: str, args: dict[str, Any]) -> Plan:
    yield from open_post(observation, args["forum"], args["title"])
    yield "stop []"


def forum_submit(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from click(observation, "link", f"f/{args['forum']}")
    observation = yield from click(observation, "link", "Submit a new post")
    observation = yield from type_into(observation, "textbox", "Title", args["title"], enter=False)
    observation = yield from type_into(observation, "textbox", "Body", args["body"], enter=False)
    yield from click(observation, "button", "Create submission")
    yield "stop []"


def forum_comment(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from open_post(observation, args["forum"], args["title"])
    observation = yield from type_into(observation, "textbox", "Comment", args["text"], enter=False)
    yield from click(observation, "button", "Post Comment")
    yield "stop []"


def forum_upvote(observation: str, args: dict[str, Any]) -> Plan:
    observation = yield from open_post(observation, args["forum"], args["title"])
    yield from click(observation, "button", "Upvote")
    yield "stop []"


PLANS: dict[str, Callable[[str, dict[str, Any]], Plan]] = {plan.__name__: plan for plan in (
    shop_price, shop_category_count, shop_search, shop_product_page, shop_cart, shop_order, shop_order_status,
    shop_unanswerable, admin_customer_orders, admin_status_count, admin_order_status, admin_price, forum_author,
    forum_comment_count, forum_open_post, forum_submit, forum_comment, forum_upvote)}
assert set(PLANS) == {family.__name__ for family in FAMILIES}, "every offline task family needs a plan"


class ScriptedPolicy:
    """Solves offline task `task_id`: `act(observation)` returns the next reply, the action inside
    triple backticks as AgentGym's WebArena client requires (the lenient dialect reads it too)."""

    def __init__(self, task_id: int) -> None:
        self.family = FAMILIES[task_id // INSTANCES].__name__
        self._args = instantiation(task_id)
        self._plan: Plan | None = None

    def act(self, observation: str) -> str:
        return f"In summary, the next action I will perform is ```{self.next_action(observation)}```"

    def next_action(self, observation: str) -> str:
        """The next action alone, in WebArena's grammar."""
        if self._plan is None:
            self._plan = PLANS[self.family](observation, self._args)
            return next(self._plan)
        return self._plan.send(observation)
