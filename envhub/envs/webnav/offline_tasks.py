"""The built-in tasks on envhub's offline sites, in WebArena's task format.

18 families x 4 instances = 72 tasks; reference answers are computed from the sites' seed data
(envhub/sites/data.py), so they always match what the pages show. The 4th instance of every
family is in the ``test`` split, the others in ``train``. Families by evaluator:
string_match (exact, must_include, N/A), url_match, program_html (page checks, including
WebArena's ``reddit_get_post_url`` helper) and site_state (the session's database).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from envhub.envs.webnav.tasks import WebTask, task_from_json
from envhub.sites.data import CATEGORIES, CUSTOMERS, SESSION_CUSTOMER_ID, SESSION_USER, dollars, seed_data

INSTANCES = 4
SHOP, ADMIN, FORUM = "__SHOPPING__", "__SHOPPING_ADMIN__", "__REDDIT__"
FIRST_NEW_ORDER = max(order.id for order in seed_data().orders) + 1
Instance = dict[str, Any]


def _string(answers: dict[str, Any]) -> dict[str, Any]:
    return {"eval_types": ["string_match"], "reference_answers": answers}


def _state(*targets: tuple[str, list[Any], str]) -> dict[str, Any]:
    return {"eval_types": ["site_state"], "site_state": [
        {"query": query, "params": params, "required_contents": {"exact_match": expected}}
        for query, params, expected in targets]}


def shop_price(index: int) -> Instance:
    product = seed_data().products[(0, 9, 17, 27)[index]]
    return {"intent": f"What is the price of the {product.name} in the shop?", "sites": ["shopping"], "start_url": SHOP,
            "eval": _string({"must_include": [dollars(product.price_cents)[1:]]}), "args": {"product": product.name}}


def shop_category_count(index: int) -> Instance:
    slug = ("electronics", "kitchen", "outdoor", "grocery")[index]
    name, products = CATEGORIES[slug]
    return {"intent": f"How many products does the shop list in its {name} category? Answer with a number.",
            "sites": ["shopping"], "start_url": SHOP, "eval": _string({"exact_match": str(len(products))}),
            "args": {"category": name}}


def shop_search(index: int) -> Instance:
    query = ("kettle", "headlamp", "notebook", "honey")[index]
    return {"intent": f'Search the shop for "{query}".', "sites": ["shopping"], "start_url": SHOP,
            "eval": {"eval_types": ["url_match"], "reference_url": f"{SHOP}/search?q={query}"},
            "args": {"query": query}}


def shop_product_page(index: int) -> Instance:
    product = seed_data().products[(3, 12, 21, 30)[index]]
    return {"intent": f"Open the product page of the {product.name}.", "sites": ["shopping"], "start_url": SHOP,
            "eval": {"eval_types": ["url_match"], "reference_url": f"{SHOP}/product/{product.sku}"},
            "args": {"product": product.name}}


def shop_cart(index: int) -> Instance:
    product, qty = seed_data().products[(1, 10, 19, 28)[index]], (2, 3, 1, 2)[index]
    locator = f"document.querySelector('tr[data-sku=\"{product.sku}\"] .qty').innerText"
    return {"intent": f"Add {qty} of the {product.name} to my shopping cart.", "sites": ["shopping"], "start_url": SHOP,
            "eval": {"eval_types": ["program_html"], "program_html": [
                {"url": f"{SHOP}/cart", "locator": locator, "required_contents": {"exact_match": str(qty)}}]},
            "args": {"product": product.name, "qty": qty}}


def shop_order(index: int) -> Instance:
    product, qty = seed_data().products[(4, 13, 22, 31)[index]], (1, 2, 1, 3)[index]
    shipping = ("standard", "express", "express", "standard")[index]
    return {"intent": f"Buy {qty} of the {product.name} with {shipping} shipping.", "sites": ["shopping"],
            "start_url": SHOP, "eval": _state(
                ("SELECT COUNT(*) FROM orders WHERE id >= ?", [FIRST_NEW_ORDER], "1"),
                ("SELECT i.qty, o.shipping FROM orders o JOIN order_items i ON i.order_id = o.id WHERE o.id >= ?",
                 [FIRST_NEW_ORDER], f"{qty} | {shipping}")),
            "args": {"product": product.name, "qty": qty, "shipping": shipping}}


def shop_order_status(index: int) -> Instance:
    order = [o for o in seed_data().orders if o.customer_id == SESSION_CUSTOMER_ID][index]
    return {"intent": f"What is the status of my order #{order.id}? Answer with the status only.",
            "sites": ["shopping"], "start_url": SHOP, "eval": _string({"exact_match": order.status}),
            "args": {"order": order.id}}


def admin_customer_orders(index: int) -> Instance:
    customer_id = (2, 5, 7, 12)[index]
    count = sum(order.customer_id == customer_id for order in seed_data().orders)
    name = CUSTOMERS[customer_id - 1][0]
    return {"intent": f"How many orders has the customer {name} placed? Answer with a number.",
            "sites": ["shopping_admin"], "start_url": ADMIN, "eval": _string({"exact_match": str(count)}),
            "args": {"customer": name}}


def admin_status_count(index: int) -> Instance:
    status = ("pending", "shipped", "complete", "canceled")[index]
    count = sum(order.status == status for order in seed_data().orders)
    return {"intent": f'How many orders have the status "{status}" in the shop admin? Answer with a number.',
            "sites": ["shopping_admin"], "start_url": ADMIN, "eval": _string({"exact_match": str(count)}),
            "args": {"status": status}}


def admin_order_status(index: int) -> Instance:
    order = seed_data().orders[(2, 11, 24, 36)[index]]
    new_status = next(s for s in ("canceled", "complete", "shipped") if s != order.status)
    return {"intent": f'In the shop admin, change the status of order #{order.id} to "{new_status}".',
            "sites": ["shopping_admin"], "start_url": ADMIN,
            "eval": _state(("SELECT status FROM orders WHERE id = ?", [order.id], new_status)),
            "args": {"order": order.id, "status": new_status}}


def admin_price(index: int) -> Instance:
    product = seed_data().products[(5, 14, 23, 32)[index]]
    new_price = dollars(max(100, product.price_cents // 100 * 100 - 300) + 49)
    return {"intent": f"In the shop admin, set the price of the {product.name} to {new_price}.",
            "sites": ["shopping_admin", "shopping"], "start_url": ADMIN,
            "eval": {"eval_types": ["program_html"], "program_html": [
                {"url": f"{SHOP}/product/{product.sku}", "locator": "document.querySelector('#price').innerText",
                 "required_contents": {"must_include": [new_price]}}]},
            "args": {"product": product.name, "price": new_price}}


def forum_author(index: int) -> Instance:
    post = seed_data().posts[(0, 6, 12, 18)[index]]
    return {"intent": f'Who submitted the forum post "{post.title}"? Answer with the username.', "sites": ["reddit"],
            "start_url": FORUM, "eval": _string({"exact_match": post.author}),
            "args": {"title": post.title, "forum": post.forum}}


def forum_comment_count(index: int) -> Instance:
    post = seed_data().posts[(1, 7, 13, 19)[index]]
    count = sum(comment.post_id == post.id for comment in seed_data().comments)
    return {"intent": f'How many comments does the post "{post.title}" in f/{post.forum} have? Answer with a number.',
            "sites": ["reddit"], "start_url": FORUM, "eval": _string({"exact_match": str(count)}),
            "args": {"title": post.title, "forum": post.forum}}


def forum_open_post(index: int) -> Instance:
    post = seed_data().posts[(2, 8, 14, 20)[index]]
    return {"intent": f'Open the post "{post.title}" in f/{post.forum}.', "sites": ["reddit"], "start_url": FORUM,
            "eval": {"eval_types": ["url_match"], "reference_url": f"{FORUM}/f/{post.forum}/{post.id}"},
            "args": {"title": post.title, "forum": post.forum}}


SUBMISSIONS = (("books", "My reading goal for next year", "I want to finish 24 books."),
               ("gaming", "Looking for a chess partner", "Anyone up for a weekly online game?"),
               ("cooking", "Best knife for beginners", "Which chef knife should I buy first?"),
               ("hiking", "Rain gear recommendations", "What jacket keeps you dry on long hikes?"))


def forum_submit(index: int) -> Instance:
    forum, title, body = SUBMISSIONS[index]
    return {"intent": f'Submit a post to f/{forum} titled "{title}" with the body "{body}".', "sites": ["reddit"],
            "start_url": FORUM, "eval": {"eval_types": ["program_html"], "program_html": [
                {"url": "func:reddit_get_post_url('__last_url__')",
                 "locator": "document.querySelector('article').innerText",
                 "required_contents": {"must_include": [title, body, SESSION_USER]}},
                {"url": f"{FORUM}/f/{forum}", "locator": "document.querySelector('main').innerText",
                 "required_contents": {"must_include": [title]}}]},
            "args": {"forum": forum, "title": title, "body": body}}


def forum_comment(index: int) -> Instance:
    post = seed_data().posts[(3, 9, 15, 21)[index]]
    text = ("Thanks, this was useful!", "Count me in.", "I will try this tonight.", "Great write-up.")[index]
    return {"intent": f'Reply to the post "{post.title}" in f/{post.forum} with the comment "{text}".',
            "sites": ["reddit"], "start_url": FORUM, "eval": _state(
                ("SELECT COUNT(*) FROM comments WHERE post_id = ? AND author = ? AND body = ?",
                 [post.id, SESSION_USER, text], "1")),
            "args": {"title": post.title, "forum": post.forum, "text": text}}


def forum_upvote(index: int) -> Instance:
    post = seed_data().posts[(4, 10, 16, 22)[index]]
    return {"intent": f'Upvote the post "{post.title}" in f/{post.forum}.', "sites": ["reddit"], "start_url": FORUM,
            "eval": _state(("SELECT direction FROM votes WHERE post_id = ?", [post.id], "1")),
            "args": {"title": post.title, "forum": post.forum}}


def shop_unanswerable(index: int) -> Instance:
    name = ("Solar Powered Toaster", "Titanium Garden Gnome", "Quantum Yoga Mat", "Invisible Umbrella")[index]
    return {"intent": f"What is the price of the {name} in the shop? If the shop does not sell it, answer N/A.",
            "sites": ["shopping"], "start_url": SHOP, "eval": _string({"fuzzy_match": "N/A"}),
            "args": {"product": name}}


FAMILIES: tuple[Callable[[int], Instance], ...] = (
    shop_price, shop_category_count, shop_search, shop_product_page, shop_cart, shop_order, shop_order_status,
    shop_unanswerable, admin_customer_orders, admin_status_count, admin_order_status, admin_price, forum_author,
    forum_comment_count, forum_open_post, forum_submit, forum_comment, forum_upvote)


@functools.cache
def offline_tasks() -> list[WebTask]:
    """Every offline task, task id = family index * 4 + instance."""
    tasks = []
    for family_index, family in enumerate(FAMILIES):
        for index in range(INSTANCES):
            raw = family(index)
            raw.update(task_id=family_index * INSTANCES + index, family=family.__name__,
                       instantiation_dict=raw.pop("args"))
            tasks.append(task_from_json(raw, "offline_tasks"))
    return tasks


def offline_test_ids() -> set[int]:
    return {family_index * INSTANCES + INSTANCES - 1 for family_index in range(len(FAMILIES))}


def instantiation(task_id: int) -> dict[str, Any]:
    """The values an offline task was built from (for scripted solutions)."""
    family = FAMILIES[task_id // INSTANCES]
    return family(task_id % INSTANCES)["args"]
