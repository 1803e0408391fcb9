"""End to end: ``python launch.py --config configs/smoke.yaml`` with real Ray, ZeroMQ, HTTP and gloo."""

import json

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoModelForCausalLM

from common.protocol import Trajectory
from common.recording import read_messages
from tests.hostile_peer import HOSTILE_ACTOR_ID

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)


def test_learner_stepped_and_checkpoint_is_complete(smoke_run):
    run_dir, stdout = smoke_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 4
    ckpt = run_dir / "checkpoints" / "step_4"
    assert (ckpt / "COMPLETE").exists()
    model = AutoModelForCausalLM.from_pretrained(ckpt / "hf")
    assert sum(p.numel() for p in model.parameters()) > 100_000
    assert "step 4/4" in stdout or "done: 4 learner steps" in stdout


def test_the_summary_reports_every_validation_round_before_during_and_after_training(smoke_run):
    run_dir, stdout = smoke_run
    rounds = json.loads((run_dir / "summary.json").read_text())["eval"]
    assert [r["step"] for r in rounds] == [0, 2, 4]  # eval_at_start, eval_every 2, eval_at_end
    assert all(r["eval/keydoor-v0/tasks"] == 2 for r in rounds)
    assert "held-out keydoor-v0 at step 0: success" in stdout and "held-out keydoor-v0 at step 4: success" in stdout


def test_actors_applied_new_policy_versions(smoke_run):
    run_dir, _ = smoke_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["actors"]) == 2
    for actor in summary["actors"]:
        assert actor["weight_version"] >= 1, actor
        assert actor["versions_received"] == sorted(actor["versions_received"])


def test_trajectories_carry_per_token_versions(smoke_run):
    run_dir, _ = smoke_run
    episodes = [m for m in read_messages(run_dir / "trajectories" / "trajectories.msgpack")
                if isinstance(m, Trajectory)]
    assert len(episodes) >= 4 * 2 * 4  # steps x groups x group size
    for e in episodes:  # every episode, failed ones too, says how it ended
        assert e.status in ("ok", "env_error", "engine_error", "timeout") and e.finish_reason, (e.status, e.error)
    ok = [e for e in episodes if e.status == "ok"]
    assert len(ok) >= 0.9 * len(episodes), {e.error for e in episodes if e.status != "ok"}
    for e in ok:
        assert e.num_turns >= 1 and e.loss_mask.sum() > 0
        sampled = e.loss_mask.astype(bool)
        assert len(e.token_ids) == len(e.token_versions) == len(e.behavior_logprobs)
        assert (e.token_versions[~sampled] == -1).all() and (e.token_versions[sampled] >= 0).all()
        assert e.num_turns <= e.turn_cap
    assert max(int(e.token_versions.max()) for e in episodes) >= 1, "no episode used an updated policy"
    assert any(e.truncated and e.finish_reason == "turn_cap" for e in episodes)


def test_every_turn_carries_its_reward_and_the_fingerprint_of_the_observation_it_answered(smoke_run):
    run_dir, _ = smoke_run
    ok = [m for m in read_messages(run_dir / "trajectories" / "trajectories.msgpack")
          if isinstance(m, Trajectory) and m.status == "ok"]
    for e in ok:
        assert len(e.turn_rewards) == len(e.turn_observations) == len(e.turn_spans) == e.num_turns
        assert np.isclose(min(max(float(e.turn_rewards.sum()), 0.0), 1.0), e.reward)
    # Every episode of a group answered the same first observation, and later turns saw others.
    first = {}
    for e in ok:
        first.setdefault(e.group_id, set()).add(int(e.turn_observations[0]))
    assert all(len(fingerprints) == 1 for fingerprints in first.values())
    assert any(len(set(e.turn_observations.tolist())) > 1 for e in ok)


