"""The task list of each source (the built-in offline tasks, or WebArena task files) with its splits.

Apart from tasks.py because the offline tasks are written in its format: they import it, this
imports both.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from envhub.envs.webnav.offline_tasks import offline_tasks, offline_test_ids
from envhub.envs.webnav.options import WEBARENA_SITES, WebNavOptions
from envhub.envs.webnav.tasks import WebTask, load_webarena_tasks


@dataclass(frozen=True)
class TaskCatalog:
    """The tasks of one source, addressable by task id, with their splits."""

    tasks: dict[int, WebTask]
    split_ids: dict[str, list[int]]

    def task(self, task_id: str) -> WebTask:
        number = int(task_id)
        if number not in self.tasks:
            raise KeyError(f"webnav-v0: no task {task_id!r}")
        return self.tasks[number]


def catalog_for(options: WebNavOptions) -> TaskCatalog:
    """The task list under `options`."""
    return _load_catalog(options.task_source, tuple(options.task_files), options.test_every)


@functools.lru_cache(maxsize=8)
def _load_catalog(task_source: str, task_files: tuple[str, ...], test_every: int) -> TaskCatalog:
    # Cached: WebArena's task files are read once per process, not per session.
    if task_source == "offline":
        tasks = offline_tasks()
        test = offline_test_ids()
    else:
        tasks, _ = load_webarena_tasks(list(task_files))
        test = {task.task_id for task in tasks if task.task_id % test_every == 0}
    by_id = {task.task_id: task for task in tasks}
    splits = {"train": [n for n in by_id if n not in test], "test": [n for n in by_id if n in test], "all": list(by_id)}
    for site in sorted({site for task in tasks for site in task.sites}):
        if site in WEBARENA_SITES:
            splits[site] = [task.task_id for task in tasks if site in task.sites]
    return TaskCatalog(by_id, {name: ids for name, ids in splits.items() if ids})
