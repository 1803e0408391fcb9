"""The learner alone on recorded data: replay, 1 rank against 2, resume, and a killed learner."""

import dataclasses
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from common import protocol
from common.models import default_cache_dir, resolve_model
from common.recording import Recorder, read_messages
from learner.replay import recorded_groups
from tests.launching import REPO, run_launch

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

REPLAY = ("--config", "configs/smoke.yaml", "--learner.groups_per_step", "2", "--run.deterministic", "true",
          "--learner.lr", "1e-3")


# Adam divides by the gradient's running RMS, which turns float reduction-order noise on
# near-zero gradient entries into differences of up to ~12% of one step (lr 1e-3, seen
# 1.2e-4); a real sharding bug moves parameters by whole steps, 3e-3 over three.
RANK_NOISE = 3e-4


def final_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    folder = run_dir / "checkpoints" / f"step_{step}"
    assert (folder / "COMPLETE").exists(), sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    return load_file(folder / "hf" / "model.safetensors")


@pytest.fixture(scope="module")
def recorded(smoke_run, tmp_path_factory) -> Path:
    """The smoke run's stream with half of every group rewarded: a random tiny model never wins,
    and all-equal rewards give zero advantages, so nothing would move."""
    def half_won(episode):
        won = episode.episode_index % 2 == 0 and episode.status == "ok"
        turn_rewards = np.zeros(len(episode.turn_rewards), np.float32)
        turn_rewards[-1:] = float(won)  # the last turn won, as the env would have paid it
        return dataclasses.replace(episode, reward=float(won), success=won, turn_rewards=turn_rewards)

    return rewrite_stream(smoke_run[0] / "trajectories", tmp_path_factory.mktemp("recorded"), half_won)


def rewrite_stream(recorded: Path, folder: Path, change) -> Path:
    """``folder`` holding the stream of ``recorded`` with ``change`` applied to every episode."""
    recorder = Recorder(folder / "trajectories.msgpack")
    for episode in read_messages(recorded / "trajectories.msgpack"):
        recorder.write(protocol.encode(change(episode)))
    recorder.close()
    return folder


def replay(recorded: Path, out: Path, name: str, *extra: str) -> Path:
    run_launch(*REPLAY, "--replay", str(recorded), "--output-dir", str(out), "--run-name", name, *extra)
    return out / name


