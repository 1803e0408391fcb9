"""Advantage estimation for outcome-rewarded multi-turn episodes (pure tensor functions).

Shapes: ``B`` episodes, ``T`` tokens per (padded) episode. ``loss_mask[b, t] == 1`` marks a
token the policy sampled (an assistant token); 0 marks prompt, environment observation and
padding tokens. Every function here returns zeros at masked positions, so nothing is ever
credited to a token the policy did not produce.

Estimators (``learner.algorithm.advantage``; ``ADVANTAGE_ESTIMATORS`` maps each name to its function,
registered with ``register_advantage_estimator``; its settings are keys of the ``learner.algorithm`` section
of its name, ``common/config/learner.py``):

- GRPO (DeepSeekMath, arXiv 2402.03300): an episode's outcome reward normalized within its
  group (the ``group_size`` episodes of one task lease), broadcast to all its assistant tokens
  (with an outcome reward and gamma = 1 every assistant token's return is the outcome).
- RLOO (Ahmadian et al. 2024, arXiv 2402.14740): the reward minus the mean reward of the
  *other* episodes of its group, broadcast the same way.
- REINFORCE++ (Hu 2025, arXiv 2501.03262; OpenRLHF): per-token rewards (each turn's reward on
  the last assistant token of that turn, see below; optionally minus ``kl_coef * KL`` on every
  assistant token), discounted returns-to-go, then whitened with the mean and std of *all*
  assistant tokens in the batch.
- GAE (Schulman et al. 2016) with a learned value per assistant token (PPO with a critic).
- GiGPO (Feng et al. 2025, arXiv 2505.10978): GRPO's episode advantage plus a *step* advantage
  for each turn: the turns of one group that answered the same observation (an anchor state)
  form a step group, and a turn's discounted return-to-go (of the turn rewards placed as below) is
  normalized within it. Two turns from the same state that did different things are compared
  directly, so credit goes to the action that was good *there*, not to whatever action is common
  in won episodes; no critic.

Multi-turn episodes interleave assistant turns with environment observations. The return and
TD recursions run over assistant tokens only: the env tokens between two turns belong to the
transition from the last token of one turn to the first token of the next, so they carry no
reward, no value and no discount step (gamma applies once per assistant token). The value of
the first token of the next turn is predicted from a prefix that includes the observation,
which is how the critic sees what the environment answered. The episode ends after its last
assistant token (value 0 beyond it); a truncated episode is not bootstrapped.

Where rewards land (REINFORCE++, GAE): an env that pays along the way (SciWorld pays progress
every step) has its reward for turn k placed on the last assistant token of turn k
(``turn_token_rewards``), so a token's return holds the rewards of its own and later turns only,
discounted from where they were earned. The per-turn rewards are first made to sum to the episode
reward the other estimators train on (``turn_rewards_summing_to``: the env's sum clipped to
[0, 1], minus the format penalty), scaling every turn alike when the clip cut the sum. A batch
recorded before per-turn rewards were sent puts the episode reward on the last assistant token
(``outcome_token_rewards``), which is the same thing for an env that pays only at the end.
GiGPO's step returns are of the same ``turn_rewards_summing_to`` turn rewards (it has no fallback:
it needs every turn's reward and observation).
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from common.config.learner import GaeAlgorithm, GigpoAlgorithm, GrpoAlgorithm, ReinforcePpAlgorithm, RlooAlgorithm
from learner.losses import masked_mean

if typing.TYPE_CHECKING:
    from learner.turns import BatchTurns


def _check_batch(loss_mask: torch.Tensor, per_episode: torch.Tensor, name: str) -> None:
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must be [B, T], got shape {tuple(loss_mask.shape)}")
    if per_episode.dim() != 1 or per_episode.shape[0] != loss_mask.shape[0]:
        raise ValueError(
            f"{name} must be [B] with B={loss_mask.shape[0]} (rows of loss_mask), "
            f"got shape {tuple(per_episode.shape)}"
        )


def last_assistant_index(loss_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T] -> [B]`` long: index of the last token with ``loss_mask == 1``; -1 if none."""
    if loss_mask.dim() != 2:
        raise ValueError(f"loss_mask must be [B, T], got shape {tuple(loss_mask.shape)}")
    positions = torch.arange(loss_mask.shape[1], device=loss_mask.device).expand_as(loss_mask)
    is_assistant = loss_mask.bool()
    # -1 where not assistant, so the row max is the last assistant position (or -1).
    return torch.where(is_assistant, positions, torch.full_like(positions, -1)).max(dim=1).values


