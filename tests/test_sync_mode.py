"""``--run.mode sync``: the reference systems' loop on the same actors, learner and envs."""

import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from common.protocol import Trajectory
from common.recording import read_messages
from tests.launching import run_launch

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)


def test_sync_mode_trains_every_batch_on_the_weights_that_generated_it(tmp_path):
    run_launch("--config", "configs/smoke.yaml", "--mode", "sync", "--output-dir", str(tmp_path),
               "--run-name", "sync")
    run_dir = tmp_path / "sync"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 4
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    # Lease a batch, wait for it, train, broadcast, then lease the next: nothing trained is stale.
    assert [e.value for e in acc.Scalars("async/policy_lag_max")] == [0.0] * 4
    assert [e.value for e in acc.Scalars("async/groups_dropped_stale")][-1] == 0
    train = [m for m in read_messages(run_dir / "trajectories" / "trajectories.msgpack")
             if isinstance(m, Trajectory) and m.purpose == "train"]
    versions = [np.unique(t.token_versions[t.loss_mask.astype(bool)]) for t in train]
    assert all(len(v) == 1 for v in versions if len(v))  # no episode spans a weight update
    assert {0, 1, 2, 3} <= {int(v[0]) for v in versions if len(v)}  # a batch per version
