"""Policy-gradient losses with off-policy correction (pure tensor functions).

Shapes: ``B`` episodes, ``T`` tokens, ``V`` vocabulary. Per-token tensors are aligned with the
token ids: position ``t`` holds the quantity of token ``t`` as predicted from ``logits[t - 1]``
(position 0 has no prediction and holds 0; the loss mask of a prompt's first token is 0 anyway).

Decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy optimization"; AReaL)
separates three policies:

- *behavior* mu: the (possibly several versions old) policy that sampled the tokens on an actor;
- *proximal* pi_prox: the anchor of the trust region, the learner's policy before this update;
- *current* pi_theta: the policy being optimized.

The loss is ``-w * min(r * A, clip(r, 1 - eps, 1 + eps) * A)`` with ``r = pi_theta / pi_prox``
and the importance weight ``w = min(pi_prox / mu, C)`` (truncated, detached) that corrects for
sampling from mu. When the learner takes one gradient step per batch, the proximal policy *is*
the current one before the step: pass ``proximal_logprobs = logprobs.detach()``; then ``r == 1``
in value (its gradient is still the policy gradient) and only ``w`` corrects the staleness.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _shift_to_tokens(per_position: torch.Tensor) -> torch.Tensor:
    """[B, T-1] quantities of predictions at positions 0..T-2 -> [B, T] aligned to tokens 1..T-1."""
    return F.pad(per_position, (1, 0), value=0.0)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probability of each token under ``softmax(logits[t - 1] / temperature)``.

    ``logits``: [B, T, V]; ``token_ids``: [B, T] long. Returns [B, T] float32; position 0 is 0.
    The temperature must equal the actors' sampling temperature, or current and behavior
    logprobs describe different distributions. Computed as log_softmax + gather in float32,
    which materializes one [B, T, V] float32 tensor (chunk the batch for large vocabularies).
    """
    if logits.dim() != 3 or token_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"logits must be [B, T, V] and token_ids [B, T]; got {tuple(logits.shape)} "
            f"and {tuple(token_ids.shape)}"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    log_probs = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    picked = log_probs.gather(-1, token_ids[:, 1:, None].long()).squeeze(-1)
    return _shift_to_tokens(picked)


def entropy_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy of ``softmax(logits[t - 1] / temperature)``, aligned like ``token_logprobs``.

    ``logits``: [B, T, V]. Returns [B, T] float32 (nats); position 0 is 0.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, T, V], got {tuple(logits.shape)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    log_probs = F.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
    return _shift_to_tokens(entropy)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is nonzero; 0 (not NaN) for an empty mask.

    Values at masked-out positions never reach the result, even if they are inf or NaN.
    """
    if x.shape != mask.shape:
        raise ValueError(f"x and mask must have the same shape; got {tuple(x.shape)} and {tuple(mask.shape)}")
    keep = mask.bool()
    total = torch.where(keep, x, torch.zeros_like(x)).sum()
    return total / keep.sum().clamp(min=1)


def _masked_max(x: torch.Tensor, keep: torch.Tensor) -> float:
    return float(x[keep].max()) if bool(keep.any()) else 0.0


def ppo_clip_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    is_cap: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO-clip loss with a truncated importance weight, token-mean over ``mask``.

    All inputs are [B, T] and aligned (see the module docstring); ``logprobs`` carries the
    gradient, the other inputs are treated as constants. Per token:
    ``r = exp(logprobs - proximal)``, ``w = min(exp(proximal - behavior), is_cap)``,
    ``loss = -w * min(r * A, clip(r, 1 - clip_eps, 1 + clip_eps) * A)``.
    The result is the mean over all tokens with ``mask != 0`` in the batch (token-level mean,
    so long episodes weigh by their token count). Masked positions are zeroed *before* any
    exponential, so garbage there (env tokens with behavior logprob 0, padding) changes neither
    the loss nor the gradient and cannot produce inf/NaN.

    Stats (floats, masked): ``pg_loss``; ``clip_frac`` (fraction of tokens where the clipped term
    is the smaller one, i.e. clipping zeroes the gradient); ``is_weight_mean``, ``is_weight_max``
    (after the cap); ``approx_kl`` = KL(behavior || current) by the k3 estimator
    ``(q - 1) - log q`` with ``q = pi_theta / mu`` (unbiased under samples from mu, always >= 0).
    """
    shape = logprobs.shape
    for name, other in (("proximal_logprobs", proximal_logprobs), ("behavior_logprobs", behavior_logprobs),
                        ("advantages", advantages), ("mask", mask)):
        if other.shape != shape:
            raise ValueError(f"{name} has shape {tuple(other.shape)}, logprobs has {tuple(shape)}")
    if not clip_eps > 0 or not is_cap > 0:
        raise ValueError(f"clip_eps and is_cap must be > 0, got {clip_eps} and {is_cap}")
    keep = mask.bool()
    zero = torch.zeros_like(logprobs)
    proximal = proximal_logprobs.detach()
    behavior = behavior_logprobs.detach()
    adv = torch.where(keep, advantages.detach(), zero)
    ratio = torch.exp(torch.where(keep, logprobs - proximal, zero))
    is_weight = torch.exp(torch.where(keep, proximal - behavior, zero)).clamp(max=is_cap)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    per_token = -is_weight * torch.minimum(unclipped, clipped)
    loss = masked_mean(per_token, keep)
    with torch.no_grad():
        log_q = torch.where(keep, logprobs - behavior, zero)
        k3 = torch.expm1(log_q) - log_q
        stats = {
            "pg_loss": float(loss),
            "clip_frac": float(masked_mean((clipped < unclipped).float(), keep)),
            "is_weight_mean": float(masked_mean(is_weight, keep)),
            "is_weight_max": _masked_max(is_weight, keep),
            "approx_kl": float(masked_mean(k3, keep)),
        }
    return loss, stats
