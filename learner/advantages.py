"""Advantage estimation for outcome-rewarded multi-turn episodes (pure tensor functions).

Shapes: ``B`` episodes, ``T`` tokens per (padded) episode. ``loss_mask[b, t] == 1`` marks a
token the policy sampled (an assistant token); 0 marks prompt, environment observation and
padding tokens. Every function here returns zeros at masked positions, so nothing is ever
credited to a token the policy did not produce.

GRPO (DeepSeekMath, arXiv 2402.03300): the advantage of an episode is its outcome reward
normalized within its group (the ``group_size`` episodes of one task lease). With an outcome
reward and gamma = 1 the return of every assistant token is the outcome itself, so the
sequence advantage is broadcast to all assistant tokens of the episode.
"""

from __future__ import annotations

import torch


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
    centered = values - mean[dense]
    if std_norm:
        squares = torch.zeros_like(count).index_add_(0, dense, centered.square())
        std = (squares / (count - 1).clamp(min=1)).sqrt()[dense]
        # an all-equal group is exactly 0 after centering; keep it 0 even when eps == 0
        centered = torch.where(std > 0, centered / (std + eps), torch.zeros_like(centered))
    singleton = count[dense] < 2
    return torch.where(singleton, torch.zeros_like(centered), centered).to(rewards.dtype)


def sequence_to_token_advantages(advantages: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast per-episode advantages ``[B]`` over that episode's assistant tokens -> ``[B, T]``.

    Correct for outcome rewards with gamma = 1, where every assistant token's return equals the
    outcome; environment and padding tokens (``loss_mask == 0``) get 0.
    """
    _check_batch(loss_mask, advantages, "advantages")
    return advantages[:, None] * loss_mask.to(advantages.dtype)
