"""Losses: token logprobs, entropy, and decoupled PPO with truncated importance sampling."""

import math

import pytest
import torch

from learner.losses import entropy_from_logits, masked_mean, ppo_clip_loss, token_logprobs

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


def test_loss_arguments_are_validated():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(x, x, x, torch.zeros(1, 3), x, 0.2, 2.0)
    with pytest.raises(ValueError, match="is_cap"):
        ppo_clip_loss(x, x, x, x, x, 0.2, 0.0)
