"""Test-wide settings (every service on loopback, Ray kept local) and shared runs."""

import os
from pathlib import Path

import pytest

from tests.hostile_peer import Attack
from tests.launching import run_launch

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> tuple[Path, str]:
    """One ``configs/smoke.yaml`` run shared by every test that inspects a finished live run."""
    out = tmp_path_factory.mktemp("runs")
    attack = Attack(out / "smoke")  # garbage and lies at the head's sockets while it trains
    attack.start()
    proc = run_launch("--config", "configs/smoke.yaml", "--output-dir", str(out), "--run-name", "smoke")
    attack.finish()
    return out / "smoke", proc.stdout
