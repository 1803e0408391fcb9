"""Running ``launch.py`` from tests."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_launch(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """``python launch.py ARGS`` from the repository root; asserts it succeeded."""
    proc = subprocess.run([sys.executable, "launch.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
