"""train_step / Trainer end to end on a tiny random Qwen2 sharded with FSDP2 (gloo, world size 1)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from torch.distributed.fsdp import FSDPModule

from common.config.learner import LearnerConfig, algorithm_config, with_advantage
from common.net import free_port
from learner.batching import Batch
from learner.distributed import deal_by_tokens
from learner.losses import token_logprobs
from learner.model import full_parameters, init_process_group, load_sharded_model
from learner.train_step import Trainer, plan_micro_batches, train_step
from learner.turns import BatchTurns

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

TEMPERATURE = 1.0
# Two groups of two episodes: prompt, turn 1, observation, turn 2, final observation, padding.
LOSS_MASK = torch.tensor([
    [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0],
    [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0],
    [0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0],
], dtype=torch.float32)
LENGTHS = torch.tensor([13, 14, 7, 14])
FLAT_GROUP_REWARDS = (1.0, 0.0, 0.5, 0.5)
"""Group 1 all-equal: GRPO gives its rows advantage 0, and each rank skips its pass over them."""


def make_cfg(lr: float = 1e-3, learner: dict | None = None, **algorithm) -> LearnerConfig:
    return LearnerConfig(lr=lr, algorithm=algorithm_config(**algorithm), **(learner or {}))


def make_batch(policy, rewards=(1.0, 0.0, 0.0, 1.0), behavior_shift=0.1, seed=0) -> Batch:
    """Random tokens; behavior logprobs = the policy's own, shifted (a slightly stale actor)."""
    gen = torch.Generator().manual_seed(seed)
    token_ids = torch.randint(3, 400, LOSS_MASK.shape, generator=gen)
    attention_mask = (torch.arange(LOSS_MASK.shape[1])[None, :] < LENGTHS[:, None]).long()
    token_ids = token_ids * attention_mask
    with torch.no_grad():
        own = token_logprobs(policy(input_ids=token_ids, attention_mask=attention_mask).logits, token_ids, TEMPERATURE)
    return Batch(
        token_ids=token_ids, attention_mask=attention_mask, loss_mask=LOSS_MASK,
        behavior_logprobs=(own - behavior_shift) * LOSS_MASK,
        token_versions=torch.where(LOSS_MASK.bool(), 0, -1), rewards=torch.tensor(rewards),
        group_index=torch.tensor([0, 0, 1, 1]), episodes=[],
    )


def sequence_logprobs(policy, batch: Batch) -> torch.Tensor:
    with torch.no_grad():
        logits = policy(input_ids=batch.token_ids, attention_mask=batch.attention_mask).logits
    return (token_logprobs(logits, batch.token_ids, TEMPERATURE) * batch.loss_mask).sum(dim=1)


def snapshot(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in full_parameters(module).items()}


