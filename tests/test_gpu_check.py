"""tests/gpu/check.py's CPU mode: the GPU check's code path (the learner's real train step against a
plain loop, weight buckets against a device copy) runs and reports figures that make sense."""

import json
import math
import subprocess
import sys

import pytest

from tests.launching import REPO

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)


def test_the_gpu_check_runs_its_cpu_mode_and_reports_every_figure(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, "tests/gpu/check.py", "--cpu", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    (train,) = report["train"]
    assert train["tokens"] > 0 and train["params"] > 100_000
    for key in ("ours_tokens_per_s", "plain_tokens_per_s", "ours_over_plain"):
        assert math.isfinite(train[key]) and train[key] > 0, (key, train)
    assert math.isfinite(train["loss"]), "the learner's step gave no finite loss"
    (buckets,) = report["buckets"]
    assert buckets["round_trip"] and buckets["copy_over_pack"] > 0
    assert "ours / plain" in proc.stdout and "copy / pack" in proc.stdout