def test_every_turn_says_whether_its_reply_held_an_action_and_tensorboard_shows_the_share(smoke_run):
    run_dir, _ = smoke_run
    ok = [m for m in read_messages(run_dir / "trajectories" / "trajectories.msgpack")
          if isinstance(m, Trajectory) and m.status == "ok" and m.purpose == "train"]
    assert all(len(e.turn_action_parsed) == e.num_turns for e in ok)
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    shares = [e.value for e in acc.Scalars("rollout/valid_action_frac")]
    assert len(shares) == 4 and all(0.0 <= share <= 1.0 for share in shares)
    assert "env/keydoor-v0/valid_action_frac" in acc.Tags()["scalars"]


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


def test_tensorboard_shows_the_best_and_worst_episode_and_the_config_as_text(smoke_run):
    run_dir, _ = smoke_run
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert "samples/keydoor-v0/text_summary" in tags, sorted(tags)
    steps = [e.step for e in acc.Tensors("samples/keydoor-v0/text_summary")]
    assert steps == [2, 4]  # learner.sample_text_every: 2
    markdown = acc.Tensors("samples/keydoor-v0/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert markdown.startswith("**best**") and "**worst**" in markdown and "```" in markdown
    assert any(tag.startswith("config") for tag in tags), sorted(tags)


def test_validation_rounds_run_on_held_out_tasks_and_are_logged_at_their_start_step(smoke_run):
    run_dir, _ = smoke_run
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for tag in ("eval/keydoor-v0/success", "eval/keydoor-v0/pass@n", "eval/keydoor-v0/num_turns",
                "eval/keydoor-v0/reward"):
        assert tag in tags, f"{tag} missing from {sorted(tags)}"
    steps = [e.step for e in acc.Scalars("eval/keydoor-v0/pass@n")]
    # learner.eval_every: 2; learner.eval_at_start waits for the round of step 0 before the first
    # update, none is due at max_steps 4, where learner.eval_at_end runs the final round, waited for.
    assert steps == [0, 2, 4], steps
    recorded = [m for m in read_messages(run_dir / "trajectories" / "trajectories.msgpack")
                if isinstance(m, Trajectory)]
    # Actor HOSTILE_ACTOR_ID is tests/hostile_peer.py: it may have held (and failed) one eval lease.
    evaluated = [e for e in recorded if e.purpose == "eval" and e.actor_id != HOSTILE_ACTOR_ID]
    assert len(evaluated) >= 2 * 2  # the step-0 round: 2 tasks x 2 samples
    assert {e.group_size for e in evaluated} == {2} and {e.task_id for e in evaluated} <= {"10000", "10500"}
    # eval_at_start: the first round measured the untrained policy only, every token of version 0.
    first_groups = sorted({e.group_id for e in recorded if e.purpose == "eval"}, key=lambda g: int(g[1:]))[:2]
    first_round = [e for e in evaluated if e.group_id in first_groups]  # eval groups are e0, e1, ...
    assert first_round
    assert all(int(e.token_versions.max()) == 0 for e in first_round), [e.token_versions.max() for e in first_round]


def test_the_run_finished_under_attack_and_counted_every_rejection(smoke_run):
    """``tests/hostile_peer.py`` hit the run with garbage, lying episodes and an oversized frame."""
    run_dir, _ = smoke_run
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["step"] == 4
    ledger = summary["ledger"]
    assert ledger["rejected/not_msgpack"] + ledger.get("rejected/bad_envelope", 0) >= 300, ledger
    for reason in ("inconsistent_arrays", "bad_array", "bad_logprobs", "not_the_lease"):
        assert ledger.get(f"rejected/{reason}", 0) >= 1, (reason, ledger)
    assert ledger["peer_disconnects"] >= 1  # the oversized frame's connection
    assert not ledger["ledger_broken"]
    recorded = [m for m in read_messages(run_dir / "trajectories" / "trajectories.msgpack")
                if isinstance(m, Trajectory) and m.actor_id == HOSTILE_ACTOR_ID]
    assert {e.status for e in recorded} == {"env_error"}  # the lease it gave back; none of its lies
