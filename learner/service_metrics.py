"""Scalars about the services around the learner: envhub health and the actors' own stats.

envhub's ``/health`` is polled off the training loop's path: a daemon thread asks every server of
the run in turn (``EnvhubStats``), and a step reads the latest snapshot, so a slow or dead server
never delays a step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import httpx

from common.auth import token_from_env
from common.protocol import ActorStats

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0
"""Between two rounds over the servers: a step is seconds long, so its snapshot is at most this old."""
HEALTH_TIMEOUT_S = 2.0


def fetch_health(http: httpx.Client, url: str) -> dict | None:
    """A server's ``/health`` answer, None when it does not answer."""
    try:
        return http.get(f"{url}/health", timeout=HEALTH_TIMEOUT_S).json()
    except (httpx.HTTPError, ValueError):
        return None


def envhub_scalars(healths: list[dict | None]) -> dict[str, float]:
    """``envhub/`` scalars over the servers' ``/health`` answers (None: it did not answer): ``up`` is
    the fraction that answered, counts are summed over them, latencies are the slowest server's."""
    if not healths:
        return {}
    answered = [health for health in healths if health is not None]
    out = {"envhub/up": len(answered) / len(healths)}
    if not answered:
        return out
    stats = [health.get("stats", {}) for health in answered]
    out.update({"envhub/sessions": float(sum(health.get("sessions", 0) for health in answered)),
                "envhub/steps_total": float(sum(s.get("steps_total", 0) for s in stats)),
                "envhub/errors_total": float(sum(sum(s.get("errors", {}).values()) for s in stats))})
    for key in ("p50", "p99"):
        latencies = [s.get("step_latency_s", {}).get(key) for s in stats]
        if any(latency is not None for latency in latencies):
            out[f"envhub/step_latency_{key}_s"] = float(max(x for x in latencies if x is not None))
    return out


class EnvhubStats:
    """Polls every envhub server's ``/health`` on a daemon thread; ``scalars`` is the latest round's.

    A server that does not answer counts in ``unanswered`` (logged when it stops answering); an
    unexpected error in a round is logged and counted in ``round_errors``, and polling goes on."""

    def __init__(self, urls: list[str], interval_s: float = POLL_INTERVAL_S,
                 fetch: Callable[[httpx.Client, str], dict | None] = fetch_health):
        self.urls, self.interval_s, self._fetch = list(urls), interval_s, fetch
        self.unanswered = 0
        self.round_errors = 0
        self.last_error: BaseException | None = None
        self._latest: dict[str, float] = {}
        self._down: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="envhub-stats", daemon=True)

    def start(self) -> None:
        if self.urls:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * HEALTH_TIMEOUT_S)

    def scalars(self) -> dict[str, float]:
        with self._lock:
            return dict(self._latest)

    def _run(self) -> None:
        token = token_from_env()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # trust_env=False: envhub is an internal service; a proxy from the environment must not intercept it.
        with httpx.Client(trust_env=False, headers=headers) as http:
            while not self._stop.is_set():
                try:
                    self.poll_once(http)
                except Exception as exc:  # a bug here must cost the metrics, never the thread
                    self.round_errors += 1
                    self.last_error = exc
                    log.exception("polling envhub's /health failed; polling goes on")
                self._stop.wait(self.interval_s)

    def poll_once(self, http: httpx.Client) -> None:
        healths = [self._fetch(http, url) for url in self.urls]
        for url, health in zip(self.urls, healths):
            self._note_answer(url, health is not None)
        scalars = envhub_scalars(healths)
        with self._lock:
            self._latest = scalars

    def _note_answer(self, url: str, answered: bool) -> None:
        if answered:
            if url in self._down:
                log.info("envhub at %s answers /health again", url)
            self._down.discard(url)
            return
        self.unanswered += 1
        if url not in self._down:
            log.warning("envhub at %s does not answer /health", url)
        self._down.add(url)


def actor_scalars(stats: dict[int, ActorStats]) -> dict[str, float]:
    """Sums and extremes over the latest ``ActorStats`` of every actor."""
    if not stats:
        return {}
    latest = list(stats.values())
    return {
        "perf/actor_tokens_per_s": sum(s.tokens_per_s for s in latest),
        "async/actor_engine_queue_depth": float(sum(s.engine_queue_depth for s in latest)),
        "async/actor_episodes_running": float(sum(s.episodes_running for s in latest)),
        "async/actor_weight_version_min": float(min(s.weight_version for s in latest)),
        "rollout/actor_errors_total": float(sum(sum(s.errors.values()) for s in latest)),
    }
