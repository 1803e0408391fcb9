"""Turn completed groups into one padded training batch.

Episodes that did not end with status ``ok`` are excluded from the loss (their reward says
nothing about the policy) but are counted in the rollout metrics. A group whose oldest token is
more than ``max_policy_lag`` versions behind the learner is dropped whole and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common.protocol import Trajectory
from learner.head import Group
from learner.shaping import format_shaped_rewards
from learner.turns import BatchTurns, batch_turns


@dataclass
class Batch:
    """Right-padded tensors, one row per trainable episode."""

    token_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    loss_mask: torch.Tensor  # [B, T] float, 1 on sampled assistant tokens
    behavior_logprobs: torch.Tensor  # [B, T] float
    token_versions: torch.Tensor  # [B, T] long, -1 off the loss mask
    rewards: torch.Tensor  # [B] float
    group_index: torch.Tensor  # [B] long
    episodes: list[Trajectory]
    turns: BatchTurns | None = None  # every turn's reward and anchor state; None if not recorded

    def to(self, device: torch.device) -> Batch:
        """The same batch with every tensor on ``device`` (the learner's GPU, on GPU machines)."""
        moved = {name: getattr(self, name).to(device) for name in
                 ("token_ids", "attention_mask", "loss_mask", "behavior_logprobs", "token_versions", "rewards",
                  "group_index")}
        return Batch(**moved, episodes=self.episodes, turns=self.turns)


def policy_lag(episode: Trajectory, version: int) -> int:
    """How many versions behind ``version`` the oldest sampled token of the episode is."""
    sampled = episode.token_versions[episode.loss_mask.astype(bool)]
    return version - int(sampled.min()) if sampled.size else 0


def split_stale(groups: list[Group], version: int, max_lag: int) -> tuple[list[Group], list[Group]]:
    fresh, stale = [], []
    for group in groups:
        lag = max((policy_lag(e, version) for e in group.episodes), default=0)
        (stale if lag > max_lag else fresh).append(group)
    return fresh, stale


def collate(groups: list[Group], format_coef: float = 0.0) -> Batch | None:
    """Pad the ok episodes of ``groups`` into a batch; None if none is trainable. ``format_coef``:
    the rewards carry the format penalty (``learner/shaping.py``); the episodes stay as sent."""
    rows = [(gi, e) for gi, g in enumerate(groups) for e in g.episodes if e.status == "ok"]
    if not rows:
        return None
    shaped = [format_shaped_rewards(e, format_coef) for _, e in rows]
    width = max(len(e.token_ids) for _, e in rows)

    def pad(attr: str, fill, dtype) -> torch.Tensor:
        out = np.full((len(rows), width), fill, dtype=dtype)
        for i, (_, e) in enumerate(rows):
            values = getattr(e, attr)
            out[i, : len(values)] = values
        return torch.from_numpy(out)

    lengths = torch.tensor([len(e.token_ids) for _, e in rows])
    return Batch(
        token_ids=pad("token_ids", 0, np.int64),
        attention_mask=(torch.arange(width)[None, :] < lengths[:, None]).long(),
        loss_mask=pad("loss_mask", 0, np.float32),
        behavior_logprobs=pad("behavior_logprobs", 0.0, np.float32),
        token_versions=pad("token_versions", -1, np.int64),
        rewards=torch.tensor([reward for reward, _ in shaped], dtype=torch.float32),
        group_index=torch.tensor([gi for gi, _ in rows], dtype=torch.long),
        episodes=[e for _, e in rows],
        turns=batch_turns([e for _, e in rows], [gi for gi, _ in rows], [turn for _, turn in shaped]),
    )
