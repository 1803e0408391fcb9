"""Faults on a live run: a killed actor is restarted, its leases re-issued, and training goes on."""

import json
import os
import signal
import subprocess
import sys

from tests.launching import REPO


def test_an_actor_killed_mid_run_is_restarted_and_the_run_goes_on(tmp_path):
    # Tiny buckets make every broadcast hundreds of collectives long, so the kill most likely
    # lands inside one; wherever it lands, the learner must neither hang nor lose a lease.
    proc = subprocess.Popen(
        [sys.executable, "launch.py", "--config", "configs/smoke.yaml", "--output-dir", str(tmp_path),
         "--run-name", "f", "--max-steps", "10", "--learner.bucket_mb", "0.01",
         "--learner.broadcast_timeout_s", "10"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step ") and int(line.split()[1].split("/")[0]) >= 2:
            break
    os.kill(int((tmp_path / "f" / "logs" / "actor-1.pid").read_text()), signal.SIGKILL)
    out = "".join(lines) + proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    assert "actor-1 restarted in" in out

    summary = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert summary["step"] == 10 and summary["actor_restarts"]["count"] == 1
    ledger = summary["ledger"]
    assert ledger["ledger_broken"] == "", ledger["ledger_broken"]
    assert ledger["consumed"] == 10 * 2  # every trained group counted once
    restarted = next(a for a in summary["actors"] if a["actor_id"] == 1)
    assert restarted["versions_received"], "the restarted actor never rejoined the weight group"
    assert restarted["weight_version"] >= 9
