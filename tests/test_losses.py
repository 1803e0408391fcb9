"""Losses: logprobs, entropy, decoupled PPO with truncated IS, sequence masking, KL, value, aggregation."""

import math
import typing

import pytest
import torch
import torch.nn.functional as F

from common.config.learner import KlEstimator, LossAggregation
from learner.losses import (
    AGGREGATIONS,
    KL_ESTIMATES,
    aggregate_loss,
    entropy_from_logits,
    geometric_mean_ratio,
    kl_to_reference,
    masked_mean,
    ppo_clip_loss,
    ppo_clip_token_losses,
    sequence_keep_mask,
    token_logprobs,
    value_loss,
)

LN3 = math.log(3.0)


def _two_step_logits() -> torch.Tensor:
    # temperature 2: position 0 -> probs [1/4, 3/4]; position 1 -> [1/2, 1/2]; position 2 unused
    return torch.tensor([[[0.0, 2 * LN3], [5.0, 5.0], [100.0, -100.0]]])


def test_token_logprobs_shift_and_temperature():
    logprobs = token_logprobs(_two_step_logits(), torch.tensor([[0, 1, 0]]), temperature=2.0)
    expected = torch.tensor([[0.0, math.log(0.75), math.log(0.5)]])
    assert torch.allclose(logprobs, expected)


def test_entropy_aligned_like_token_logprobs():
    entropy = entropy_from_logits(_two_step_logits(), temperature=2.0)
    quarter = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert torch.allclose(entropy, torch.tensor([[0.0, quarter, math.log(2.0)]]))


def test_bad_shapes_and_temperature_are_rejected():
    with pytest.raises(ValueError, match="token_ids"):
        token_logprobs(torch.zeros(1, 3, 2), torch.zeros(1, 2, dtype=torch.long), 1.0)
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(torch.zeros(1, 3, 2), 0.0)


def test_masked_mean_ignores_masked_garbage_and_empty_mask_is_zero():
    x = torch.tensor([1.0, 3.0, float("nan"), float("inf")])
    assert masked_mean(x, torch.tensor([1, 1, 0, 0])).item() == 2.0
    assert masked_mean(x, torch.zeros(4)).item() == 0.0


def _hand_case():
    """Three assistant tokens and one masked env token with garbage values.

    token 0: r = 1.5, w = 1,    A = +1 -> clipped term 1.2 wins   -> loss -1.2
    token 1: r = 0.5, w = 1.25, A = +1 -> unclipped 0.5 wins      -> loss -0.625
    token 2: r = 0.5, w = 3 -> C = 2, A = -2 -> clipped -1.6 wins -> loss +3.2
    """
    proximal = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    logprobs = (proximal + torch.log(torch.tensor([[1.5, 0.5, 0.5, 1.0]])))
    logprobs[0, 3] = 80.0  # garbage on the env token
    behavior = proximal - torch.log(torch.tensor([[1.0, 1.25, 3.0, 1.0]]))
    behavior[0, 3] = float("nan")
    advantages = torch.tensor([[1.0, 1.0, -2.0, float("inf")]])
    mask = torch.tensor([[1, 1, 1, 0]])
    return logprobs.requires_grad_(True), proximal, behavior, advantages, mask


def test_ppo_clip_loss_hand_computed_value_grad_and_stats():
    logprobs, proximal, behavior, advantages, mask = _hand_case()
    loss, stats = ppo_clip_loss(logprobs, proximal, behavior, advantages, mask, clip_eps=0.2, is_cap=2.0)
    loss.backward()
    assert loss.item() == pytest.approx((-1.2 - 0.625 + 3.2) / 3)
    # clipped tokens (0 and 2) get no gradient; token 1: d/dlogp of -w * r * A = -w * r * A
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, -1.25 * 0.5 / 3, 0.0, 0.0]]))
    assert stats["pg_loss"] == pytest.approx(loss.item())
    assert stats["clip_frac"] == pytest.approx(2 / 3)
    assert stats["is_weight_mean"] == pytest.approx((1 + 1.25 + 2) / 3)
    assert stats["is_weight_max"] == pytest.approx(2.0)
    kl_terms = [q - 1 - math.log(q) for q in (1.5, 0.5 * 1.25, 0.5 * 3.0)]  # q = pi / mu
    assert stats["approx_kl"] == pytest.approx(sum(kl_terms) / 3, rel=1e-5)


