"""WebArena's evaluators, scoring an episode when the agent stops.

- ``string_match`` on the answer of ``stop [answer]``: ``exact_match`` (after stripping quotes and
  case), ``must_include`` (every phrase; a one-character phrase must be a whole token), and
  ``fuzzy_match``. WebArena asks an LLM judge for fuzzy matches; here, with no judge at hand, a
  fuzzy reference matches when every one of its words is in the answer. ``N/A`` is exact.
- ``url_match``: the current tab's URL against ``reference_url`` (``|OR|`` alternatives; WebArena's
  "GOLD in PRED" rule: the reference's host+path inside the URL's, every reference query value present).
- ``program_html``: for each target, open its URL (``last``: stay), read the page (``locator``: a
  JavaScript expression, empty for the whole HTML) and check ``required_contents``.
- ``site_state`` (offline sites only): run a query on the session's site database and check
  ``required_contents`` against its rows, as program_html checks a page.

The score is the product over eval types and targets, so a task scores 1 only when all pass.
"""

from __future__ import annotations

import collections
import contextlib
import html
import re
from typing import Any
from urllib.parse import parse_qs, urlparse

from envhub.envs.webnav.tabs import BrowserTabs
from envhub.envs.webnav.tasks import WebTask, resolve

_TOKEN = re.compile(r"\w+(?:[.,']\w+)*|[^\w\s]")


def clean_answer(answer: str) -> str:
    answer = answer.strip()
    if len(answer) >= 2 and answer[0] == answer[-1] and answer[0] in "'\"":
        answer = answer[1:-1]
    return answer.lower()


def exact_match(reference: str, prediction: str) -> float:
    return float(clean_answer(prediction) == clean_answer(reference))


def must_include(reference: str, prediction: str, tokenize: bool = False) -> float:
    reference, prediction = clean_answer(reference), clean_answer(prediction)
    if tokenize and len(reference) == 1:  # "0" must not match inside "10"
        return float(reference in _TOKEN.findall(prediction))
    return float(reference in prediction)


def fuzzy_match(reference: str, prediction: str) -> float:
    """Every word of the reference appears among the answer's words (stand-in for WebArena's LLM judge)."""
    words = set(_TOKEN.findall(clean_answer(prediction)))
    return float(all(word in words for word in _TOKEN.findall(clean_answer(reference)) if word.isalnum()))


def string_score(reference_answers: dict[str, Any], answer: str) -> float:
    score = 1.0
    for approach, value in reference_answers.items():
        if approach == "exact_match":
            score *= exact_match(str(value), answer)
        elif approach == "must_include":
            score *= min((must_include(str(v), answer, tokenize=len(value) == 1) for v in value), default=1.0)
        elif approach == "fuzzy_match":
            values = [value] if value == "N/A" else list(value)
            matches = (exact_match(v, answer) if v == "N/A" else fuzzy_match(v, answer) for v in values)
            score *= min(matches, default=1.0)
    return score


def _base_and_query(url: str) -> tuple[str, dict[str, list[str]]]:
    parsed = urlparse(url.rstrip("/"))
    return (parsed.netloc + parsed.path).rstrip("/"), parse_qs(parsed.query)


def url_score(reference_url: str, page_url: str) -> float:
    """WebArena's "GOLD in PRED" URL rule."""
    pred_base, pred_query = _base_and_query(page_url)
    ref_bases, ref_queries = [], collections.defaultdict(set)
    for url in reference_url.split(" |OR| "):
        base, query = _base_and_query(url.strip())
        ref_bases.append(base)
        for key, values in query.items():
            ref_queries[key].update(values)
    score = float(any(base in pred_base for base in ref_bases))
    for key, values in ref_queries.items():
        score *= float(any(value in pred_query.get(key, []) for value in values))
    return score


def contents_score(required_contents: dict[str, Any], selected: str) -> float:
    selected = html.unescape(selected)
    if "exact_match" in required_contents:
        return exact_match(str(required_contents["exact_match"]), selected)
    if "must_include" in required_contents:
        return min((max(must_include(option, selected) for option in str(content).split(" |OR| "))
                    for content in required_contents["must_include"]), default=1.0)
    raise ValueError(f"unknown required_contents {sorted(required_contents)}")


def reddit_get_post_url(url: str) -> str:
    """WebArena's helper: the post's own URL from a post or comment URL (``.../f/<forum>/<id>/...``)."""
    parsed = urlparse(url)
    parts = parsed.path.split("/")
    if "f" not in parts[:-2]:
        return url
    at = parts.index("f")
    return f"{parsed.scheme}://{parsed.netloc}{'/'.join(parts[:at + 3])}/"


async def program_html_score(targets: list[dict[str, Any]], tabs: BrowserTabs, site_urls: dict[str, str]) -> float:
    score = 1.0
    for target in targets:
        url = resolve(target.get("url", "last"), site_urls)
        if url.startswith("func:reddit_get_post_url("):
            url = reddit_get_post_url(tabs.page.url)
        if url != "last":
            await tabs.goto(url)
        for action in target.get("prep_actions", []):
            await _evaluate_quietly(tabs, action)
        locator = target.get("locator", "").strip()
        selected = await tabs.page.content() if not locator else await _evaluate_quietly(tabs, locator)
        score *= contents_score(target["required_contents"], selected)
    return score


async def _evaluate_quietly(tabs: BrowserTabs, expression: str) -> str:
    """A locator's value as text; a page where it throws (wrong page, element missing) reads as empty."""
    try:
        value = await tabs.page.evaluate(f"() => {expression}")
    except Exception:
        tabs.check_alive()
        return ""
    return "" if value is None else str(value)


def site_state_score(targets: list[dict[str, Any]], site_token: str) -> float:
    from envhub.sites.store import site_store  # offline tasks only

    score = 1.0
    with contextlib.closing(site_store().connect(site_token)) as db:
        for target in targets:
            rows = db.execute(target["query"], target.get("params", [])).fetchall()
            selected = "\n".join(" | ".join(str(value) for value in row) for row in rows)
            score *= contents_score(target["required_contents"], selected)
    return score


async def evaluate(task: WebTask, answer: str, tabs: BrowserTabs, site_urls: dict[str, str],
                   site_token: str | None) -> tuple[float, dict[str, float]]:
    """The task's score for this final state and answer, and the score of each eval type."""
    spec = task.eval
    final_url = tabs.page.url  # before program_html opens other pages
    scores: dict[str, float] = {}
    for kind in spec["eval_types"]:
        if kind == "string_match":
            scores[kind] = string_score(spec.get("reference_answers") or {}, answer)
        elif kind == "url_match":
            scores[kind] = url_score(resolve(spec["reference_url"], site_urls), final_url)
        elif kind == "program_html":
            scores[kind] = await program_html_score(spec["program_html"], tabs, site_urls)
        elif kind == "site_state":
            if site_token is None:
                raise ValueError(f"task {task.task_id}: site_state needs the offline sites")
            scores[kind] = site_state_score(spec["site_state"], site_token)
    total = 1.0
    for value in scores.values():
        total *= value
    return total, scores
