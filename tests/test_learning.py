"""It learns: the tiny model, warm-started to write valid actions at random, learns the toy env
through the whole asynchronous system (launch.py, real actors, real learner, real envhub), and
the same run with learning rate 0 stays where it started."""

import statistics

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from learner.warm_start import warm_start_for_run
from tests.launching import run_launch

pytestmark = pytest.mark.slow
CONFIG = "configs/learn_keydoor.yaml"


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory):
    """The tiny model after a short supervised pass on random valid keydoor actions."""
    out = tmp_path_factory.mktemp("warm") / "model"
    warm_start_for_run(CONFIG, out)
    return out


def success_per_step(tmp_path, warm_model, *overrides: str) -> list[float]:
    run_launch("--config", CONFIG, "--model.name", str(warm_model),
               "--output-dir", str(tmp_path), "--run-name", "learn", *overrides, timeout_s=900)
    acc = EventAccumulator(str(tmp_path / "learn" / "tb"))
    acc.Reload()
    return [event.value for event in acc.Scalars("rollout/success")]


def test_grpo_takes_success_from_random_play_to_solved(tmp_path, warm_model):
    success = success_per_step(tmp_path, warm_model)
    before, after = statistics.mean(success[:3]), statistics.mean(success[-5:])
    assert before <= 0.4, success  # the warm start writes valid actions but has no policy
    assert after >= 0.9, success


def test_with_learning_rate_zero_success_stays_flat(tmp_path, warm_model):
    success = success_per_step(tmp_path, warm_model, "--learner.lr", "0")
    before, after = statistics.mean(success[:3]), statistics.mean(success[-5:])
    assert after <= 0.4 and abs(after - before) <= 0.15, success
