"""envhub's statistics reach the learner off its training path, from every server (learner/service_metrics.py)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from common.config.envhub import EnvhubConfig
from learner.service_metrics import EnvhubStats, envhub_scalars
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)


def health(sessions: int, steps: int, errors: dict[str, int], p50: float | None, p99: float | None) -> dict:
    return {"status": "ok", "sessions": sessions,
            "stats": {"steps_total": steps, "errors": errors, "step_latency_s": {"p50": p50, "p99": p99}}}


def wait_for(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_scalars_sum_the_servers_that_answer_and_take_the_slowest_latency():
    scalars = envhub_scalars([health(3, 100, {"timeout": 1}, 0.01, 0.2), health(2, 50, {"env_error": 2}, 0.03, None),
                              None])
    assert scalars == pytest.approx({"envhub/up": 2 / 3, "envhub/sessions": 5.0, "envhub/steps_total": 150.0,
                                     "envhub/errors_total": 3.0, "envhub/step_latency_p50_s": 0.03,
                                     "envhub/step_latency_p99_s": 0.2})
    assert envhub_scalars([None]) == {"envhub/up": 0.0}  # one server that does not answer: down, as before
    assert envhub_scalars([]) == {}  # replay: no envhub at all


def test_a_slow_server_never_delays_a_read_and_every_server_is_polled():
    asked, release = [], threading.Event()

    def fetch(http, url):
        asked.append(url)
        if url == "http://slow":
            release.wait()  # held until the read below has returned
        return health(1, 1, {}, None, None)

    stats = EnvhubStats(["http://a", "http://slow"], interval_s=0.01, fetch=fetch)
    stats.start()
    reader = ThreadPoolExecutor(1)
    try:
        wait_for(lambda: "http://slow" in asked)
        # A read that waited for the slow server would not return while it is held.
        assert reader.submit(stats.scalars).result(timeout=30) == {}  # no round finished yet
        release.set()
        wait_for(lambda: stats.scalars().get("envhub/sessions") == 2.0)
    finally:
        release.set()
        reader.shutdown()
        stats.stop()


def test_an_unexpected_error_is_counted_and_logged_and_polling_goes_on(caplog: pytest.LogCaptureFixture):
    calls = []

    def fetch(http, url):
        calls.append(url)
        if len(calls) == 1:
            raise RuntimeError("a bug in the poller")
        return None if len(calls) == 2 else health(4, 9, {}, 0.5, 0.9)

    stats = EnvhubStats(["http://only"], interval_s=0.01, fetch=fetch)
    stats.start()
    try:
        wait_for(lambda: stats.scalars().get("envhub/sessions") == 4.0)
    finally:
        stats.stop()
    assert stats.round_errors == 1 and isinstance(stats.last_error, RuntimeError)
    assert stats.unanswered == 1
    assert "a bug in the poller" in caplog.text and "does not answer /health" in caplog.text
    assert not stats._thread.is_alive()


def test_a_real_server_is_polled(tmp_path):
    with running_hub(EnvhubConfig(runs_dir=str(tmp_path))) as url:
        stats = EnvhubStats([url], interval_s=0.05)
        stats.start()
        try:
            wait_for(lambda: stats.scalars().get("envhub/up") == 1.0)
        finally:
            stats.stop()
        assert stats.scalars()["envhub/sessions"] == 0.0
