"""Test-wide settings (every service on loopback, Ray kept local) and shared runs."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.models import default_cache_dir, load_tokenizer, resolve_model
from common.tiny_model import load_tiny_tokenizer
from tests.hostile_peer import Attack
from tests.launching import run_launch

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

NOT_UNIT = ("integration", "learning", "gpu", "vllm")
"""Tiers: ``integration`` modules start real processes, servers or sockets (``pytestmark``),
``learning`` tests train until a model measurably improves; every other test is ``unit`` (marked
here), for a quick loop: ``pytest -m unit``. The default run takes all three; ``gpu`` and ``vllm``
tests are opt-in and in no tier."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not any(item.get_closest_marker(marker) for marker in NOT_UNIT):
            item.add_marker(pytest.mark.unit)

@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Iterator[str]:
    """The tiny model, saved, with this process as rank 0 of a one-rank process group: the learner's
    model code (sharding, logprobs, precision, checkpoints) run in the test process itself."""
    import torch  # here, not at the top: most test modules never load a model

    from common.net import free_port
    from common.tiny_model import build_tiny_model
    from learner.model import init_process_group

    # One intra-op thread, as the learner's default torch_threads: the tiny model gains nothing
    # from more, and oversubscribed cores make each step many times slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    init_process_group(0, 1, "127.0.0.1", free_port())
    yield str(build_tiny_model(tmp_path_factory.mktemp("tiny")))
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> tuple[Path, str]:
    """One ``configs/smoke.yaml`` run shared by every test that inspects a finished live run."""
    out = tmp_path_factory.mktemp("runs")
    attack = Attack(out / "smoke")  # garbage and lies at the head's sockets while it trains
    attack.start()
    proc = run_launch("--config", "configs/smoke.yaml", "--output-dir", str(out), "--run-name", "smoke")
    attack.finish()
    return out / "smoke", proc.stdout


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    # Shared persistent cache: the GGUF conversion runs once, not once per test or session.
    return load_tokenizer(resolve_model("smollm2-135m", default_cache_dir()))


@pytest.fixture(params=["tiny", "smollm2"])
def tokenizer(request):
    if request.param == "tiny":
        return load_tiny_tokenizer()
    return request.getfixturevalue("smollm2_tokenizer")
