"""Policy-gradient losses with off-policy correction (pure tensor functions).

Shapes: ``B`` episodes, ``T`` tokens, ``V`` vocabulary. Per-token tensors are aligned with the
token ids: position ``t`` holds the quantity of token ``t`` as predicted from ``logits[t - 1]``
(position 0 has no prediction and holds 0; the loss mask of a prompt's first token is 0 anyway).

Decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy optimization"; AReaL)
separates three policies:

- *behavior* mu: the (possibly several versions old) policy that sampled the tokens on an actor;
- *proximal* pi_prox: the anchor of the trust region, the learner's policy before this update;
- *current* pi_theta: the policy being optimized.

The loss is ``-w * min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)`` with ``r = pi_theta / pi_prox``
and the importance weight ``w = min(pi_prox / mu, C)`` (truncated, detached) that corrects for
sampling from mu. ``eps_high > eps_low`` is DAPO's clip-higher (arXiv 2503.14476): room for
unlikely tokens with a positive advantage to gain probability. Dual clip (Ye et al. 2020, arXiv
1912.09729; AReaL) bounds the loss of a negative advantage at ``-w * c * A``: without it a token
whose ratio has grown large contributes ``-r * A``, unbounded.

When the learner takes one gradient step per batch, the proximal policy *is* the current one
before the step: pass ``proximal_logprobs = logprobs.detach()``; then ``r == 1``
in value (its gradient is still the policy gradient) and only ``w`` corrects the staleness.
Classic PPO-clip against the behavior policy is the special case ``proximal = behavior``
(``r = pi_theta / mu``, ``w = 1``).

Further terms, all masked to assistant tokens: sequence-level masking by the geometric-mean
ratio proximal / behavior (drop whole episodes the learner would have sampled very
differently), KL to a frozen reference policy (``kl_to_reference``: k2 or k3 as a loss term; k1
only in the reward), an entropy bonus, and the clipped value loss of a critic. ``aggregate_loss``
documents how per-token terms become one scalar.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from common.config.learner import KlEstimator, LossAggregation


def _shift_to_tokens(per_position: torch.Tensor) -> torch.Tensor:
    """[B, T-1] quantities of predictions at positions 0..T-2 -> [B, T] aligned to tokens 1..T-1."""
    return F.pad(per_position, (1, 0), value=0.0)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probability of each token under ``softmax(logits[t - 1] / temperature)``.

    ``logits``: [B, T, V]; ``token_ids``: [B, T] long. Returns [B, T] float32; position 0 is 0.
    The temperature must equal the actors' sampling temperature, or current and behavior
    logprobs describe different distributions. Computed as log_softmax + gather in float32,
    which materializes [B, T, V] float32 tensors: the learner uses it only with
    ``learner.logprob_chunk_tokens: 0``; ``learner/logprobs.py`` computes the same values in chunks.
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


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, mode: LossAggregation,
                   norm_tokens: int = 0) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar over positions where ``mask`` is nonzero.

    - ``token-mean``: sum over all kept tokens / their count; long episodes weigh by length.
    - ``seq-mean-token-mean``: each episode's token mean, then the mean over episodes that have
      a kept token; every episode weighs the same, whatever its length.
    - ``seq-mean-token-sum-norm``: sum over all kept tokens / (B * ``norm_tokens``), a constant
      per row (Dr. GRPO, arXiv 2503.20783, divides by the generation budget): no per-episode length
      division, so short and long episodes get the same per-token weight, and, unlike dividing by
      the padded width T, the weight does not change with the longest episode of the batch.

    Masked positions never reach the result, even if they hold inf or NaN.
    """
    numerator, denominator = aggregate_parts(per_token, mask, mode, norm_tokens)
    return numerator / denominator.clamp(min=1)


