"""End to end: ``python launch.py --config configs/smoke.yaml`` with real Ray, ZeroMQ, HTTP and gloo."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForCausalLM

from common.protocol import Trajectory, read_stream

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    proc = subprocess.run(
        [sys.executable, "launch.py", "--config", "configs/smoke.yaml", "--output-dir", str(out), "--run-name", "smoke"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out / "smoke", proc.stdout


def test_learner_stepped_and_checkpoint_is_complete(smoke_run):
    run_dir, stdout = smoke_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 4
    ckpt = run_dir / "checkpoints" / "step_4"
    assert (ckpt / "COMPLETE").exists()
    model = AutoModelForCausalLM.from_pretrained(ckpt / "hf")
    assert sum(p.numel() for p in model.parameters()) > 100_000
    assert "step 4/4" in stdout or "done: 4 learner steps" in stdout


def test_actors_applied_new_policy_versions(smoke_run):
    run_dir, _ = smoke_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["actors"]) == 2
    for actor in summary["actors"]:
        assert actor["weight_version"] >= 1, actor
        assert actor["versions_received"] == sorted(actor["versions_received"])


def test_trajectories_carry_per_token_versions(smoke_run):
    run_dir, _ = smoke_run
    episodes = [m for m in read_stream(run_dir / "trajectories" / "trajectories.msgpack") if isinstance(m, Trajectory)]
    assert len(episodes) >= 4 * 2 * 4  # steps x groups x group size
    for e in episodes:
        sampled = e.loss_mask.astype(bool)
        assert len(e.token_ids) == len(e.token_versions) == len(e.behavior_logprobs)
        assert (e.token_versions[~sampled] == -1).all() and (e.token_versions[sampled] >= 0).all()
        assert e.status in ("ok", "env_error", "engine_error", "timeout") and e.finish_reason
        assert e.num_turns <= e.turn_cap
    assert max(int(e.token_versions.max()) for e in episodes) >= 1, "no episode used an updated policy"
    assert any(e.truncated and e.finish_reason == "turn_cap" for e in episodes)


def test_tensorboard_has_rollout_and_learner_scalars(smoke_run):
    run_dir, _ = smoke_run
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("rollout/reward", "rollout/success", "learner/loss", "optim/grad_norm",
                "async/policy_lag_mean", "horizon/turn_cap", "perf/samples_per_s", "envhub/sessions",
                "envhub/step_latency_p50_s", "time/broadcast_s"):
        assert tag in tags, f"{tag} missing from {sorted(tags)}"
    caps = [e.value for e in acc.Scalars("horizon/turn_cap")]
    assert caps[0] == 3 and caps[-1] == 5  # the stepwise horizon raised the cap at step 2
    assert len(acc.Scalars("learner/loss")) == 4
    assert np.isfinite([e.value for e in acc.Scalars("learner/loss")]).all()