def changed(before: dict[str, torch.Tensor], module) -> bool:
    after = full_parameters(module)
    return any(not torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("advantage", ["grpo", "rloo", "reinforce_pp", "gae"])
def test_each_estimator_trains_policy_and_critic(model_path, advantage):
    trainer = Trainer.build(model_path, "float32", make_cfg(advantage=advantage), TEMPERATURE)
    batch = make_batch(trainer.policy)
    policy_before = snapshot(trainer.policy)
    critic_before = snapshot(trainer.critic.model) if trainer.critic else None
    scalars = trainer.step(batch)
    assert all(math.isfinite(v) for v in scalars.values()), scalars
    assert {"learner/loss", "learner/pg_loss", "learner/entropy", "learner/clip_frac", "learner/is_weight_mean",
            "learner/is_weight_max", "learner/seq_masked_frac", "optim/lr", "optim/grad_norm"} <= set(scalars)
    assert scalars["learner/advantage_abs_mean"] > 0
    assert changed(policy_before, trainer.policy)
    if advantage == "gae":
        assert changed(critic_before, trainer.critic.model)
        assert {"learner/value_loss", "learner/return_mean", "optim/critic_grad_norm"} <= set(scalars)


@pytest.mark.parametrize("advantage", ["grpo", "rloo", "reinforce_pp", "gae"])
def test_each_estimator_moves_the_rewarded_episode_above_its_unrewarded_group_mate(model_path, advantage):
    # "Finite and changed" passes with a sign error; this does not. Plain SGD, so the step is the gradient.
    cfg = make_cfg(lr=0.05, advantage=advantage, learner={"max_grad_norm": 1e9})
    trainer = _build_for_data_parallel(model_path, cfg, "sgd")
    batch = make_batch(trainer.policy, rewards=(1.0, 0.0, 0.0, 1.0), behavior_shift=0.0)
    before = sequence_logprobs(trainer.policy, batch)
    trainer.step(batch)
    delta = sequence_logprobs(trainer.policy, batch) - before
    assert delta[0] > delta[1] and delta[3] > delta[2], delta


def test_grpo_step_raises_the_logprob_of_the_better_episode(model_path):
    policy = load_sharded_model(model_path, "float32")
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    batch = make_batch(policy, rewards=(1.0, 0.0, 0.5, 0.5))  # group 1 is all-equal: advantage 0
    before = sequence_logprobs(policy, batch)
    scalars = train_step(policy, optimizer, batch, make_cfg(lr=1e-4), TEMPERATURE)
    delta = sequence_logprobs(policy, batch) - before
    assert delta[0] > 0 > delta[1]
    assert scalars["learner/clip_frac"] == 0.0  # one step: the ratio to the pre-update policy is 1
    assert scalars["learner/is_weight_mean"] == pytest.approx(math.exp(0.1), rel=1e-4)


def test_a_batch_without_learning_signal_leaves_the_weights_alone(model_path):
    # Every group all-equal: GRPO advantages and the gradient are exactly 0. AdamW would still
    # move the weights on the momentum of the step before and on weight decay; the step is skipped.
    trainer = Trainer.build(model_path, "float32", make_cfg(lr=1e-2, learner={"weight_decay": 0.1}), TEMPERATURE)
    first = trainer.step(make_batch(trainer.policy))
    before = snapshot(trainer.policy)
    flat = trainer.step(make_batch(trainer.policy, rewards=(0.0, 0.0, 1.0, 1.0), seed=1))
    assert (first["optim/skipped_zero_grad"], flat["optim/skipped_zero_grad"]) == (0.0, 1.0)
    assert flat["optim/grad_norm"] == 0.0 and not changed(before, trainer.policy)
    assert math.isfinite(flat["learner/loss"])  # the step still reports its scalars
    # A KL term is a signal of its own: with it the same batch does train.
    with_kl = Trainer.build(model_path, "float32", make_cfg(lr=1e-2, kl_coef=0.1), TEMPERATURE)
    with_kl.step(make_batch(with_kl.policy))
    before = snapshot(with_kl.policy)
    stepped = with_kl.step(make_batch(with_kl.policy, rewards=(0.0, 0.0, 1.0, 1.0), seed=1))
    assert stepped["optim/skipped_zero_grad"] == 0.0
    assert changed(before, with_kl.policy)


def test_several_passes_anchor_the_trust_region_at_the_pre_update_policy(model_path):
    cfg = make_cfg(lr=1e-2, clip_eps=0.01, ppo_epochs=2, minibatches=2)
    trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    scalars = trainer.step(make_batch(trainer.policy))
    steps = {int(state["step"]) for state in trainer.optimizer.state.values()}
    assert steps == {4}  # 2 passes x 2 minibatches
    assert scalars["learner/clip_frac"] > 0  # later steps moved past the fixed anchor and got clipped


def test_the_learning_rate_warms_up_over_its_learner_steps_and_a_restored_optimizer_goes_on(model_path):
    cfg = make_cfg(lr=1e-2, learner={"lr_warmup_steps": 2}, minibatches=2)  # 4 optimizer steps of warm-up
    trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    first = trainer.step(make_batch(trainer.policy))["optim/lr"]  # its minibatches at 1/4 and 2/4 of lr
    restored = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    restored.optimizer.load_state_dict(trainer.optimizer.state_dict())  # as a resume does
    later = [t.step(make_batch(t.policy, seed=1))["optim/lr"] for t in (trainer, restored, trainer)]
    assert first == pytest.approx(5e-3) and later == pytest.approx([1e-2] * 3)
    fresh = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    assert fresh.step(make_batch(fresh.policy, seed=1))["optim/lr"] == pytest.approx(5e-3)
    without = Trainer.build(model_path, "float32", make_cfg(lr=1e-2, minibatches=2), TEMPERATURE)
    assert without.step(make_batch(without.policy))["optim/lr"] == pytest.approx(1e-2)


def test_kl_to_the_frozen_reference_starts_at_zero_and_grows(model_path):
    trainer = Trainer.build(model_path, "float32", make_cfg(lr=1e-2, kl_coef=0.1, kl_estimator="k3"), TEMPERATURE)
    reference_before = snapshot(trainer.reference)
    batch = make_batch(trainer.policy)
    first = trainer.step(batch)
    second = trainer.step(batch)
    assert first["learner/kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference before step 1
    assert second["learner/kl"] > 1e-4
    assert not changed(reference_before, trainer.reference)
    assert not any(p.requires_grad for p in trainer.reference.parameters())


def test_reinforce_pp_with_kl_in_the_reward(model_path):
    cfg = make_cfg(advantage="reinforce_pp", kl_coef=0.5, kl_estimator="k1", kl_in_reward=True)
    trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    batch = make_batch(trainer.policy)
    trainer.step(batch)
    scalars = trainer.step(batch)  # now the policy differs from the reference
    assert scalars["learner/kl"] != 0.0 and math.isfinite(scalars["learner/loss"])


def test_critic_fits_the_returns(model_path):
    cfg = make_cfg(lr=1e-5, advantage="gae", critic_lr=1e-3, value_clip=0.0)
    trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    batch = make_batch(trainer.policy)
    losses = [trainer.step(batch)["learner/value_loss"] for _ in range(6)]
    # zero head: 0.5 * mean (0 - R)^2, and 12 of the 22 assistant tokens have R = 1
    assert losses[0] == pytest.approx(0.5 * 12 / 22)
    # below 0.5 * var(R) = 0.124, the best constant: the critic tells the episodes apart
    assert losses[-1] < 0.25 * losses[0]


def test_entropy_bonus_raises_entropy(model_path):
    cfg = make_cfg(lr=1e-3, entropy_coef=1.0)
    trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    batch = make_batch(trainer.policy, rewards=(1.0, 1.0, 0.0, 0.0))  # all advantages 0

    def entropy() -> float:
        return trainer.step(batch)["learner/entropy"]

    assert entropy() < entropy()


def test_sequence_mask_drops_the_episode_the_actor_sampled_very_differently(model_path):
    trainer = Trainer.build(model_path, "float32", make_cfg(seq_mask_low=0.5, seq_mask_high=2.0), TEMPERATURE)
    batch = make_batch(trainer.policy, behavior_shift=0.0)
    batch.behavior_logprobs[2] -= 1.0 * LOSS_MASK[2]  # geometric-mean ratio e^1 > 2
    scalars = trainer.step(batch)
    assert scalars["learner/seq_masked_frac"] == pytest.approx(1 / 4)


def test_missing_critic_or_reference_is_a_clear_error(model_path):
    policy = load_sharded_model(model_path, "float32")
    optimizer = torch.optim.AdamW(policy.parameters())
    batch = make_batch(policy)
    with pytest.raises(ValueError, match="critic"):
        train_step(policy, optimizer, batch, make_cfg(advantage="gae"), TEMPERATURE)
    with pytest.raises(ValueError, match="reference"):
        train_step(policy, optimizer, batch, make_cfg(kl_coef=0.1), TEMPERATURE)


def test_algorithm_config_rejects_unknown_choices_and_useless_combinations():
    with pytest.raises(ValueError, match="advantage must be one of"):
        algorithm_config(advantage="ppo")
    with pytest.raises(ValueError, match="kl_in_reward needs a per-token return"):
        algorithm_config(advantage="grpo", kl_coef=0.1, kl_in_reward=True)
    with pytest.raises(ValueError, match="seq_mask_high must exceed"):
        algorithm_config(seq_mask_low=1.5, seq_mask_high=1.2)
    assert with_advantage(algorithm_config(kl_coef=0.1, kl_estimator="k2"), "gae").kl_coef == 0.1


def test_k1_is_refused_as_a_loss_term_and_allowed_in_the_reward():
    with pytest.raises(ValueError, match="k1 as a loss term"):
        algorithm_config(kl_coef=0.1, kl_estimator="k1")
    assert algorithm_config(advantage="reinforce_pp", kl_coef=0.1, kl_estimator="k1", kl_in_reward=True).kl_coef == 0.1
    for estimator in ("k2", "k3"):
        assert algorithm_config(kl_coef=0.1, kl_estimator=estimator).kl_estimator == estimator


def test_clip_options_and_the_loss_normaliser_are_validated():
    for bad, match in (({"dual_clip_c": 0.5}, "dual_clip_c"), ({"clip_eps_low": 1.0}, "clip_eps_low"),
                       ({"clip_eps_high": -0.1}, "clip_eps_high"), ({"loss_norm_tokens": -1}, "loss_norm_tokens"),
                       ({"loss_norm_tokens": 512}, "loss_norm_tokens")):  # with token-mean: a knob that does nothing
        with pytest.raises(ValueError, match=match):
            algorithm_config(**bad)
    ok = algorithm_config(dual_clip_c=3.0, clip_eps_high=0.28, loss_agg="seq-mean-token-sum-norm", loss_norm_tokens=512)
    assert (ok.dual_clip_c, ok.clip_eps_high, ok.loss_norm_tokens) == (3.0, 0.28, 512)
    with pytest.raises(ValueError, match="logprob_chunk_tokens"):
        LearnerConfig(logprob_chunk_tokens=-1)


def test_sum_norm_without_a_normaliser_is_a_clear_error(model_path):
    with pytest.raises(ValueError, match="loss_norm_tokens"):
        Trainer.build(model_path, "float32", make_cfg(loss_agg="seq-mean-token-sum-norm"), TEMPERATURE)


def _turns_of(loss_mask: torch.Tensor, turn_rewards: list[list[float]]) -> BatchTurns:
    """Each row's assistant runs as its turns, with these rewards (one anchor per turn)."""
    rows, spans = [], []
    for row, mask in enumerate(loss_mask.tolist()):
        for t, on in enumerate(mask):
            if on and (t == 0 or not mask[t - 1]):
                spans.append([t, t])
                rows.append(row)
            if on:
                spans[-1][1] = t + 1
    rewards = [reward for row in turn_rewards for reward in row]
    return BatchTurns(row=torch.tensor(rows), spans=torch.tensor(spans), rewards=torch.tensor(rewards),
                      anchor=torch.arange(len(rows)))


@pytest.mark.parametrize("advantage", ["reinforce_pp", "gae"])
def test_per_turn_rewards_credit_the_turn_that_earned_them(model_path, advantage):
    cfg = make_cfg(advantage=advantage, gamma=0.9)
    trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    batch = make_batch(trainer.policy)  # rewards 1, 0, 0, 1
    # Row 0 earned its reward at turn 1; row 1 earned nothing; row 3 half at each of its turns.
    batch.turns = _turns_of(LOSS_MASK, [[1.0, 0.0], [0.0, 0.0], [0.0], [0.5, 0.5]])
    scalars = trainer.step(batch)
    advantages = trainer.last_advantages
    first, second = advantages[0, 3:6], advantages[0, 9:11]
    assert first.min() > second.max()  # the turn that earned it gets the credit
    # Turn 2 of row 0 comes after the reward: its return is 0, as every token of row 1 (zero value
    # before the first update, so GAE's advantages are the returns too).
    assert torch.allclose(second, advantages[1, 8:10], atol=1e-6)
    assert scalars["learner/reward_on_turns"] == 1.0
    batch.turns = None  # an older recording: the episode reward on the last token, as before
    assert trainer.step(batch)["learner/reward_on_turns"] == 0.0
    if advantage == "reinforce_pp":  # (GAE's now-trained critic moves its advantages)
        assert trainer.last_advantages[0, 9:11].min() > trainer.last_advantages[0, 3:6].max()


def _widened(batch: Batch, row: int, width: int) -> Batch:
    """The batch padded to ``width`` tokens, ``row`` made that long (more of its tokens assistant ones)."""
    grow = width - batch.token_ids.shape[1]
    pad = lambda x, value=0: torch.nn.functional.pad(x, (0, grow), value=value)  # noqa: E731
    wide = dataclasses.replace(batch, token_ids=pad(batch.token_ids), attention_mask=pad(batch.attention_mask),
                               loss_mask=pad(batch.loss_mask), behavior_logprobs=pad(batch.behavior_logprobs),
                               token_versions=pad(batch.token_versions, -1))
    wide.token_ids[row, :width] = torch.arange(width) % 300 + 5
    wide.attention_mask[row] = 1
    wide.loss_mask[row, width // 2:] = 1.0
    wide.behavior_logprobs[row, width // 2:] = -3.0
    return wide


def test_sum_norm_update_of_the_same_rows_does_not_depend_on_a_longer_unrelated_row(model_path):
    # Group 1 (rows 2 and 3) scores all-equal: advantage 0, it adds nothing to the gradient.
    # Making row 2 much longer pads the batch wider; rows 0 and 1 must get the same update.
    cfg = make_cfg(loss_agg="seq-mean-token-sum-norm", loss_norm_tokens=64)

    def update(widen: bool) -> tuple[float, dict[str, torch.Tensor]]:
        trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
        trainer.optimizer = torch.optim.SGD(trainer.policy.parameters(), lr=0.1)
        before = snapshot(trainer.policy)
        batch = make_batch(trainer.policy, rewards=(1.0, 0.0, 0.5, 0.5))
        scalars = trainer.step(_widened(batch, 2, 40) if widen else batch)
        return scalars["learner/pg_loss"], {k: v - before[k] for k, v in full_parameters(trainer.policy).items()}

    (narrow_loss, narrow), (wide_loss, wide) = update(False), update(True)
    assert wide_loss == pytest.approx(narrow_loss, rel=1e-5)
    scale = max(v.abs().max().item() for v in narrow.values())
    assert scale > 0 and max((narrow[k] - wide[k]).abs().max().item() for k in narrow) < 1e-4 * scale


# ------------------------------------------------------------------ memory options

# Every loss term and the critic; the sequence mask drops row 2 (see the test above).
MEMORY_CASE = dict(advantage="gae", kl_coef=0.1, entropy_coef=0.01, seq_mask_low=0.5, seq_mask_high=2.0)


def _one_step(model_path: str, learner: dict, loss_agg: str = "token-mean", observe=None):
    norm = {"loss_norm_tokens": 32} if loss_agg == "seq-mean-token-sum-norm" else {}
    trainer = Trainer.build(model_path, "float32",
                            make_cfg(learner=learner, loss_agg=loss_agg, **norm, **MEMORY_CASE), TEMPERATURE)
    # SGD: an update proportional to the gradient. Adam's first step is about lr * sign(g), which
    # would hide a mis-scaled gradient and blow float noise on near-zero entries up to lr.
    trainer.optimizer = torch.optim.SGD(trainer.policy.parameters(), lr=0.1)
    trainer.critic.optimizer = torch.optim.SGD(trainer.critic.model.parameters(), lr=0.1)
    batch = make_batch(trainer.policy, behavior_shift=0.0)
    batch.behavior_logprobs[2] -= 1.0 * LOSS_MASK[2]
    if observe is not None:
        observe(trainer)
    scalars = trainer.step(batch)
    weights = {**{f"policy.{k}": v for k, v in full_parameters(trainer.policy).items()},
               **{f"critic.{k}": v for k, v in full_parameters(trainer.critic.model).items()}}
    return scalars, weights


def _assert_same_update(one, other) -> None:
    (scalars, weights), (other_scalars, other_weights) = one, other
    assert weights.keys() == other_weights.keys()
    assert max((weights[k] - other_weights[k]).abs().max().item() for k in weights) < 1e-5
    assert scalars.keys() == other_scalars.keys()
    for key, value in scalars.items():
        assert other_scalars[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("micro_batch_tokens", [0, 32])
def test_rows_without_a_gradient_skip_their_pass_and_the_update_is_the_same(model_path, monkeypatch,
                                                                           micro_batch_tokens):
    def one_step(skip: bool):
        with monkeypatch.context() as patch:
            if not skip:
                patch.setattr(Trainer, "_skips_rows_without_gradient", property(lambda self: False))
            cfg = make_cfg(learner={"micro_batch_tokens": micro_batch_tokens}, loss_agg="seq-mean-token-mean")
            trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
            trainer.optimizer = torch.optim.SGD(trainer.policy.parameters(), lr=0.1)  # the update is the gradient
            batch = make_batch(trainer.policy, rewards=FLAT_GROUP_REWARDS)
            forwarded = []
            trainer.policy.register_forward_pre_hook(
                lambda module, args, kwargs: forwarded.append(int(kwargs["attention_mask"].sum())), with_kwargs=True)
            scalars = trainer.step(batch)
            return scalars, full_parameters(trainer.policy), sum(forwarded)

    (skipped, skipped_weights, skipped_tokens), (full, full_weights, full_tokens) = one_step(True), one_step(False)
    assert (skipped["learner/trained_rows_frac"], full["learner/trained_rows_frac"]) == (0.5, 1.0)
    assert skipped_tokens == int(LENGTHS[:2].sum()) and full_tokens == int(LENGTHS.sum())
    # The flat group still counts in seq-mean's denominator: the same update, not a larger one.
    assert max((skipped_weights[k] - full_weights[k]).abs().max().item() for k in full_weights) < 1e-6
    assert skipped["optim/grad_norm"] == pytest.approx(full["optim/grad_norm"], rel=1e-5)


def test_micro_batch_plan_keeps_to_the_token_budget():
    lengths = torch.tensor([13, 14, 7, 14, 30, 3])
    plan = plan_micro_batches(lengths, budget_tokens=28)
    assert sorted(torch.cat(plan).tolist()) == list(range(6))  # every row exactly once
    assert [4] in [group.tolist() for group in plan]  # over the budget: alone
    assert all(len(g) * int(lengths[g].max()) <= 28 for g in plan if len(g) > 1)
    assert len(plan) == 4  # [30], [14, 14], [13], [7, 3]
    assert [g.tolist() for g in plan_micro_batches(lengths, 0)] == [list(range(6))]


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_gradient_accumulation_makes_the_same_update(model_path, loss_agg):
    assert len(plan_micro_batches(LENGTHS, 20)) == 4  # one row per micro-batch
    accumulated = _one_step(model_path, {"micro_batch_tokens": 20}, loss_agg)
    _assert_same_update(_one_step(model_path, {}, loss_agg), accumulated)


def test_no_grad_passes_keep_to_the_micro_batch_budget(model_path):
    # Proximal (for the sequence mask), reference and critic passes run before the update; with a
    # budget of 20 tokens each of them, like the update's, sees one 14-token row at a time.
    trainer = Trainer.build(model_path, "float32", make_cfg(learner={"micro_batch_tokens": 20, "width_multiple": 1},
                                                            **MEMORY_CASE), TEMPERATURE)
    batch = make_batch(trainer.policy)
    tokens = _forward_tokens(trainer)
    trainer.step(batch)
    assert all(seen for seen in tokens.values()), tokens
    assert max(max(seen) for seen in tokens.values()) <= 20, tokens


@pytest.mark.parametrize("micro_batch_tokens", [0, 32])
def test_forward_widths_are_rounded_to_the_width_multiple_and_the_update_is_the_same(model_path, micro_batch_tokens):
    # bf16 matmuls on CPU keep memory for every new row count (LearnerConfig.width_multiple): every
    # forward, with or without gradient, sees widths that are multiples of it, and nothing else changes.
    widths = {}
    rounded = _one_step(model_path, {"micro_batch_tokens": micro_batch_tokens, "width_multiple": 8},
                        observe=lambda trainer: widths.update(rounded=_forward_widths(trainer)))
    exact = _one_step(model_path, {"micro_batch_tokens": micro_batch_tokens, "width_multiple": 1},
                      observe=lambda trainer: widths.update(exact=_forward_widths(trainer)))
    _assert_same_update(exact, rounded)
    seen = {name: {width for calls in by_model.values() for width in calls if width > 2}  # 2: a rank's stand-in
            for name, by_model in widths.items()}
    assert seen["rounded"] and all(width % 8 == 0 for width in seen["rounded"]), widths
    assert any(width % 8 for width in seen["exact"]), widths  # LENGTHS are not multiples of 8


def _forward_inputs(trainer: Trainer, measure) -> dict[str, list[int]]:
    """``measure(input_ids)`` of every forward call of the policy, reference and critic, as they happen."""
    seen = {"policy": [], "reference": [], "critic": []}
    for name, module in (("policy", trainer.policy), ("reference", trainer.reference),
                         ("critic", trainer.critic.model)):
        def record(module, args, kwargs, into=seen[name]):
            into.append(measure(kwargs["input_ids"] if "input_ids" in kwargs else args[0]))
        module.register_forward_pre_hook(record, with_kwargs=True)
    return seen


def _forward_tokens(trainer: Trainer) -> dict[str, list[int]]:
    return _forward_inputs(trainer, lambda ids: ids.numel())


def _forward_widths(trainer: Trainer) -> dict[str, list[int]]:
    return _forward_inputs(trainer, lambda ids: ids.shape[1])


def _layer_calls_in_one_step(model_path: str, activation_checkpointing: bool) -> tuple[int, int]:
    """Forward calls of the first decoder layer's MLP of policy and critic in one ``gae`` step
    (inside the checkpointed layer, so a recompute counts)."""
    cfg = make_cfg(learner={"activation_checkpointing": activation_checkpointing}, advantage="gae")
    trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    batch = make_batch(trainer.policy)
    calls = [0, 0]
    for i, layers in enumerate((trainer.policy.model.layers, trainer.critic.model.backbone.layers)):
        mlp = layers[0].mlp
        # Wrap ``forward`` itself: the recompute skips module hooks.
        mlp.forward = _counted(mlp.forward, calls, i)
    trainer.step(batch)
    return tuple(calls)


def _counted(forward, calls: list[int], index: int):
    def wrapper(*args, **kwargs):
        calls[index] += 1
        return forward(*args, **kwargs)
    return wrapper


def test_activation_checkpointing_makes_the_same_update(model_path):
    plain, checkpointed = _layer_calls_in_one_step(model_path, False), _layer_calls_in_one_step(model_path, True)
    assert checkpointed == (plain[0] + 1, plain[1] + 1)  # one recompute in each backward
    _assert_same_update(_one_step(model_path, {}), _one_step(model_path, {"activation_checkpointing": True}))


def test_mixed_precision_computes_in_bfloat16_and_keeps_float32_weights(model_path):
    cfg = make_cfg(learner={"mixed_precision": True}, advantage="gae")
    trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    batch = make_batch(trainer.policy)
    with torch.no_grad():
        logits = trainer.policy(input_ids=batch.token_ids, attention_mask=batch.attention_mask).logits
    assert logits.dtype == torch.bfloat16
    policy_before, critic_before = snapshot(trainer.policy), snapshot(trainer.critic.model)
    scalars = trainer.step(batch)
    assert all(math.isfinite(v) for v in scalars.values()), scalars
    assert changed(policy_before, trainer.policy) and changed(critic_before, trainer.critic.model)
    for module in (trainer.policy, trainer.critic.model):
        assert {v.dtype for v in full_parameters(module).values()} == {torch.float32}


def test_with_mixed_precision_the_kl_to_the_reference_starts_at_zero(model_path):
    cfg = make_cfg(learner={"mixed_precision": True}, kl_coef=0.1)
    trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    scalars = trainer.step(make_batch(trainer.policy))
    assert abs(scalars["learner/kl"]) < 1e-6, scalars  # policy and reference compute alike


def test_negative_micro_batch_budget_is_a_clear_error():
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        LearnerConfig(micro_batch_tokens=-1)


# Every feature that crosses ranks: gathered no-grad passes (proximal, reference, critic),
# batch-wide advantage whitening, global loss denominators (shares of 2, 1 and 1 rows: the
# ranks' token counts differ in the first, rank 1 has no row in the others).
DATA_PARALLEL_CASE = dict(advantage="gae", kl_coef=0.1, minibatches=3, seq_mask_low=0.5)


def _two_steps(trainer: Trainer, rewards: tuple[float, ...] = (1.0, 0.0, 0.0, 1.0)) -> dict[str, torch.Tensor]:
    batch = make_batch(trainer.policy, rewards=rewards)
    for _ in range(2):
        trainer.step(batch)
    weights = {f"policy.{k}": v for k, v in full_parameters(trainer.policy).items()}
    if trainer.critic is not None:
        weights.update({f"critic.{k}": v for k, v in full_parameters(trainer.critic.model).items()})
    return weights


def _data_parallel_cfg(micro_batch_tokens: int, optimizer: str = "adamw") -> LearnerConfig:
    if optimizer == "grpo-sgd":  # no KL or entropy term: rows without a gradient are skipped
        return make_cfg(lr=0.1, learner={"max_grad_norm": 1e9, "micro_batch_tokens": micro_batch_tokens})
    if optimizer == "sgd":  # no clipping: it would hide a gradient off by a constant factor
        return make_cfg(lr=0.1, learner={"max_grad_norm": 1e9}, **DATA_PARALLEL_CASE)
    if not micro_batch_tokens:
        return make_cfg(**DATA_PARALLEL_CASE)
    # One share, dealt by tokens: rank 0 holds rows of 14 and 13 tokens, rank 1 of 14 and 7, two
    # micro-batches each (a stand-in: test_two_ranks_with_uneven_rows_make_the_same_update_as_one).
    return make_cfg(learner={"micro_batch_tokens": micro_batch_tokens}, **{**DATA_PARALLEL_CASE, "minibatches": 1})


def _build_for_data_parallel(model_path: str, cfg: LearnerConfig, optimizer: str) -> Trainer:
    """The trainer, with plain SGD for policy and critic when ``optimizer`` is ``sgd``: AdamW
    divides each gradient by its own scale, so a gradient off by the number of ranks would make
    nearly the same AdamW update; SGD's update is the gradient times the learning rate."""
    trainer = Trainer.build(model_path, "float32", cfg, TEMPERATURE)
    if optimizer.endswith("sgd"):
        trainer.optimizer = torch.optim.SGD(trainer.policy.parameters(), lr=cfg.lr)
        if trainer.critic is not None:
            trainer.critic.optimizer = torch.optim.SGD(trainer.critic.model.parameters(), lr=cfg.lr)
    return trainer


def _train_on_rank(rank: int, world_size: int, port: int, model_path: str, out_file: str,
                   micro_batch_tokens: int, optimizer: str) -> None:
    torch.set_num_threads(1)
    init_process_group(rank, world_size, "127.0.0.1", port)
    cfg = _data_parallel_cfg(micro_batch_tokens, optimizer)
    weights = _two_steps(_build_for_data_parallel(model_path, cfg, optimizer), _rewards_of(optimizer))
    if rank == 0:
        save_file({k: v.contiguous() for k, v in weights.items()}, out_file)
    dist.destroy_process_group()


def _rewards_of(optimizer: str) -> tuple[float, ...]:
    return FLAT_GROUP_REWARDS if optimizer == "grpo-sgd" else (1.0, 0.0, 0.0, 1.0)


@pytest.mark.slow  # two fresh processes importing torch and transformers: ~15 s on 2 cores
@pytest.mark.parametrize(("micro_batch_tokens", "optimizer"),
                         [(0, "adamw"), (26, "adamw"), (0, "sgd"), (0, "grpo-sgd"), (26, "grpo-sgd")])
def test_two_ranks_make_the_same_update_as_one(model_path, tmp_path, micro_batch_tokens, optimizer):
    cfg = dataclasses.replace(_data_parallel_cfg(micro_batch_tokens, optimizer), micro_batch_tokens=0)
    initial = {f"policy.{k}": v for k, v in full_parameters(load_sharded_model(model_path, "float32")).items()}
    one = _two_steps(_build_for_data_parallel(model_path, cfg, optimizer), _rewards_of(optimizer))
    out_file = str(tmp_path / "two_ranks.safetensors")
    mp.spawn(_train_on_rank, args=(2, free_port(), model_path, out_file, micro_batch_tokens, optimizer), nprocs=2,
             join=True)
    two = load_file(out_file)
    assert two.keys() == one.keys()
    worst = max((one[k] - two[k]).abs().max().item() for k in one)
    # SGD's update is the gradient itself; AdamW's two steps amplify float summation-order noise
    # (regrouping micro-batches on one rank already moves it by 1e-5)
    assert worst < (1e-5 if optimizer == "sgd" else 5e-5)
    # The update is large against that bound, so a gradient off by any factor would show.
    assert max((one[k] - initial[k]).abs().max().item() for k in initial) > 1e-3


# Uneven episodes: round-robin would give rank 0 the rows of 31, 30 and 6 tokens (67) and rank 1
# those of 4, 5 and 3 (12); dealt by tokens each rank gets 40 or 39. With a budget of 10 tokens
# rank 0 runs two micro-batches ([31], [5, 4]) and rank 1 three ([30], [6], [3]): rank 0 adds a stand-in.
UNEVEN_LENGTHS = torch.tensor([31, 4, 30, 5, 6, 3])
UNEVEN_CASE = dict(advantage="gae", kl_coef=0.1, minibatches=1, seq_mask_low=0.5)


def _uneven_batch(policy) -> Batch:
    gen = torch.Generator().manual_seed(5)
    width = int(UNEVEN_LENGTHS.max())
    attention_mask = (torch.arange(width)[None, :] < UNEVEN_LENGTHS[:, None]).long()
    loss_mask = (torch.rand(attention_mask.shape, generator=gen) < 0.6).float() * attention_mask
    loss_mask[:, 0] = 0  # the prompt's first token is never sampled
    token_ids = torch.randint(3, 400, attention_mask.shape, generator=gen) * attention_mask
    with torch.no_grad():
        own = token_logprobs(policy(input_ids=token_ids, attention_mask=attention_mask).logits, token_ids, TEMPERATURE)
    return Batch(token_ids=token_ids, attention_mask=attention_mask, loss_mask=loss_mask,
                 behavior_logprobs=(own - 0.1) * loss_mask, token_versions=torch.where(loss_mask.bool(), 0, -1),
                 rewards=torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0]), group_index=torch.tensor([0, 0, 1, 1, 2, 2]),
                 episodes=[])


def _uneven_cfg(micro_batch_tokens: int, optimizer: str, reduce_gradients: str = "once_per_step") -> LearnerConfig:
    # Free widths (no rounding to 64): the token budget of 10 then groups the short rows as planned above.
    learner = {"micro_batch_tokens": micro_batch_tokens, "reduce_gradients": reduce_gradients, "width_multiple": 1}
    if optimizer == "sgd":  # no clipping: it would hide a gradient off by a constant factor
        return make_cfg(lr=0.1, learner={**learner, "max_grad_norm": 1e9}, **UNEVEN_CASE)
    return make_cfg(learner=learner, **UNEVEN_CASE)


def _uneven_steps(trainer: Trainer) -> dict[str, torch.Tensor]:
    batch = _uneven_batch(trainer.policy)
    for _ in range(2):
        trainer.step(batch)
    return {**{f"policy.{k}": v for k, v in full_parameters(trainer.policy).items()},
            **{f"critic.{k}": v for k, v in full_parameters(trainer.critic.model).items()}}


def _train_uneven_on_rank(rank: int, port: int, model_path: str, out_dir: str, optimizer: str,
                          reduce_gradients: str) -> None:
    torch.set_num_threads(1)
    init_process_group(rank, 2, "127.0.0.1", port)
    trainer = _build_for_data_parallel(model_path, _uneven_cfg(10, optimizer, reduce_gradients), optimizer)
    reductions, widths = [], []
    reduce_scatter = dist.reduce_scatter_single
    dist.reduce_scatter_single = lambda *a, **k: reductions.append(1) or reduce_scatter(*a, **k)
    plan = trainer._micro_batches
    trainer._micro_batches = lambda *args: widths.append([(m.width, m.dummy) for m in plan(*args)]) or plan(*args)
    weights = _uneven_steps(trainer)
    dist.reduce_scatter_single = reduce_scatter
    if rank == 0:
        save_file({k: v.contiguous() for k, v in weights.items()}, f"{out_dir}/two_ranks.safetensors")
    groups = sum(isinstance(m, FSDPModule) for m in [*trainer.policy.modules(), *trainer.critic.model.modules()])
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({"reductions": len(reductions), "groups": groups,
                                                                "micro_batches": widths}))
    dist.destroy_process_group()


@pytest.mark.slow  # two fresh processes importing torch and transformers
@pytest.mark.parametrize(("optimizer", "reduce_gradients"),
                         [("sgd", "once_per_step"), ("adamw", "once_per_step"), ("sgd", "every_micro_batch")])
def test_two_ranks_with_uneven_rows_make_the_same_update_as_one(model_path, tmp_path, optimizer, reduce_gradients):
    one = _uneven_steps(_build_for_data_parallel(model_path, _uneven_cfg(0, optimizer), optimizer))
    mp.spawn(_train_uneven_on_rank, args=(free_port(), model_path, str(tmp_path), optimizer, reduce_gradients),
             nprocs=2, join=True)
    two = load_file(tmp_path / "two_ranks.safetensors")
    assert two.keys() == one.keys()
    # SGD's update is the gradient itself; AdamW's two steps amplify float summation-order noise
    # (regrouping micro-batches on one rank already moves it by 1e-5)
    assert max((one[k] - two[k]).abs().max().item() for k in one) < (1e-5 if optimizer == "sgd" else 5e-5)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # the update's micro-batches (the gathered no-grad passes plan theirs too): rank 0 pads with a
    # stand-in of at most two tokens, not a whole row
    update_plans = [rank["micro_batches"][-1] for rank in ranks]
    assert [len(plan) for plan in update_plans] == [3, 3]
    assert [(w, dummy) for w, dummy in update_plans[0] if dummy] == [(2, True)]
    assert not any(dummy for _, dummy in update_plans[1])
    # once_per_step: one gradient reduction per FSDP group per optimizer step (2 steps), not one per
    # micro-batch (3); every_micro_batch: one per micro-batch
    per_step = 1 if reduce_gradients == "once_per_step" else 3
    assert all(rank["reductions"] == 2 * per_step * rank["groups"] for rank in ranks)


def test_rows_are_dealt_to_ranks_balanced_by_tokens():
    dealt = deal_by_tokens(UNEVEN_LENGTHS, 2)
    assert [rows.tolist() for rows in dealt] == [[0, 1, 3], [2, 4, 5]]
    assert [int(UNEVEN_LENGTHS[rows].sum()) for rows in dealt] == [40, 39]  # round-robin: 67 and 12
    # deterministic, every row once, and no rank empty while there are rows enough
    lengths = torch.randint(1, 500, (37,), generator=torch.Generator().manual_seed(0))
    for world_size in (1, 2, 3, 8):
        dealt = deal_by_tokens(lengths, world_size)
        assert sorted(torch.cat(dealt).tolist()) == list(range(37)) and all(len(rows) for rows in dealt)
        assert [r.tolist() for r in dealt] == [r.tolist() for r in deal_by_tokens(lengths, world_size)]
        loads = [int(lengths[rows].sum()) for rows in dealt]
        assert max(loads) - min(loads) <= int(lengths.max())  # greedy longest-first's bound
