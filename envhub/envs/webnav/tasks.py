"""Tasks in WebArena's JSON format and their loader (the task list of each source: catalog.py).

A task (WebArena's ``config_files/*.json``)::

    {"task_id": 21, "sites": ["shopping"], "start_url": "__SHOPPING__/...", "intent": "...",
     "require_login": true, "storage_state": "./.auth/shopping_state.json",
     "eval": {"eval_types": ["string_match", "url_match", "program_html"],
              "reference_answers": {"exact_match": "...", "must_include": [...], "fuzzy_match": [...]},
              "reference_url": "__SHOPPING__/... |OR| ...", "program_html": [{"url", "locator", "required_contents"}]}}

``__SHOPPING__``-style placeholders (one per site: ``__`` + site name in capitals + ``__``) are
replaced by the site URLs when an episode starts. The offline tasks (offline_tasks.py) use the
same format, with the built-in sites as ``shopping``, ``shopping_admin`` and ``reddit``, plus an
eval type of their own, ``site_state`` (a query on the session's site database).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)
EVAL_TYPES = ("string_match", "url_match", "program_html", "site_state")
SUPPORTED_FUNCS = ("reddit_get_post_url(",)
"""WebArena helper functions the evaluator implements; tasks calling any other one are skipped."""


class TaskFileError(ValueError):
    """A task file is not valid WebArena task JSON."""


@dataclass(frozen=True)
class WebTask:
    """One task, as loaded (placeholders not yet replaced)."""

    task_id: int
    sites: tuple[str, ...]
    start_url: str
    intent: str
    eval: dict[str, Any]
    family: str
    """Which kind of task this is: WebArena's ``intent_template_id`` or an offline task family."""
    storage_state: str = ""


def resolve(text: str, site_urls: dict[str, str]) -> str:
    """Replace every ``__SITE__`` placeholder in `text` with that site's URL."""
    for site, url in site_urls.items():
        text = text.replace(f"__{site.upper()}__", url.rstrip("/"))
    return text


def task_from_json(raw: dict[str, Any], where: str) -> WebTask:
    """Validate one WebArena task object; raises `TaskFileError` naming `where` and the problem."""
    missing = [key for key in ("task_id", "sites", "start_url", "intent", "eval") if key not in raw]
    if missing:
        raise TaskFileError(f"{where}: task lacks {missing}")
    eval_spec = raw["eval"]
    unknown = [kind for kind in eval_spec.get("eval_types", []) if kind not in EVAL_TYPES]
    if not eval_spec.get("eval_types") or unknown:
        raise TaskFileError(f"{where}: task {raw['task_id']}: eval_types {eval_spec.get('eval_types')} "
                            f"must be a non-empty list of {EVAL_TYPES}")
    if not isinstance(raw["task_id"], int) or raw["task_id"] < 0:
        raise TaskFileError(f"{where}: task_id must be an int >= 0, got {raw['task_id']!r}")
    family = str(raw.get("family", raw.get("intent_template_id", "")))
    return WebTask(raw["task_id"], tuple(raw["sites"]), raw["start_url"], raw["intent"], eval_spec, family,
                   str(raw.get("storage_state") or ""))


def unsupported_reason(task: WebTask) -> str | None:
    """Why the evaluator cannot score `task` (a WebArena helper it lacks, an LLM judge), or None."""
    for target in task.eval.get("program_html", []) if "program_html" in task.eval["eval_types"] else []:
        for value in (target.get("url", ""), target.get("locator", "")):
            if value.startswith("func:") and not value[5:].startswith(SUPPORTED_FUNCS):
                return f"program_html helper {value[5:].split('(')[0]}"
    return None


def load_webarena_tasks(paths: list[str]) -> tuple[list[WebTask], dict[str, int]]:
    """Tasks from WebArena task files (a task, a list of tasks, or folders of ``*.json``), by task_id,
    and how many were skipped per reason (the evaluator cannot score them)."""
    tasks: dict[int, WebTask] = {}
    skipped: dict[str, int] = {}
    for file in _task_files(paths):
        try:
            content = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise TaskFileError(f"{file}: not readable JSON: {error}") from None
        for raw in content if isinstance(content, list) else [content]:
            if not isinstance(raw, dict):
                raise TaskFileError(f"{file}: a task must be a JSON object, got {type(raw).__name__}")
            task = task_from_json(raw, str(file))
            reason = unsupported_reason(task)
            if reason is not None:
                skipped[reason] = skipped.get(reason, 0) + 1
                continue
            if task.task_id in tasks and tasks[task.task_id] != task:
                raise TaskFileError(f"{file}: task_id {task.task_id} appears twice with different content")
            tasks[task.task_id] = task
    if skipped:
        logger.warning("webnav-v0: skipped WebArena tasks the evaluator cannot score: %s", skipped)
    return [tasks[number] for number in sorted(tasks)], skipped


def _task_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for name in paths:
        path = Path(name).expanduser()
        if path.is_dir():
            files.extend(sorted(path.glob("*.json"), key=lambda p: (len(p.stem), p.stem)))
        elif path.is_file():
            files.append(path)
        else:
            raise TaskFileError(f"webnav-v0: task file {name!r} does not exist")
    return files
