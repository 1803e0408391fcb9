"""ruff finds nothing in the repository: pyflakes, import order, lines within 120 columns.

The rules live in pyproject.toml (``[tool.ruff]``); this test puts them in the README's test
command, which CI runs. ``ruff check --fix`` repairs import order; the rest is by hand.
"""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

REPO = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"ruff check (settings in pyproject.toml) found:\n{proc.stdout}{proc.stderr}", pytrace=False)
