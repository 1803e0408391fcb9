"""The task lists the learner samples from, as envhub lists them (``GET /envs/{id}/tasks``).

The learner never imports env code: an env's task list can depend on its options (an AgentGym
server's task count, a dataset on disk) and on code only the envhub node has, so the learner asks
one of the run's envhub servers at startup. Every server of a run has the same ``env_options``,
so any of them answers for all.
"""

from __future__ import annotations

import asyncio

from envhub.client import EnvClient, EnvClientError, TaskList

LIST_TIMEOUT_S = 300.0
"""Per request: the first listing of an env may load its dataset on the server (then it is cached)."""


class TaskListRefused(ValueError):
    """envhub answered, and refused: no such env or split, or options that leave the env unusable."""


class EnvhubUnreachable(RuntimeError):
    """No envhub server answered the learner's task list request."""


def fetch_task_lists(envhub_url: str, env_ids: list[str], split: str,
                     timeout_s: float = LIST_TIMEOUT_S) -> dict[str, TaskList]:
    """The ``split`` task list of every env of ``env_ids``, in their order, from the server at ``envhub_url``."""
    return asyncio.run(_fetch(envhub_url, env_ids, split, timeout_s))


def task_ids_of(lists: dict[str, TaskList]) -> dict[str, list[str]]:
    return {env_id: task_list.task_ids for env_id, task_list in lists.items()}


async def _fetch(envhub_url: str, env_ids: list[str], split: str, timeout_s: float) -> dict[str, TaskList]:
    lists = {}
    async with EnvClient(envhub_url, timeout_s) as client:
        for env_id in env_ids:
            try:
                lists[env_id] = await client.tasks(env_id, split)
            except EnvClientError as error:
                where = f"the task list of {env_id} (split {split!r}) from envhub at {envhub_url}"
                if error.status_code is not None and 400 <= error.status_code < 500:
                    raise TaskListRefused(f"{where} was refused: {error.message}") from None
                raise EnvhubUnreachable(f"the learner could not get {where}: {error.message}") from None
    return lists