def aggregate_parts(per_token: torch.Tensor, mask: torch.Tensor, mode: LossAggregation,
                    norm_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``aggregate_loss`` as (numerator, denominator); both are sums over rows.

    Data-parallel ranks that each hold some rows add up their denominators (no gradient) and
    divide their own numerator by the total: the sum over ranks is then the loss of the whole
    batch, exactly, in every mode.
    """
    if per_token.dim() != 2 or per_token.shape != mask.shape:
        raise ValueError(
            f"per_token and mask must both be [B, T]; got {tuple(per_token.shape)} and {tuple(mask.shape)}"
        )
    if mode not in AGGREGATIONS:
        raise ValueError(f"loss aggregation must be one of {', '.join(AGGREGATIONS)}; got {mode!r}")
    keep = mask.bool()
    return AGGREGATIONS[mode](torch.where(keep, per_token, torch.zeros_like(per_token)), keep, norm_tokens)


def _token_mean(kept: torch.Tensor, keep: torch.Tensor, norm_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    return kept.sum(), keep.sum().to(kept.dtype)


def _seq_mean_token_mean(kept: torch.Tensor, keep: torch.Tensor,
                         norm_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = keep.sum(dim=1)
    return (kept.sum(dim=1) / tokens.clamp(min=1)).sum(), (tokens > 0).sum().to(kept.dtype)


def _seq_mean_token_sum_norm(kept: torch.Tensor, keep: torch.Tensor,
                             norm_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    if norm_tokens <= 0:
        raise ValueError("seq-mean-token-sum-norm divides by rows x norm_tokens (learner.algorithm."
                         f"loss_norm_tokens); need norm_tokens > 0, got {norm_tokens}")
    rows = float(kept.shape[0] * norm_tokens)
    return kept.sum(), torch.tensor(rows, dtype=kept.dtype, device=kept.device)


AGGREGATIONS: dict[LossAggregation, Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]] = {
    "token-mean": _token_mean,
    "seq-mean-token-mean": _seq_mean_token_mean,
    "seq-mean-token-sum-norm": _seq_mean_token_sum_norm,
}
"""``learner.algorithm.loss_agg`` -> ``(kept per-token loss, keep mask, norm_tokens) -> (numerator, denominator)``."""


def _check_same_shape(reference: torch.Tensor, **others: torch.Tensor) -> None:
    for name, other in others.items():
        if other.shape != reference.shape:
            raise ValueError(f"{name} has shape {tuple(other.shape)}, logprobs has {tuple(reference.shape)}")


def ppo_clip_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    is_cap: float,
    loss_agg: LossAggregation = "token-mean",
    clip_eps_high: float | None = None,
    dual_clip_c: float | None = None,
    norm_tokens: int = 0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO-clip loss with a truncated importance weight, aggregated over ``mask``.

    All inputs are [B, T] and aligned (see the module docstring); ``logprobs`` carries the
    gradient, the other inputs are treated as constants. Per token:
    ``r = exp(logprobs - proximal)``, ``w = min(exp(proximal - behavior), is_cap)``,
    ``loss = -w * min(r * A, clip(r, 1 - clip_eps, 1 + clip_eps_high) * A)`` (``clip_eps_high``
    None: ``clip_eps``), and with ``dual_clip_c`` (None: off) where ``A < 0`` at most
    ``-w * dual_clip_c * A``; reduced by ``aggregate_loss(..., loss_agg, norm_tokens)`` (default:
    token-level mean over the batch). Masked
    positions are zeroed *before* any exponential, so garbage there (env tokens with behavior
    logprob 0, padding) changes neither the loss nor the gradient and cannot produce inf/NaN.

    Stats (floats, token means over the mask): ``pg_loss``; ``clip_frac`` (fraction of tokens
    where the clipped term is the smaller one, i.e. clipping zeroes the gradient);
    ``dual_clip_frac`` (fraction of tokens whose loss the dual clip bounds, 0 when off);
    ``is_weight_mean``, ``is_weight_max`` (after the cap); ``approx_kl`` = KL(behavior || current)
    by the k3 estimator ``(q - 1) - log q`` with ``q = pi_theta / mu`` (unbiased under samples
    from mu, always >= 0).
    """
    per_token, stats = ppo_clip_token_losses(logprobs, proximal_logprobs, behavior_logprobs, advantages,
                                             mask, clip_eps, is_cap, clip_eps_high, dual_clip_c)
    loss = aggregate_loss(per_token, mask, loss_agg, norm_tokens)
    return loss, {"pg_loss": float(loss.detach()), **stats}


def ppo_clip_token_losses(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    is_cap: float,
    clip_eps_high: float | None = None,
    dual_clip_c: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The per-token [B, T] loss of ``ppo_clip_loss`` (0 off the mask) and its stats but ``pg_loss``."""
    _check_same_shape(logprobs, proximal_logprobs=proximal_logprobs, behavior_logprobs=behavior_logprobs,
                      advantages=advantages, mask=mask)
    clip_eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not 0 < clip_eps < 1 or not clip_eps_high > 0 or not is_cap > 0:
        raise ValueError(f"need 0 < clip_eps < 1, clip_eps_high > 0 and is_cap > 0; got {clip_eps}, "
                         f"{clip_eps_high} and {is_cap}")
    if dual_clip_c is not None and not dual_clip_c > 1:
        raise ValueError(f"dual_clip_c must be > 1 (or None: off), got {dual_clip_c}")
    keep = mask.bool()
    zero = torch.zeros_like(logprobs)
    proximal = proximal_logprobs.detach()
    behavior = behavior_logprobs.detach()
    adv = torch.where(keep, advantages.detach(), zero)
    ratio = torch.exp(torch.where(keep, logprobs - proximal, zero))
    is_weight = torch.exp(torch.where(keep, proximal - behavior, zero)).clamp(max=is_cap)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps_high) * adv
    objective = torch.minimum(unclipped, clipped)
    dual_clipped = torch.zeros_like(keep)
    if dual_clip_c is not None:
        # For A < 0 the PPO objective r * A falls without bound as r grows; bound it at c * A.
        dual_clipped = keep & (adv < 0) & (objective < dual_clip_c * adv)
        objective = torch.where(dual_clipped, dual_clip_c * adv, objective)
    per_token = torch.where(keep, -is_weight * objective, zero)
    with torch.no_grad():
        log_q = torch.where(keep, logprobs - behavior, zero)
        k3 = torch.expm1(log_q) - log_q
        stats = {
            "clip_frac": float(masked_mean((clipped < unclipped).float(), keep)),
            "dual_clip_frac": float(masked_mean(dual_clipped.float(), keep)),
            "is_weight_mean": float(masked_mean(is_weight, keep)),
            "is_weight_max": _masked_max(is_weight, keep),
            "approx_kl": float(masked_mean(k3, keep)),
        }
    return per_token, stats


def geometric_mean_ratio(
    proximal_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per episode ``exp(mean_t log(pi_prox / mu))`` over its masked tokens -> [B] (1 if none)."""
    _check_same_shape(proximal_logprobs, behavior_logprobs=behavior_logprobs, mask=mask)
    keep = mask.bool()
    log_ratio = torch.where(keep, proximal_logprobs.detach() - behavior_logprobs.detach(),
                            torch.zeros_like(proximal_logprobs))
    return torch.exp(log_ratio.sum(dim=1) / keep.sum(dim=1).clamp(min=1))


def sequence_keep_mask(
    proximal_logprobs: torch.Tensor, behavior_logprobs: torch.Tensor, mask: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Which episodes stay in the loss: geometric-mean ratio within ``[low, high]`` -> [B] bool.

    A bound of 0 is disabled. The geometric mean (GSPO, arXiv 2507.18071; verl's sequence-level
    "geometric" masking) is length-normalized, so one long episode is not masked just for being
    long, the way a product of token ratios would be. Masking the whole episode, not single
    tokens, keeps the credit assignment of the episode consistent. Stats: ``seq_masked_frac``
    (of episodes with an assistant token) and ``seq_ratio_mean``.
    """
    if low < 0 or high < 0 or (0 < high <= low):
        raise ValueError(f"need 0 <= low < high (0 disables a bound), got low={low}, high={high}")
    ratio = geometric_mean_ratio(proximal_logprobs, behavior_logprobs, mask)
    keep = torch.ones_like(ratio, dtype=torch.bool)
    if low > 0:
        keep &= ratio >= low
    if high > 0:
        keep &= ratio <= high
    has_tokens = mask.bool().any(dim=1)
    masked = (~keep & has_tokens).sum()
    stats = {"seq_masked_frac": float(masked / has_tokens.sum().clamp(min=1)),
             "seq_ratio_mean": float(ratio[has_tokens].mean()) if bool(has_tokens.any()) else 1.0}
    return keep, stats


_MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: keeps k3 finite when the policy drifted far from the reference


def kl_to_reference(
    logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor, estimator: KlEstimator
) -> torch.Tensor:
    """Per-token KL estimate between pi = pi_theta and pi_ref at the sampled tokens -> [B, T], 0 off mask.

    With ``r = log pi_ref - log pi`` at a token y sampled from pi (Schulman's k1/k2/k3). The
    gradient flows through ``logprobs`` only (the samples and the reference are constants, as in
    the learner); "follows" below is the expectation of that gradient over y ~ pi, i.e. on-policy
    (with stale samples the expectation is under the behavior policy; the term is not
    importance-weighted). Derivations: d/dlog pi of each estimator times grad log pi, and
    ``E_pi[grad log pi] = 0``.

    - ``k1 = -r``: value an unbiased estimate of KL(pi || ref), high variance, can be negative.
      Gradient ``grad log pi(y)``, zero in expectation: *as a loss term it does not regularise*
      (it only adds noise). Use it in the reward (``kl_in_reward``), where the policy gradient of
      the penalised return carries the KL's gradient.
    - ``k2 = r^2 / 2``: value biased (second order in r, close to KL for nearby policies), >= 0.
      Gradient ``-r * grad log pi``, in expectation ``sum_y grad pi(y) (log pi(y) - log ref(y))``
      = the gradient of the *reverse* KL(pi || ref), the KL the penalty means.
    - ``k3 = exp(r) - 1 - r``: value an unbiased, low-variance estimate of KL(pi || ref), >= 0
      (GRPO's KL term). Gradient ``(1 - ref/pi) grad log pi``, in expectation
      ``-sum_y ref(y) grad log pi(y)`` = the gradient of the *forward* KL(ref || pi), not of the
      KL its value estimates. Both vanish at pi = ref and pull toward it; away from it the forward
      KL covers the reference's mass (it punishes pi ~ 0 where ref > 0) where the reverse KL
      seeks its modes. r is clamped to +-20, which stops the gradient of a token that far off.
    """
    _check_same_shape(logprobs, reference_logprobs=reference_logprobs, mask=mask)
    if estimator not in KL_ESTIMATES:
        raise ValueError(f"kl estimator must be one of {', '.join(KL_ESTIMATES)}; got {estimator!r}")
    keep = mask.bool()
    log_ratio = torch.where(keep, logprobs - reference_logprobs.detach(), torch.zeros_like(logprobs))
    return KL_ESTIMATES[estimator](log_ratio, keep)


def _k1(log_ratio: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return log_ratio


def _k2(log_ratio: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio.square()


def _k3(log_ratio: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    log_q = (-log_ratio).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    return torch.where(keep, torch.expm1(log_q) - log_q, torch.zeros_like(log_ratio))


KL_ESTIMATES: dict[KlEstimator, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": _k1, "k2": _k2, "k3": _k3}
"""``learner.algorithm.kl_estimator`` -> ``(log pi - log ref, 0 off the mask; keep mask) -> [B, T] estimate``."""


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    loss_agg: LossAggregation = "token-mean",
    norm_tokens: int = 0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped critic loss ``0.5 * max((v - R)^2, (v_old + clip(v - v_old, +-eps) - R)^2)``.

    As PPO implementations (OpenAI baselines, OpenRLHF) do: the clipped term stops the critic
    from moving far from the values the advantages were computed with. ``clip_eps == 0`` turns
    clipping off (plain squared error). ``values`` carries the gradient; ``old_values`` and
    ``returns`` are constants. Stats: ``value_loss``, ``value_clip_frac`` (tokens where the
    clipped term is the larger one), ``value_mean``, ``value_error`` (mean |v - R|).
    """
    per_token, stats = value_token_losses(values, old_values, returns, mask, clip_eps)
    loss = aggregate_loss(per_token, mask, loss_agg, norm_tokens)
    return loss, {"value_loss": float(loss.detach()), **stats}


def value_token_losses(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """The per-token [B, T] loss of ``value_loss`` (0 off the mask) and its stats but ``value_loss``."""
    _check_same_shape(values, old_values=old_values, returns=returns, mask=mask)
    if clip_eps < 0:
        raise ValueError(f"value clip must be >= 0, got {clip_eps}")
    keep = mask.bool()
    zero = torch.zeros_like(values)
    kept_values = torch.where(keep, values, zero)
    returns = torch.where(keep, returns.detach(), zero)
    unclipped = (kept_values - returns).square()
    per_token = unclipped
    if clip_eps > 0:
        old = torch.where(keep, old_values.detach(), zero)
        clipped = (old + (kept_values - old).clamp(-clip_eps, clip_eps) - returns).square()
        per_token = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        stats = {
            "value_clip_frac": float(masked_mean((per_token > unclipped).float(), keep)),
            "value_mean": float(masked_mean(values, keep)),
            "value_error": float(masked_mean((values - returns).abs(), keep)),
        }
    return 0.5 * per_token, stats