def outcome_token_rewards(rewards: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Place each episode's outcome reward on its last assistant token.

    ``rewards``: [B] float; ``loss_mask``: [B, T] (0/1 or bool). Returns [B, T] in the dtype of
    ``rewards``: zero everywhere except the last assistant token of each row. Environment tokens
    that follow the final assistant turn (e.g. the last observation) never receive the reward;
    a row with no assistant token receives nothing (its reward has no token to credit).
    """
    _check_batch(loss_mask, rewards, "rewards")
    token_rewards = torch.zeros(loss_mask.shape, dtype=rewards.dtype, device=rewards.device)
    last = last_assistant_index(loss_mask)
    has_assistant = last >= 0
    rows = torch.nonzero(has_assistant, as_tuple=True)[0]
    token_rewards[rows, last[rows]] = rewards[rows]
    return token_rewards


def _group_stats(rewards: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Dense group id, group size and group mean (float64) of each episode, all ``[B]``."""
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_index must both be [B]; got {tuple(rewards.shape)} "
            f"and {tuple(group_index.shape)}"
        )
    if group_index.dtype.is_floating_point or group_index.dtype == torch.bool:
        raise ValueError(f"group_index must be an integer tensor, got {group_index.dtype}")
    _, dense = torch.unique(group_index, return_inverse=True)
    num_groups = int(dense.max().item()) + 1 if dense.numel() else 0
    values = rewards.to(torch.float64)  # group sums in float64: exact for small hand cases
    count = torch.zeros(num_groups, dtype=values.dtype, device=values.device)
    count.index_add_(0, dense, torch.ones_like(values))
    mean = torch.zeros_like(count).index_add_(0, dense, values) / count
    return dense, count, mean


def grpo_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, std_norm: bool, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO sequence advantages: reward minus its group's mean, optionally over the group's std.

    ``rewards``: [B] float; ``group_index``: [B] long, any integer labels (need not be contiguous
    or sorted). Returns [B]: ``(r - mean_g) / (std_g + eps)`` if ``std_norm`` else ``r - mean_g``.

    The std is the *unbiased* (Bessel-corrected, n - 1) estimate, as ``torch.std`` computes it in
    DeepSeekMath's GRPO and verl; a group whose rewards are all equal gets advantage 0. A group of
    size 1 has no baseline other than itself and gets advantage 0 (not NaN).
    """
    dense, count, mean = _group_stats(rewards, group_index)
    centered = rewards.to(torch.float64) - mean[dense]
    if std_norm:
        squares = torch.zeros_like(count).index_add_(0, dense, centered.square())
        std = (squares / (count - 1).clamp(min=1)).sqrt()[dense]
        # an all-equal group is exactly 0 after centering; keep it 0 even when eps == 0
        centered = torch.where(std > 0, centered / (std + eps), torch.zeros_like(centered))
    singleton = count[dense] < 2
    return torch.where(singleton, torch.zeros_like(centered), centered).to(rewards.dtype)


def rloo_advantages(rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """RLOO sequence advantages: reward minus the mean reward of the other episodes of its group.

    ``r_i - (sum_g - r_i) / (n - 1)``, which equals ``n / (n - 1) * (r_i - mean_g)``. Returns [B]
    in the dtype of ``rewards``; a group of size 1 has no other episode and gets 0.
    """
    dense, count, mean = _group_stats(rewards, group_index)
    n = count[dense]
    scaled = (rewards.to(torch.float64) - mean[dense]) * n / (n - 1).clamp(min=1)
    return torch.where(n < 2, torch.zeros_like(scaled), scaled).to(rewards.dtype)


def sequence_to_token_advantages(advantages: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast per-episode advantages ``[B]`` over that episode's assistant tokens -> ``[B, T]``.

    Correct for outcome rewards with gamma = 1, where every assistant token's return equals the
    outcome; environment and padding tokens (``loss_mask == 0``) get 0.
    """
    _check_batch(loss_mask, advantages, "advantages")
    return advantages[:, None] * loss_mask.to(advantages.dtype)