def test_truncated_weight_is_capped_at_c():
    logprobs = torch.zeros(1, 2, requires_grad=True)
    behavior = torch.tensor([[-10.0, -0.1]])  # proximal / behavior = e^10 and e^0.1
    loss, stats = ppo_clip_loss(logprobs, logprobs.detach(), behavior, torch.ones(1, 2), torch.ones(1, 2),
                                clip_eps=0.2, is_cap=1.5)
    loss.backward()
    assert stats["is_weight_max"] == pytest.approx(1.5)
    assert stats["clip_frac"] == 0.0  # r == 1 is inside the trust region
    assert torch.allclose(logprobs.grad, -torch.tensor([[1.5, math.exp(0.1)]]) / 2)


def test_masked_positions_change_neither_loss_nor_grad():
    gen = torch.Generator().manual_seed(0)
    shape = (3, 7)
    base = [torch.randn(shape, generator=gen) - 1.0 for _ in range(4)]
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0], [1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 0, 0, 0]])

    def run(values):
        logprobs = values[0].clone().requires_grad_(True)
        loss, stats = ppo_clip_loss(logprobs, values[1], values[2], values[3], mask, clip_eps=0.2, is_cap=2.0)
        loss.backward()
        return loss.detach(), logprobs.grad, stats

    loss_a, grad_a, stats_a = run(base)
    garbage = [torch.where(mask.bool(), v, torch.full(shape, fill)) for v, fill in
               zip(base, (500.0, -500.0, float("nan"), float("inf")))]
    loss_b, grad_b, stats_b = run(garbage)
    assert torch.equal(loss_a, loss_b)
    assert torch.equal(grad_a, grad_b)
    assert stats_a == stats_b
    assert torch.all(grad_b[~mask.bool()] == 0)


def test_importance_correction_recovers_the_on_policy_gradient():
    """Samples from a stale behavior policy mu: only the IS-weighted loss has the right gradient."""
    theta0 = torch.tensor([1.0, 0.0, -0.5, 0.5])  # current policy pi = softmax(theta)
    mu = torch.tensor([0.25, 0.35, 0.25, 0.15])  # pi / mu <= 1.84, below the cap C = 2
    action_adv = torch.tensor([1.0, -1.0, 2.0, -0.5])
    actions = torch.multinomial(mu, 20_000, replacement=True, generator=torch.Generator().manual_seed(0))

    def grad_of(loss_fn):
        theta = theta0.clone().requires_grad_(True)
        loss_fn(theta).backward()
        return theta.grad

    def sampled_loss(theta, corrected):
        logprobs = theta.log_softmax(-1)[actions][None]
        behavior = mu.log()[actions][None] if corrected else logprobs.detach()  # weight 1 if not
        loss, _ = ppo_clip_loss(logprobs, logprobs.detach(), behavior, action_adv[actions][None],
                                torch.ones_like(logprobs), clip_eps=0.2, is_cap=2.0)
        return loss

    exact = grad_of(lambda theta: -(theta.softmax(-1) * action_adv).sum())  # -grad E_pi[A]
    corrected = grad_of(lambda theta: sampled_loss(theta, True))
    uncorrected = grad_of(lambda theta: sampled_loss(theta, False))
    assert (corrected - exact).norm() < 0.03  # sampling noise is ~0.004 at 20k samples
    assert (uncorrected - exact).norm() > 0.3  # the bias of ignoring mu is ~0.4


def _one_token_losses(ratio, advantage, **clips):
    """Per-token losses of tokens with these ratios to the proximal policy (weight 1)."""
    proximal = torch.full((1, len(ratio)), -1.0)
    logprobs = proximal + torch.tensor([ratio]).log()
    per_token, stats = ppo_clip_token_losses(logprobs, proximal, proximal, torch.tensor([advantage]),
                                             torch.ones_like(proximal), is_cap=2.0, **clips)
    return per_token[0], stats


def test_dual_clip_caps_a_negative_advantage_at_c_times_a_and_changes_nothing_else():
    ratio, advantage = [10.0, 10.0, 2.0, 0.5], [-1.5, 1.0, -1.0, -1.0]
    plain, plain_stats = _one_token_losses(ratio, advantage, clip_eps=0.2)
    dual, dual_stats = _one_token_losses(ratio, advantage, clip_eps=0.2, dual_clip_c=3.0)
    # token 0: r = 10 > c with A < 0: PPO's loss -r * A grows without bound; the dual clip stops it at -c * A
    assert plain[0] == pytest.approx(-10.0 * -1.5) and dual[0] == pytest.approx(-3.0 * -1.5)
    assert torch.equal(dual[1:], plain[1:])  # A > 0, or r below c: untouched
    assert dual_stats["dual_clip_frac"] == pytest.approx(1 / 4) and plain_stats["dual_clip_frac"] == 0.0


