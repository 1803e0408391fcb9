"""webnav-v0 with WebArena's task files: the loader, the evaluators, the observation, a real episode.

The task files are written here in WebArena's format (``config_files/*.json`` and
``test.raw.json`` with ``__SHOPPING__``-style placeholders). The "deployment" of the real
episode is envhub's own shop, logged in through a WebArena-style ``.auth`` storage state.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from envhub import registry
from envhub.envs.webnav.evaluators import (
    contents_score,
    exact_match,
    must_include,
    reddit_get_post_url,
    string_score,
    url_score,
)
from envhub.envs.webnav.observation import render_tree
from envhub.envs.webnav.tasks import TaskFileError, load_webarena_tasks, resolve
from envhub.sites.data import seed_data
from envhub.sites.serving import standalone_sites_url
from envhub.sites.store import SESSION_COOKIE, site_store

ENV_ID = "webnav-v0"
REPO = Path(__file__).resolve().parents[1]


def webarena_task(task_id: int, sites: list[str], start_url: str, eval_spec: dict, **extra) -> dict:
    """A task as WebArena's config files hold it (keys the loader ignores included)."""
    return {"sites": sites, "task_id": task_id, "require_login": True,
            "storage_state": f"./.auth/{sites[0]}_state.json",
            "start_url": start_url, "geolocation": None, "intent_template": "t", "instantiation_dict": {},
            "intent": f"task {task_id}", "require_reset": False, "intent_template_id": 100 + task_id,
            "eval": {"reference_url": "", "program_html": [], "string_note": "", "url_note": "GOLD in PRED",
                     "reference_answer_raw_annotation": "", **eval_spec}, **extra}


PRODUCT = seed_data().products[0]  # Wireless Optical Mouse, $159.95
TASKS = [
    webarena_task(0, ["shopping"], "__SHOPPING__", {"eval_types": ["string_match"],
                  "reference_answers": {"must_include": ["159.95"]}}),
    webarena_task(1, ["shopping"], "__SHOPPING__", {"eval_types": ["url_match"],
                  "reference_url": f"__SHOPPING__/product/{PRODUCT.sku} |OR| __SHOPPING__/product/NONE"}),
    webarena_task(2, ["shopping"], f"__SHOPPING__/product/{PRODUCT.sku}", {
        "eval_types": ["program_html"], "program_html": [
        {"url": "last", "locator": "", "required_contents": {"must_include": [PRODUCT.name, "Add to Cart"]}},
        {"url": "__SHOPPING__/cart", "locator": "document.querySelector('main').innerText",
         "required_contents": {"must_include": ["Your cart is empty"]}}]}),
    webarena_task(3, ["gitlab"], "__GITLAB__", {"eval_types": ["string_match"],
                  "reference_answers": {"exact_match": "a"}}),
    webarena_task(4, ["shopping"], "__SHOPPING__", {"eval_types": ["program_html"], "program_html": [
        {"url": "func:shopping_get_latest_order_url()", "locator": "", "required_contents": {"must_include": ["x"]}}]}),
    webarena_task(5, ["reddit", "shopping"], "__REDDIT__ |AND| __SHOPPING__", {"eval_types": ["string_match"],
                  "reference_answers": {"fuzzy_match": ["wireless mouse"]}}),
]


@pytest.fixture
def task_files(tmp_path: Path) -> dict[str, str]:
    raw = tmp_path / "test.raw.json"
    raw.write_text(json.dumps(TASKS[:4]))
    folder = tmp_path / "config_files"
    folder.mkdir()
    for task in TASKS[3:]:
        (folder / f"{task['task_id']}.json").write_text(json.dumps(task))
    return {"raw": str(raw), "folder": str(folder)}


def test_the_loader_reads_lists_and_folders_and_skips_what_it_cannot_score(task_files):
    tasks, skipped = load_webarena_tasks([task_files["raw"], task_files["folder"]])
    assert [task.task_id for task in tasks] == [0, 1, 2, 3, 5]
    assert skipped == {"program_html helper shopping_get_latest_order_url": 1}
    assert tasks[1].eval["reference_url"].startswith("__SHOPPING__/product/") and tasks[1].family == "101"
    splits = registry.task_splits(ENV_ID, task_source="webarena", task_files=list(task_files.values()), test_every=2)
    assert splits["test"] == [0, 2] and splits["train"] == [1, 3, 5] and splits["all"] == [0, 1, 2, 3, 5]
    assert splits["gitlab"] == [3] and splits["reddit"] == [5] and splits["shopping"] == [0, 1, 2, 5]


@pytest.mark.parametrize("content, error", [
    ("{not json", "not readable JSON"),
    (json.dumps([{"task_id": 1, "sites": []}]), "lacks"),
    (json.dumps(webarena_task(1, ["shopping"], "x", {"eval_types": ["llm_judge"]})), "eval_types"),
    (json.dumps([TASKS[0], {**TASKS[0], "intent": "other"}]), "appears twice"),
])
def test_bad_task_files_are_clear_errors(tmp_path, content, error):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TaskFileError, match=error):
        load_webarena_tasks([str(path)])
    with pytest.raises(TaskFileError, match="does not exist"):
        load_webarena_tasks([str(tmp_path / "missing.json")])


def test_placeholders_resolve_to_the_deployment_urls():
    urls = yaml.safe_load((REPO / "configs" / "webnav_webarena.yaml").read_text())["envhub"]["env_options"][ENV_ID][
        "site_urls"]
    assert set(urls) >= {"shopping", "shopping_admin", "reddit", "gitlab", "map"}
    text = "__SHOPPING_ADMIN__/sales |OR| __SHOPPING__/ |AND| __REDDIT__/f/books __GITLAB__ __MAP__/search"
    resolved = resolve(text, urls)
    assert "__" not in resolved and resolved.startswith(urls["shopping_admin"].rstrip("/") + "/sales")
    assert f"{urls['map'].rstrip('/')}/search" in resolved


