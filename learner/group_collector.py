"""A step's groups: taken from the data source, failed and stale ones dropped (released and counted).

1. A group none of whose episodes ended ok (an envhub server died under it) has nothing to train
   on: it is released rather than spent on a step. Every step then trains and publishes a new
   version; the staleness admission relies on that (a step that consumed groups without a new
   version froze the admission bound, and a live run stalled). Its episodes still count in the
   next step's rollout metrics, so the errors show.
2. Live data only (``DataSource.max_policy_lag`` set): a group with no fresh token left is released;
   stale tokens of the others are masked by ``collate``. Any stale token may mean some actor lacks
   the current weights, so ``on_stale`` is called (the loop resends them when actors are behind).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from common.protocol import Trajectory
from learner.batching import split_stale, stale_token_count
from learner.data_source import DataSource
from learner.group import Group

log = logging.getLogger("learner")


class GroupCollector:
    """Collects ``groups_per_step`` trainable groups a step; counts what it dropped."""

    def __init__(self, source: DataSource, groups_per_step: int, stop: threading.Event,
                 on_stale: Callable[[], None] = lambda: None):
        self.source, self.groups_per_step, self._stop, self._on_stale = source, groups_per_step, stop, on_stale
        self.dropped_stale = 0
        self.dropped_failed = 0
        self.stale_tokens = 0
        """Sampled tokens masked for staleness (``collate`` counts them; the loop adds them here)."""
        self._failed_episodes: list[Trajectory] = []

    def min_version(self, version: int) -> int | None:
        """The oldest version whose tokens still train at ``version``; None: every token trains."""
        lag = self.source.max_policy_lag
        return None if lag is None else version - lag

    def collect(self, version: int) -> tuple[list[Group] | None, float]:
        """The step's groups and the seconds spent waiting for them; None when the run must stop
        (asked to, or a recording ran out)."""
        started, groups = time.monotonic(), []
        while len(groups) < self.groups_per_step:
            if self._stop.is_set():
                return None, 0.0
            group = self.source.get(timeout_s=0.5)
            if group is None:
                if self.source.exhausted_is_final:
                    log.info("replay stream exhausted")
                    return None, 0.0
                continue
            if not any(e.status == "ok" for e in group.episodes):
                self.drop_failed(group)
                continue
            groups += self.drop_stale([group], version)  # the version holds for the whole step
        return groups, time.monotonic() - started

    def take_failed_episodes(self) -> list[Trajectory]:
        """Episodes of the groups dropped as failed since the last call (for the rollout metrics)."""
        episodes, self._failed_episodes = self._failed_episodes, []
        return episodes

    def drop_failed(self, group: Group) -> None:
        self.source.release(group)
        self.dropped_failed += 1
        self._failed_episodes.extend(group.episodes)
        first = group.episodes[0]  # a group completes with all its episodes
        log.warning("group %s (%s) has no ok episode (%s: %s): dropped untrained", group.lease.group_id,
                    group.lease.env_id, first.status, first.error[:200])

    def drop_stale(self, groups: list[Group], version: int) -> list[Group]:
        """``groups`` less the ones with no fresh token left (released and counted)."""
        min_version = self.min_version(version)
        if min_version is None:
            return groups
        fresh, stale = split_stale(groups, version, self.source.max_policy_lag)
        for group in stale:
            self.source.release(group)
        self.dropped_stale += len(stale)
        if stale or any(stale_token_count(e, min_version) for g in fresh for e in g.episodes if e.status == "ok"):
            self._on_stale()
        return fresh

    def scalars(self) -> dict[str, float]:
        return {"async/groups_dropped_stale": self.dropped_stale, "async/groups_dropped_failed": self.dropped_failed,
                "async/stale_tokens_masked": self.stale_tokens}