def test_clip_higher_raises_only_the_upper_bound_for_positive_advantages():
    ratio, advantage = [1.25, 1.4, 0.7, 1.25], [1.0, 1.0, -1.0, -1.0]
    symmetric, _ = _one_token_losses(ratio, advantage, clip_eps=0.2)
    higher, _ = _one_token_losses(ratio, advantage, clip_eps=0.2, clip_eps_high=0.28)
    assert symmetric[0] == pytest.approx(-1.2) and higher[0] == pytest.approx(-1.25)  # inside 1 + eps_high now
    assert symmetric[1] == pytest.approx(-1.2) and higher[1] == pytest.approx(-1.28)  # clipped at 1 + eps_high
    assert torch.equal(higher[2:], symmetric[2:])  # the lower bound 1 - eps_low and A < 0 are unchanged
    lower, _ = _one_token_losses(ratio, advantage, clip_eps=0.1, clip_eps_high=0.2)
    assert lower[2] == pytest.approx(0.9) and lower[1] == pytest.approx(-1.2)


def test_loss_arguments_are_validated():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(x, x, x, torch.zeros(1, 3), x, 0.2, 2.0)
    with pytest.raises(ValueError, match="is_cap"):
        ppo_clip_loss(x, x, x, x, x, 0.2, 0.0)


NAN = float("nan")