def test_string_evaluators_follow_webarena():
    assert exact_match("Pending", ' "pending" ') == 1.0 and exact_match("8", "eight") == 0.0
    assert must_include("0", "I count 10 orders", tokenize=True) == 0.0
    assert must_include("0", "there are 0 orders", tokenize=True) == 1.0
    assert string_score({"must_include": ["Luma", "Joust"]}, "luma and joust bags") == 1.0
    assert string_score({"must_include": ["Luma", "Joust"]}, "luma only") == 0.0
    assert string_score({"fuzzy_match": "N/A"}, "N/A") == 1.0
    assert string_score({"fuzzy_match": "N/A"}, "it costs $5") == 0.0
    assert string_score({"fuzzy_match": ["wireless mouse"]}, "The Wireless Optical Mouse.") == 1.0


def test_url_and_page_evaluators_follow_webarena():
    gold = "http://shop:7770/catalogsearch/result/?q=tea |OR| http://shop:7770/tea.html"
    assert url_score(gold, "http://shop:7770/catalogsearch/result/?q=tea&p=2") == 1.0
    assert url_score(gold, "http://shop:7770/catalogsearch/result/?q=coffee") == 0.0
    # As in WebArena, the query values of all alternatives are pooled: every pooled key must match.
    assert url_score(gold, "http://shop:7770/tea.html/") == 0.0
    either = "http://shop:7770/tea.html |OR| http://shop:7770/coffee.html"
    assert url_score(either, "http://shop:7770/coffee.html/") == 1.0
    assert contents_score({"must_include": ["shipped |OR| complete", "#1001"]}, "Order #1001: complete") == 1.0
    assert contents_score({"exact_match": "3"}, "4") == 0.0
    assert reddit_get_post_url("http://r:9999/f/books/12/my-title/comment/3") == "http://r:9999/f/books/12/"
    assert reddit_get_post_url("http://r:9999/forums") == "http://r:9999/forums"


def test_the_observation_numbers_nodes_by_position_and_keeps_the_viewport():
    def node(node_id: str, role: str, name: str, children: list[str], backend: int) -> dict:
        return {"nodeId": node_id, "role": {"value": role}, "name": {"value": name}, "childIds": children,
                "backendDOMNodeId": backend, "properties": []}
    nodes = [node("1", "RootWebArea", "Shop", ["2", "3", "5"], 10), node("2", "link", "Home", [], 20),
             node("3", "paragraph", "", ["4"], 30), node("4", "StaticText", "Home", [], 40),
             node("5", "button", "Buy", [], 50)]
    boxes = {20: (0, 0, 100, 20), 30: (0, 30, 100, 20), 40: (0, 30, 100, 20), 50: (0, 900, 100, 20)}
    tree = render_tree(nodes, boxes, (0.0, 0.0, 1280.0, 720.0))
    assert tree.text == "[1] RootWebArea 'Shop'\n\t[2] link 'Home'"  # repeated text and the off-screen button dropped
    assert tree.element_ids == {1: 10, 2: 20}
    below = render_tree(nodes, boxes, (0.0, 800.0, 1280.0, 720.0))
    assert below.text.splitlines()[-1] == "\t[5] button 'Buy'" and 5 in below.element_ids


def test_an_episode_on_a_webarena_style_deployment(task_files, tmp_path):
    token = site_store().open_session()  # the "deployment": envhub's own shop, one shared login
    base = standalone_sites_url()
    auth = tmp_path / ".auth"
    auth.mkdir()
    cookie = {"name": SESSION_COOKIE, "value": token, "domain": "127.0.0.1", "path": "/", "expires": -1,
              "httpOnly": False, "secure": False, "sameSite": "Lax"}
    for site in ("shopping", "reddit"):
        (auth / f"{site}_state.json").write_text(json.dumps({"cookies": [cookie], "origins": []}))
    options = {"task_source": "webarena", "task_files": list(task_files.values()), "auth_dir": str(auth),
               "site_urls": {"shopping": f"{base}/shop", "reddit": f"{base}/forum"}}

    async def episode(env, task_id: str, actions: list[str]) -> float:
        observation, info = await env.reset(task_id, 0)
        # agentgym shows the sites under WebArena's real-world names (URL_MAPPINGS).
        assert ("URL: http://onestopmarket.com" in observation or "URL: http://reddit.com" in observation)
        assert f"URL: {base}" not in observation and info["sites"]
        for action in actions:
            result = await env.step(action)
        assert result.terminated
        return result.reward

    async def body() -> None:
        env = registry.make(ENV_ID, **options)
        try:
            assert await episode(env, "0", ["```stop [It costs $159.95]```"]) == 1.0
            assert await episode(env, "1", [f"```goto [http://onestopmarket.com/product/{PRODUCT.sku}]```",
                                            "```stop []```"]) == 1.0
            assert await episode(env, "1", ["```stop []```"]) == 0.0
            assert await episode(env, "2", ["```stop []```"]) == 1.0
            two_tabs, _ = await env.reset("5", 0)
            assert "Tab 0: " in two_tabs and "Tab 1 (current): One Stop Market" in two_tabs
            with pytest.raises(ValueError, match="site_urls for \\['gitlab'\\]"):
                await env.reset("3", 0)
        finally:
            await env.close()
            site_store().close_session(token)

    asyncio.run(body())