def turn_rewards_summing_to(turn_rewards: torch.Tensor, turn_row: torch.Tensor,
                            episode_rewards: torch.Tensor) -> torch.Tensor:
    """Each turn's reward, made to sum over its row to that row's ``episode_rewards`` -> [N].

    ``turn_rewards``, ``turn_row``: [N]; ``episode_rewards``: [B]. A row whose turn rewards sum to
    S != 0 with ``R / S >= 0`` has each scaled by ``R / S`` (an episode whose progress rewards
    overshoot the clip at 1 keeps where each part was earned); otherwise (S == 0, or the signs
    differ) the turns keep their rewards and ``R - S`` is added to the row's last turn.
    """
    if turn_rewards.dim() != 1 or turn_row.shape != turn_rewards.shape or episode_rewards.dim() != 1:
        raise ValueError(f"need turn_rewards [N], turn_row [N], episode_rewards [B]; got "
                         f"{tuple(turn_rewards.shape)}, {tuple(turn_row.shape)}, {tuple(episode_rewards.shape)}")
    values = turn_rewards.to(torch.float64)
    target = episode_rewards.to(torch.float64)
    sums = torch.zeros_like(target).index_add_(0, turn_row, values)
    scale = torch.where(sums != 0, target / torch.where(sums != 0, sums, 1.0), -1.0)
    scalable = scale >= 0
    out = torch.where(scalable[turn_row], values * scale.clamp(min=0)[turn_row], values)
    positions = torch.arange(len(turn_row), device=turn_row.device)
    last = torch.full_like(target, -1, dtype=torch.long).scatter_reduce_(0, turn_row, positions, "amax")
    rows = torch.nonzero(~scalable & (last >= 0), as_tuple=True)[0]
    out[last[rows]] += target[rows] - sums[rows]
    return out.to(turn_rewards.dtype)


def turn_token_rewards(turn_rewards: torch.Tensor, turn_row: torch.Tensor, turn_spans: torch.Tensor,
                       loss_mask: torch.Tensor) -> torch.Tensor:
    """Each turn's reward on the last assistant token of its ``[start, end)`` span -> [B, T].

    ``turn_rewards``, ``turn_row``: [N]; ``turn_spans``: [N, 2]. A turn without an assistant token
    in its span credits the last assistant token before it, else the row's first one; a row with
    none receives nothing (as ``outcome_token_rewards``).
    """
    _check_tokens(loss_mask, loss_mask, "loss_mask")
    if turn_spans.shape != (turn_row.shape[0], 2) or turn_rewards.shape != turn_row.shape:
        raise ValueError(f"need turn_rewards [N], turn_row [N], turn_spans [N, 2]; got {tuple(turn_rewards.shape)}, "
                         f"{tuple(turn_row.shape)}, {tuple(turn_spans.shape)}")
    keep, width = loss_mask.bool(), loss_mask.shape[1]
    positions = torch.arange(width, device=loss_mask.device).expand_as(keep)
    last_so_far = torch.where(keep, positions, -1).cummax(dim=1).values  # last assistant token at or before t
    first = torch.where(keep, positions, width).min(dim=1).values  # width: the row has none
    rows = turn_row.to(loss_mask.device)
    at = last_so_far[rows, turn_spans[:, 1].to(loss_mask.device).clamp(1, width) - 1]
    at = torch.where(at >= 0, at, first[rows])
    placed = at < width
    token_rewards = torch.zeros(loss_mask.shape, dtype=turn_rewards.dtype, device=loss_mask.device)
    return token_rewards.index_put_((rows[placed], at[placed]), turn_rewards.to(loss_mask.device)[placed],
                                    accumulate=True)