def test_aggregation_modes_hand_computed():
    per_token = torch.tensor([[1.0, 2.0, 3.0, NAN], [10.0, 0.0, 0.0, 0.0], [NAN, NAN, NAN, NAN]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    assert aggregate_loss(per_token, mask, "token-mean").item() == pytest.approx(16 / 4)
    # episode means 2 and 10; the episode without tokens does not count
    assert aggregate_loss(per_token, mask, "seq-mean-token-mean").item() == pytest.approx(6.0)
    # token sum over B rows times the constant normaliser (Dr. GRPO), here 3 * 8
    assert aggregate_loss(per_token, mask, "seq-mean-token-sum-norm", norm_tokens=8).item() == pytest.approx(16 / 24)
    with pytest.raises(ValueError, match="norm_tokens"):
        aggregate_loss(per_token, mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="token-mean"):
        aggregate_loss(per_token, mask, "sum")


def test_sum_norm_aggregation_does_not_depend_on_how_wide_the_batch_is_padded():
    # The same rows, padded to the width of a short batch and to that of a batch with a long row:
    # the loss and each token's gradient must not change (a padded width in the normaliser would
    # scale the learning rate by the longest episode of the batch).
    gen = torch.Generator().manual_seed(0)
    values, mask = torch.randn(2, 5, generator=gen), torch.tensor([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0]])

    def loss_and_grad(width):
        logprobs = F.pad(values, (0, width - 5)).requires_grad_(True)
        wide_mask = F.pad(mask, (0, width - 5))
        loss, _ = ppo_clip_loss(logprobs, logprobs.detach(), logprobs.detach(), torch.ones_like(logprobs),
                                wide_mask, clip_eps=0.2, is_cap=2.0, loss_agg="seq-mean-token-sum-norm",
                                norm_tokens=64)
        loss.backward()
        return loss.detach(), logprobs.grad[:, :5]

    (narrow_loss, narrow_grad), (wide_loss, wide_grad) = loss_and_grad(5), loss_and_grad(40)
    assert wide_loss == pytest.approx(narrow_loss.item()) and torch.allclose(wide_grad, narrow_grad)


def test_seq_mean_aggregation_weighs_episodes_not_tokens_in_the_gradient():
    logprobs = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    loss, _ = ppo_clip_loss(logprobs, logprobs.detach(), logprobs.detach(), torch.ones(2, 4), mask,
                            clip_eps=0.2, is_cap=2.0, loss_agg="seq-mean-token-mean")
    loss.backward()
    # each episode has weight 1/2, spread over its own tokens
    assert torch.allclose(logprobs.grad, -torch.tensor([[1 / 8] * 4, [1 / 2, 0, 0, 0]]))


def test_classic_ppo_clips_against_the_behavior_policy():
    behavior = torch.tensor([[-1.0, -2.0]])
    logprobs = (behavior + torch.log(torch.tensor([[1.5, 0.5]]))).requires_grad_(True)
    loss, stats = ppo_clip_loss(logprobs, behavior, behavior, torch.ones(1, 2), torch.ones(1, 2),
                                clip_eps=0.2, is_cap=2.0)
    loss.backward()
    # r = pi / mu = 1.5 (clipped to 1.2, no gradient) and 0.5 (unclipped); no separate weight
    assert loss.item() == pytest.approx(-(1.2 + 0.5) / 2)
    assert torch.allclose(logprobs.grad, torch.tensor([[0.0, -0.5 / 2]]))
    assert stats["is_weight_mean"] == 1.0 and stats["clip_frac"] == 0.5


def _ratio_rows():
    """Per-token log(prox / behavior) of four episodes; row 3 has no assistant token."""
    log_ratio = torch.tensor([[0.1, 0.3, 0.0, 0.0], [-1.0, -1.0, -1.0, 0.0],
                              [2.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    behavior = torch.full((4, 4), -2.0)
    return behavior + log_ratio, behavior, mask


def test_geometric_mean_ratio_is_length_normalized():
    proximal, behavior, mask = _ratio_rows()
    ratio = geometric_mean_ratio(proximal, behavior, mask)
    assert torch.allclose(ratio, torch.tensor([math.exp(0.2), math.exp(-1.0), math.exp(0.5), 1.0]))
    # 40 tokens each 5% more likely: a product ratio of e^2, but a geometric mean of e^0.05
    long_row = geometric_mean_ratio(torch.full((1, 40), 0.05), torch.zeros(1, 40), torch.ones(1, 40))
    assert long_row.item() == pytest.approx(math.exp(0.05))


def test_sequence_mask_drops_whole_episodes_outside_the_bounds():
    proximal, behavior, mask = _ratio_rows()
    keep, stats = sequence_keep_mask(proximal, behavior, mask, low=0.5, high=1.5)
    assert keep.tolist() == [True, False, False, True]
    assert stats["seq_masked_frac"] == pytest.approx(2 / 3)  # of the 3 episodes with tokens
    keep_high_only, _ = sequence_keep_mask(proximal, behavior, mask, low=0.0, high=1.5)
    assert keep_high_only.tolist() == [True, True, False, True]
    keep_all, stats_off = sequence_keep_mask(proximal, behavior, mask, low=0.0, high=0.0)
    assert keep_all.all() and stats_off["seq_masked_frac"] == 0.0
    with pytest.raises(ValueError, match="low < high"):
        sequence_keep_mask(proximal, behavior, mask, low=1.5, high=0.5)


def test_kl_estimators_hand_computed_with_gradient():
    logprobs = torch.tensor([[math.log(0.5), 3.0]], requires_grad=True)
    reference = torch.tensor([[math.log(0.25), NAN]])
    mask = torch.tensor([[1, 0]])
    k1 = kl_to_reference(logprobs, reference, mask, "k1")
    assert torch.allclose(k1, torch.tensor([[math.log(2.0), 0.0]]))
    k3 = kl_to_reference(logprobs, reference, mask, "k3")
    assert torch.allclose(k3, torch.tensor([[0.5 - 1 - math.log(0.5), 0.0]]))  # q = ref / pi = 0.5
    k3.sum().backward()
    assert torch.allclose(logprobs.grad, torch.tensor([[1 - 0.5, 0.0]]))  # d/dlogp = 1 - q
    k2 = kl_to_reference(logprobs, reference, mask, "k2")
    assert torch.allclose(k2, torch.tensor([[0.5 * math.log(2.0) ** 2, 0.0]]))  # half the squared log ratio
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_to_reference(logprobs, reference, mask, "k4")


def _categorical_kl_problem():
    """A 4-way categorical policy softmax(theta) and a fixed reference distribution."""
    theta = torch.tensor([1.0, 0.0, -1.0, 0.5])
    reference = torch.tensor([-0.5, 0.8, 0.2, 0.0]).log_softmax(-1)

    def reverse_kl(t):  # KL(pi || ref)
        logp = t.log_softmax(-1)
        return (logp.exp() * (logp - reference)).sum()

    def forward_kl(t):  # KL(ref || pi)
        return (reference.exp() * (reference - t.log_softmax(-1))).sum()

    return theta, reference, reverse_kl, forward_kl


def _expected_kl_term_gradient(theta, reference, estimator):
    """Gradient of the KL loss term in expectation over on-policy samples y ~ pi (every category,
    weighted by its probability, as a large on-policy batch averages it; the samples carry no
    gradient, only their logprobs do, as in the learner)."""
    theta = theta.clone().requires_grad_(True)
    logprobs = theta.log_softmax(-1)[None]
    kl = kl_to_reference(logprobs, reference[None], torch.ones_like(logprobs), estimator)
    (logprobs.exp().detach() * kl).sum().backward()
    return theta.grad


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_k2_and_k3_loss_terms_pull_the_policy_toward_the_reference(estimator):
    theta, reference, reverse_kl, forward_kl = _categorical_kl_problem()
    grad = _expected_kl_term_gradient(theta, reference, estimator)
    stepped = theta - 0.5 * grad  # one SGD step on the KL term alone
    assert reverse_kl(stepped) < reverse_kl(theta) and forward_kl(stepped) < forward_kl(theta)
    # which divergence each one's gradient follows (the docstring of kl_to_reference)
    followed = reverse_kl if estimator == "k2" else forward_kl
    exact = torch.autograd.functional.jacobian(followed, theta)
    assert torch.allclose(grad, exact, atol=1e-6)
    other = forward_kl if estimator == "k2" else reverse_kl
    assert not torch.allclose(grad, torch.autograd.functional.jacobian(other, theta), atol=1e-3)


def test_k1_as_a_loss_term_has_no_expected_gradient():
    theta, reference, reverse_kl, _ = _categorical_kl_problem()
    assert reverse_kl(theta) > 0.1  # far from the reference, yet:
    assert torch.allclose(_expected_kl_term_gradient(theta, reference, "k1"), torch.zeros(4), atol=1e-7)


def test_k3_is_unbiased_nonnegative_and_lower_variance_than_k1():
    pi = torch.tensor([0.4, 0.3, 0.2, 0.1])
    ref = torch.tensor([0.25, 0.25, 0.25, 0.25])
    exact = float((pi * (pi / ref).log()).sum())
    actions = torch.multinomial(pi, 20_000, replacement=True, generator=torch.Generator().manual_seed(0))
    logp, ref_logp, mask = pi.log()[actions][None], ref.log()[actions][None], torch.ones(1, 20_000)
    k1 = kl_to_reference(logp, ref_logp, mask, "k1")
    k3 = kl_to_reference(logp, ref_logp, mask, "k3")
    assert k1.mean().item() == pytest.approx(exact, abs=0.01)
    assert k3.mean().item() == pytest.approx(exact, abs=0.01)
    assert bool((k3 >= 0).all()) and not bool((k1 >= 0).all())
    assert k3.var().item() < 0.5 * k1.var().item()


def test_value_loss_clipped_hand_computed():
    values = torch.tensor([[1.0, 0.0, NAN]], requires_grad=True)
    old_values = torch.tensor([[0.5, 0.0, NAN]])
    returns = torch.tensor([[2.0, 1.0, NAN]])
    mask = torch.tensor([[1, 1, 0]])
    loss, stats = value_loss(values, old_values, returns, mask, clip_eps=0.2)
    loss.backward()
    # token 0: unclipped (1 - 2)^2 = 1, clipped (0.7 - 2)^2 = 1.69 -> 1.69; token 1: 1
    assert loss.item() == pytest.approx(0.5 * (1.69 + 1.0) / 2)
    # token 0 moved past the clip range: the clipped term wins and passes no gradient
    assert torch.allclose(values.grad, torch.tensor([[0.0, -0.5, 0.0]]))
    assert stats["value_clip_frac"] == 0.5 and stats["value_error"] == pytest.approx(1.0)
    unclipped, _ = value_loss(values.detach(), old_values, returns, mask, clip_eps=0.0)
    assert unclipped.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)


def test_each_aggregation_and_kl_estimator_the_config_offers_is_implemented_once():
    assert list(AGGREGATIONS) == list(typing.get_args(LossAggregation))
    assert list(KL_ESTIMATES) == list(typing.get_args(KlEstimator))
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"):
        aggregate_loss(torch.zeros(1, 2), torch.ones(1, 2), "seq-sum")
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_to_reference(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), "k4")