def assert_close(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    worst = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
    assert worst <= atol, f"largest difference {worst}"


@pytest.fixture(scope="module")
def one_rank(recorded, tmp_path_factory) -> Path:
    return replay(recorded, tmp_path_factory.mktemp("one"), "one", "--max-steps", "3")


def test_replay_trains_without_actors(one_rank):
    weights = final_weights(one_rank, 3)
    initial = load_file(resolve_model("tiny", default_cache_dir()) / "model.safetensors")
    assert not list((one_rank / "logs").glob("actor-*.log")) and not list((one_rank / "logs").glob("envhub-*"))
    assert all(torch.isfinite(w.float()).all() for w in weights.values())
    assert any(not torch.equal(weights[k], initial[k]) for k in weights), "replay did not change the weights"


def test_a_time_limit_ends_the_run_like_max_steps_does(recorded, tmp_path):
    run_dir = replay(recorded, tmp_path, "timed", "--max-steps", "1000", "--run.max_wall_s", "0.001")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 1  # the limit is checked before each step: the first one always runs
    assert (run_dir / "checkpoints" / "step_1" / "COMPLETE").exists()


def test_groups_with_no_ok_episode_are_dropped_untrained_and_every_step_trains(recorded, tmp_path):
    # An envhub server dying can fail whole groups. A step spent on them published either a
    # version nobody received (every later group then looked too stale to train on) or none
    # while consuming admission slots (the lease bound froze); either way a live run stalled.
    failed_leases = {g.lease.lease_id for g in itertools.islice(recorded_groups(recorded), 2)}

    def fail_first_groups(episode):
        if episode.lease_id not in failed_leases:
            return episode
        return dataclasses.replace(episode, status="env_error", finish_reason="env_error", error="server died",
                                   success=False, terminated=False, truncated=False)

    stream = rewrite_stream(recorded, tmp_path / "failed-first", fail_first_groups)
    run_dir = replay(stream, tmp_path, "failed", "--max-steps", "3")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 3 and summary["version"] == 3
    assert summary["ledger"]["released"] == 2 and summary["ledger"]["consumed"] == 3 * 2
    trained = {t.lease_id for t in read_messages(run_dir / "trajectories" / "trained.msgpack")
               if isinstance(t, protocol.TrainedSample)}
    assert trained and not trained & failed_leases


def test_two_ranks_give_the_same_update_as_one(recorded, one_rank, tmp_path):
    two = final_weights(replay(recorded, tmp_path, "two", "--max-steps", "3", "--learner-gpus", "2"), 3)
    assert_close(final_weights(one_rank, 3), two, atol=RANK_NOISE)


def test_gigpo_step_credit_changes_the_update_and_two_ranks_agree_on_it(recorded, one_rank, tmp_path):
    # Every learner rank computes the advantages; the per-turn rewards and anchors that GiGPO
    # needs travel from rank 0 with the batch, so both ranks must make the same update.
    gigpo = ("--max-steps", "3", "--learner.algorithm.advantage", "gigpo", "--learner.algorithm.gamma", "0.9")
    one = final_weights(replay(recorded, tmp_path, "gigpo-one", *gigpo), 3)
    two = final_weights(replay(recorded, tmp_path, "gigpo-two", *gigpo, "--learner-gpus", "2"), 3)
    assert_close(one, two, atol=RANK_NOISE)
    grpo = final_weights(one_rank, 3)
    assert max((one[k].float() - grpo[k].float()).abs().max().item() for k in one) > 1e-3, \
        "the step advantages left the update as GRPO's"


# One combined config covers the learner state a resume must bring back beyond the policy and its
# optimizer: the minibatch shuffle generator (minibatches > 1), the critic and its optimizer (GAE)
# and the frozen reference (a KL term).
RESUMED_ALGORITHM = ("--learner.algorithm.minibatches", "2", "--learner.algorithm.advantage", "gae",
                     "--learner.algorithm.kl_coef", "0.05", "--learner.algorithm.kl_estimator", "k3")


GIGPO_ALGORITHM = ("--learner.algorithm.minibatches", "2", "--learner.algorithm.advantage", "gigpo",
                   "--learner.algorithm.gamma", "0.9")
"""GiGPO keeps no state of its own (its anchors come from each batch): this checks that stays so."""


@pytest.mark.parametrize("algorithm", [RESUMED_ALGORITHM, GIGPO_ALGORITHM], ids=["gae-kl", "gigpo"])
def test_resume_equals_an_uninterrupted_run(recorded, tmp_path, algorithm):
    straight = final_weights(replay(recorded, tmp_path, "straight", "--max-steps", "4", *algorithm), 4)
    resumed_dir = replay(recorded, tmp_path, "resumed", "--max-steps", "2", *algorithm)
    replay(recorded, tmp_path, "resumed", "--max-steps", "4", "--resume", *algorithm)
    assert_close(straight, final_weights(resumed_dir, 4), atol=0.0)


def test_a_killed_learner_is_reported_and_resume_continues(tmp_path):
    args = ("--config", "configs/smoke.yaml", "--output-dir", str(tmp_path), "--run-name", "k",
            "--learner.checkpoint_every", "2", "--max-steps", "8")
    run_dir = tmp_path / "k"
    proc = subprocess.Popen([sys.executable, "launch.py", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoints" / "step_2" / "COMPLETE").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.1)
    os.kill(int((run_dir / "logs" / "learner-0.pid").read_text()), signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "FAILED: learner-0" in out and "--resume" in out, out

    checkpoint = max((p for p in (run_dir / "checkpoints").glob("step_*") if (p / "COMPLETE").exists()),
                     key=lambda p: int(p.name[5:]))
    state = json.loads((checkpoint / "loop.json").read_text())
    sampler = state["source"]["sampler"]
    frames_before = sum(1 for _ in read_messages(run_dir / "trajectories" / "trajectories.msgpack"))

    run_launch(*args, "--resume")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 8 and summary["turn_cap"] == 5
    after = list(read_messages(run_dir / "trajectories" / "trajectories.msgpack"))[frames_before:]
    reissued = {lease["group_id"] for lease in sampler["leases"]} | {g["group_id"] for g in sampler["groups"]}
    numbers = {int(e.group_id[1:]) for e in after if e.group_id not in reissued and e.purpose == "train"}
    assert numbers and min(numbers) >= sampler["counts"]["drawn"], "the task stream restarted instead of continuing"
