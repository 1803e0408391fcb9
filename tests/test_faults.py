"""Faults on a live run: a killed actor or envhub server is restarted, and training goes on.

A killed actor's leases are re-issued; the episodes a killed envhub server was running end with
status ``env_error``. Either way no trajectory is lost or counted twice.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from common.protocol import Trajectory
from common.recording import read_messages
from tests.launching import REPO

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)


def test_the_only_actor_killed_mid_run_is_restarted_and_the_run_goes_on(tmp_path):
    # Tiny buckets make every broadcast hundreds of collectives long, so the kill most likely
    # lands inside one; wherever it lands, the learner must neither hang nor lose a lease. With
    # no other actor, the run goes on only if the learner resends the current weights to the
    # restarted one (its groups, made on the initial weights, are too stale to train on).
    proc = subprocess.Popen(
        [sys.executable, "launch.py", "--config", "configs/smoke.yaml", "--output-dir", str(tmp_path),
         "--run-name", "f", "--max-steps", "10", "--actors.count", "1", "--learner.bucket_mb", "0.01",
         "--learner.broadcast_timeout_s", "10"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step ") and int(line.split()[1].split("/")[0]) >= 2:
            break
    os.kill(int((tmp_path / "f" / "logs" / "actor-0.pid").read_text()), signal.SIGKILL)
    out = "".join(lines) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    assert "actor-0 restarted in" in out

    summary = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert summary["step"] == 10 and summary["actor_restarts"]["count"] == 1
    ledger = summary["ledger"]
    assert ledger["ledger_broken"] == "", ledger["ledger_broken"]
    assert ledger["consumed"] == 10 * 2  # every trained group counted once
    restarted = next(a for a in summary["actors"] if a["actor_id"] == 0)
    assert restarted["versions_received"], "the restarted actor never rejoined the weight group"
    assert restarted["weight_version"] >= 9


def test_an_envhub_server_killed_mid_run_is_restarted_and_its_episodes_end_env_error(tmp_path):
    # Long episodes (a 10-turn cap) so the sessions seen open are mid-episode when the kill
    # lands, not between their last step and their close (a fast machine once saw no env_error).
    proc = subprocess.Popen(
        [sys.executable, "launch.py", "--config", "configs/smoke.yaml", "--output-dir", str(tmp_path),
         "--run-name", "e", "--max-steps", "8", "--learner.eval_every", "0",
         "--learner.horizon.turn_caps", "[10, 10]", "--rollout.max_episode_tokens", "2048"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("envhub servers:"):
            url = line.split()[2]
        if line.startswith("step ") and int(line.split()[1].split("/")[0]) >= 2:
            break
    _wait_for_open_sessions(url)  # so the kill lands on running episodes
    os.kill(int((tmp_path / "e" / "logs" / "envhub-0.pid").read_text()), signal.SIGKILL)
    out = "".join(lines) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    assert "envhub-0 restarted in" in out, out

    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert summary["step"] == 8 and summary["envhub_restarts"]["count"] == 1
    assert summary["ledger"]["ledger_broken"] == "", summary["ledger"]["ledger_broken"]
    assert summary["ledger"]["consumed"] == 8 * 2  # every trained group counted once
    assert sum(a["errors"].get("env_error", 0) for a in summary["actors"]) > 0

    recorded = [m for m in read_messages(tmp_path / "e" / "trajectories" / "trajectories.msgpack")
                if isinstance(m, Trajectory)]
    episodes = [(t.lease_id, t.episode_index) for t in recorded]
    assert len(episodes) == len(set(episodes)), "an episode was recorded twice"
    failed = [i for i, t in enumerate(recorded) if t.status == "env_error"]
    assert failed, "the episodes running on the killed server must end with env_error"
    assert all(recorded[i].finish_reason == "env_error" and recorded[i].error for i in failed)
    assert any(t.status == "ok" for t in recorded[failed[-1] + 1:]), "no ok episode after the restart"


def _wait_for_open_sessions(url: str, at_least: int = 4, timeout_s: float = 60.0) -> None:
    """Until ``at_least`` sessions (a whole group) are open on the server at ``url``."""
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with no_proxy.open(f"{url}/health", timeout=5) as answer:
            if json.load(answer).get("sessions", 0) >= at_least:
                return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {at_least} sessions open on {url} within {timeout_s} s")