def kl_shaped_token_rewards(
    rewards: torch.Tensor, loss_mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """Per-token rewards: the outcome on the last assistant token, ``- kl_coef * kl`` on each one."""
    return kl_penalized(outcome_token_rewards(rewards, loss_mask), loss_mask, kl, kl_coef)


def kl_penalized(
    token_rewards: torch.Tensor, loss_mask: torch.Tensor, kl: torch.Tensor | None = None, kl_coef: float = 0.0
) -> torch.Tensor:
    """``token_rewards`` minus ``kl_coef * kl`` on each assistant token -> [B, T].

    ``kl``: [B, T] per-token KL estimate of the sampling policy to the reference (REINFORCE++,
    InstructGPT); ignored where ``loss_mask == 0``, so garbage on env tokens never leaks in.
    """
    if kl is None or kl_coef == 0:
        return token_rewards
    if kl.shape != loss_mask.shape:
        raise ValueError(f"kl must be [B, T] like loss_mask; got {tuple(kl.shape)}")
    penalty = torch.where(loss_mask.bool(), kl.to(token_rewards.dtype), torch.zeros_like(token_rewards))
    return token_rewards - kl_coef * penalty


def assistant_returns(token_rewards: torch.Tensor, loss_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted reward-to-go over the assistant tokens of each row -> [B, T] (0 off the mask).

    ``G_t = r_t + gamma * G_next`` where ``next`` is the next *assistant* token: env tokens are
    skipped (no reward, no discount), see the module docstring.
    """
    _check_tokens(token_rewards, loss_mask, "token_rewards")
    return _assistant_discounted_sum(token_rewards, loss_mask.bool(), gamma)


def whiten(values: torch.Tensor, loss_mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / std`` with mean and (population) std over all masked tokens of the batch.

    As OpenRLHF does for REINFORCE++ and GAE: ``std = sqrt(max(var, eps))``. Returns 0 off the mask.
    """
    _check_tokens(values, loss_mask, "values")
    keep = loss_mask.bool()
    count = keep.sum().clamp(min=1)
    zeros = torch.zeros_like(values)
    mean = torch.where(keep, values, zeros).sum() / count
    var = torch.where(keep, (values - mean).square(), zeros).sum() / count
    return torch.where(keep, (values - mean) * var.clamp(min=eps).rsqrt(), zeros)


def reinforce_pp_advantages(token_rewards: torch.Tensor, loss_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++: whitened discounted returns (no critic, no group baseline) -> [B, T].

    ``token_rewards`` as from ``kl_shaped_token_rewards``; whitening is global over the batch's
    assistant tokens, so a token's advantage says how much better its return is than the batch's.
    """
    return whiten(assistant_returns(token_rewards, loss_mask, gamma), loss_mask)


def gae_advantages(
    token_rewards: torch.Tensor, values: torch.Tensor, loss_mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over assistant tokens -> (advantages, returns), [B, T].

    ``values[b, t]``: the critic's value of the prefix before token ``t`` (aligned like token
    logprobs). With ``t'`` the next assistant token after ``t`` (env tokens skipped) and
    ``V(after last) = 0``: ``delta_t = r_t + gamma * V_t' - V_t``,
    ``A_t = delta_t + gamma * lam * A_t'``, ``returns = A + V`` (the critic's regression target).
    Both are 0 off the mask; values there are never read, so garbage is harmless.
    """
    _check_tokens(token_rewards, loss_mask, "token_rewards")
    _check_tokens(values, loss_mask, "values")
    keep, dtype = loss_mask.bool(), token_rewards.dtype
    # float64 throughout, rounded once at the end: float32 deltas rounded before a long sum would drift
    rewards = token_rewards.to(torch.float64)
    values = torch.where(keep, values.to(torch.float64), torch.zeros_like(rewards))
    # V of the next assistant token (0 after the last): env tokens in between take no step
    width = keep.shape[1]
    positions = torch.arange(width, device=keep.device).expand_as(keep)
    later = torch.where(keep, positions, width).flip(1).cummin(dim=1).values.flip(1)  # first at or after t
    following = F.pad(later[:, 1:], (0, 1), value=width)
    next_value = F.pad(values, (0, 1)).gather(1, following)
    deltas = torch.where(keep, rewards + gamma * next_value - values, torch.zeros_like(values))
    advantages = _assistant_discounted_sum(deltas, keep, gamma * lam)
    return advantages.to(dtype), (advantages + values).to(dtype)


def _assistant_discounted_sum(x: torch.Tensor, keep: torch.Tensor, factor: float,
                              chunk: int = 128) -> torch.Tensor:
    """``y_t = x_t + factor * y_t'`` with ``t'`` the next kept position of the row -> [B, T] (0 off ``keep``).

    Vectorised in place of a Python loop over T: each row's kept entries are packed to the left, then
    swept from the right ``chunk`` at a time, each chunk one matmul with its ``factor ** (j - i)``
    upper-triangular matrix plus the carry from the chunk after it. Sums run in float64 and round
    once to ``x``'s dtype, so a float32 result is at least as exact as the float32 loop it replaces.
    """
    rows, width = keep.shape
    if width == 0:
        return torch.zeros_like(x)
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)  # kept first, in order
    count = int(keep.sum(dim=1).max())
    packed = torch.where(keep, x, torch.zeros_like(x)).gather(1, order)[:, :count].to(torch.float64)
    size = max(1, min(chunk, count))
    steps = torch.arange(size, dtype=torch.float64, device=x.device)
    gap = steps[None, :] - steps[:, None]  # j - i
    # float64 powers of a float factor; 0 ** 0 == 1 keeps factor == 0 the identity
    discount = torch.where(gap >= 0, torch.tensor(float(factor), dtype=torch.float64).pow(gap.clamp(min=0)),
                           torch.zeros_like(gap))
    carry_scale = discount[:, -1] * float(factor)  # factor ** (size - i): how far the next chunk's head is
    swept = torch.zeros_like(packed)
    carry = torch.zeros(rows, dtype=torch.float64, device=x.device)
    for end in range(count, 0, -size):
        begin = max(0, end - size)
        n = end - begin
        block = packed[:, begin:end] @ discount[:n, :n].T + carry[:, None] * carry_scale[size - n:]
        swept[:, begin:end] = block
        carry = block[:, 0]
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    out[:, :count] = swept
    unpacked = torch.zeros_like(out).scatter_(1, order, out)
    return torch.where(keep, unpacked, torch.zeros_like(unpacked)).to(x.dtype)


def turn_returns(turn_rewards: torch.Tensor, turn_row: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted return-to-go of every turn -> [N]: ``R_k = r_k + gamma * R_{k+1}`` within its row.

    ``turn_rewards``, ``turn_row``: [N], the turns of the batch with the row (episode) each belongs
    to; a row's turns must appear in order (they need not be contiguous with each other's rows).
    """
    if turn_rewards.dim() != 1 or turn_row.shape != turn_rewards.shape:
        raise ValueError(f"turn_rewards and turn_row must both be [N]; got {tuple(turn_rewards.shape)} "
                         f"and {tuple(turn_row.shape)}")
    if turn_rewards.numel() == 0:
        return torch.zeros_like(turn_rewards)
    # one row of a [rows, turns] grid per episode, its turns in order, then the token recursion
    _, dense = torch.unique(turn_row, return_inverse=True)
    by_row = torch.argsort(dense, stable=True)
    starts = torch.searchsorted(dense[by_row], dense[by_row], side="left")
    slot = torch.arange(len(by_row), device=dense.device) - starts
    shape = (int(dense.max()) + 1, int(slot.max()) + 1)
    grid = torch.zeros(shape, dtype=turn_rewards.dtype, device=turn_rewards.device)
    keep = torch.zeros(shape, dtype=torch.bool, device=turn_rewards.device)
    grid[dense[by_row], slot] = turn_rewards[by_row]
    keep[dense[by_row], slot] = True
    returns = torch.empty_like(turn_rewards)
    returns[by_row] = _assistant_discounted_sum(grid, keep, gamma)[dense[by_row], slot]
    return returns


def gigpo_advantages(
    episode_advantages: torch.Tensor, step_advantages: torch.Tensor, turn_row: torch.Tensor,
    turn_spans: torch.Tensor, loss_mask: torch.Tensor, step_weight: float,
) -> torch.Tensor:
    """GiGPO token advantages -> [B, T]: each episode's advantage on all its assistant tokens,
    plus ``step_weight`` times each turn's step advantage on that turn's tokens.

    ``episode_advantages``: [B] (``grpo_advantages`` of the outcomes); ``step_advantages``: [N]
    (``grpo_advantages`` of ``turn_returns`` over anchor-state groups); ``turn_row``: [N];
    ``turn_spans``: [N, 2] ``[start, end)`` of each turn's tokens in its row.
    """
    if turn_spans.shape != (turn_row.shape[0], 2) or step_advantages.shape != turn_row.shape:
        raise ValueError(f"need step_advantages [N], turn_row [N], turn_spans [N, 2]; got "
                         f"{tuple(step_advantages.shape)}, {tuple(turn_row.shape)}, {tuple(turn_spans.shape)}")
    per_turn = torch.zeros(loss_mask.shape, dtype=episode_advantages.dtype, device=loss_mask.device)
    for (start, end), row, value in zip(turn_spans.tolist(), turn_row.tolist(), step_advantages.tolist()):
        per_turn[row, start:end] = value
    keep = loss_mask.to(per_turn.dtype)
    return sequence_to_token_advantages(episode_advantages, loss_mask) + step_weight * per_turn * keep


def _check_tokens(per_token: torch.Tensor, loss_mask: torch.Tensor, name: str) -> None:
    if loss_mask.dim() != 2 or per_token.shape != loss_mask.shape:
        raise ValueError(
            f"{name} and loss_mask must both be [B, T]; got {tuple(per_token.shape)} "
            f"and {tuple(loss_mask.shape)}"
        )


# --------------------------------------------------------------------------- the estimator registry


@dataclass(frozen=True)
class AdvantageInputs:
    """What an estimator may read of a batch: ``B`` episodes of ``T`` tokens."""

    rewards: torch.Tensor
    """[B] episode rewards (clipped, shaped)."""
    group_index: torch.Tensor
    """[B] integer group label of each episode."""
    loss_mask: torch.Tensor
    """[B, T] 1 on assistant tokens."""
    token_rewards: torch.Tensor | None = None
    """[B, T] per-token rewards (each turn's on its last token, minus the KL penalty with
    ``kl_in_reward``); given to estimators registered with ``token_rewards=True``."""
    values: torch.Tensor | None = None
    """[B, T] the critic's values; given to estimators registered with ``critic=True``."""
    turns: BatchTurns | None = None
    """Every turn's reward, row, span and anchor state; None for a batch recorded without them."""


@dataclass(frozen=True)
class Estimate:
    """What an estimator returns."""

    advantages: torch.Tensor
    """[B, T], 0 off the mask."""
    returns: torch.Tensor | None = None
    """[B, T] the critic's regression target (estimators with a critic)."""
    scalars: dict[str, float] = field(default_factory=dict)
    """Metrics about the estimate (``learner/`` namespace)."""


@dataclass(frozen=True)
class AdvantageEstimator:
    """One registered estimator: ``compute(inputs, settings)`` and what it needs computed for it."""

    compute: Callable[[AdvantageInputs, Any], Estimate]
    token_rewards: bool
    """It reads ``AdvantageInputs.token_rewards``."""
    critic: bool
    """It reads ``AdvantageInputs.values``: the learner builds and trains a critic."""


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
"""Estimator name (``learner.algorithm.advantage``) -> its pure function."""


def register_advantage_estimator(name: str, token_rewards: bool = False, critic: bool = False):
    """Register ``compute(inputs, settings) -> Estimate`` under ``name``; ``settings`` is the run's
    ``learner.algorithm`` section, the one of ``advantage: name`` (its own settings beside the shared knobs)."""
    def register(compute: Callable[[AdvantageInputs, Any], Estimate]) -> Callable[[AdvantageInputs, Any], Estimate]:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered twice")
        ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(compute, token_rewards, critic)
        return compute
    return register


@register_advantage_estimator("grpo")
def _grpo(inputs: AdvantageInputs, settings: GrpoAlgorithm) -> Estimate:
    per_episode = grpo_advantages(inputs.rewards, inputs.group_index, settings.std_norm)
    return Estimate(sequence_to_token_advantages(per_episode, inputs.loss_mask))


@register_advantage_estimator("rloo")
def _rloo(inputs: AdvantageInputs, settings: RlooAlgorithm) -> Estimate:
    per_episode = rloo_advantages(inputs.rewards, inputs.group_index)
    return Estimate(sequence_to_token_advantages(per_episode, inputs.loss_mask))


@register_advantage_estimator("reinforce_pp", token_rewards=True)
def _reinforce_pp(inputs: AdvantageInputs, settings: ReinforcePpAlgorithm) -> Estimate:
    return Estimate(reinforce_pp_advantages(inputs.token_rewards, inputs.loss_mask, settings.gamma))


@register_advantage_estimator("gae", token_rewards=True, critic=True)
def _gae(inputs: AdvantageInputs, settings: GaeAlgorithm) -> Estimate:
    advantages, returns = gae_advantages(inputs.token_rewards, inputs.values, inputs.loss_mask, settings.gamma,
                                         settings.lam)
    return Estimate(whiten(advantages, inputs.loss_mask), returns,
                    {"return_mean": float(masked_mean(returns, inputs.loss_mask))})


@register_advantage_estimator("gigpo")
def _gigpo(inputs: AdvantageInputs, settings: GigpoAlgorithm) -> Estimate:
    turns = inputs.turns
    if turns is None:
        raise ValueError("advantage gigpo needs each turn's reward and observation fingerprint; an "
                         "episode of this batch has none (recorded before they were sent?)")
    episode = grpo_advantages(inputs.rewards, inputs.group_index, settings.std_norm)
    # The turn rewards the other estimators place (summing to the episode reward trained on): a
    # turn's return is then in the episode reward's units, whatever the clip at 1 cut.
    # On the CPU, where the turns stay (``Batch.to``).
    episode_rewards = inputs.rewards.cpu()
    turn_rewards = turn_rewards_summing_to(turns.rewards.to(episode_rewards.dtype), turns.row, episode_rewards)
    returns = turn_returns(turn_rewards, turns.row, settings.gamma)
    step = grpo_advantages(returns, turns.anchor, settings.std_norm)
    advantages = gigpo_advantages(episode, step, turns.row, turns.spans, inputs.loss_mask,
                                  settings.step_advantage_weight)
    anchors = int(turns.anchor.max()) + 1 if len(turns.anchor) else 0
    # How much step-level signal there is: turns per anchor state (1 would mean no comparison).
    return Estimate(advantages, scalars={"gigpo_turns_per_anchor": len(turns.anchor) / max(anchors, 1)})
