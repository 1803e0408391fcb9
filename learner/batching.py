"""Turn completed groups into one padded training batch.

Episodes that did not end with status ``ok`` are excluded from the loss (their reward says
nothing about the policy) but are counted in the rollout metrics.

Staleness is judged per token: a sampled token more than ``max_policy_lag`` versions behind the
learner is *stale*. Stale tokens leave the loss mask (no gradient, not in any loss denominator)
and are counted (``async/stale_token_frac``); the rest of the episode trains. A long episode
whose early turns were sampled several versions ago thus keeps its fresh late turns, instead of
the whole group being thrown away for its oldest token, which biased training against the long
episodes this project is for. Only a group with no fresh sampled token in any ok episode is
dropped (``async/groups_dropped_stale``).

Group-relative advantages treat a partly (or wholly) stale episode as a full member of its
group: its reward is a fact of the episode whichever versions sampled it, so it stays in the
group's baseline (GRPO mean and std, RLOO leave-one-out), and the episode's advantage is carried
by its fresh tokens only. Dropping it from the baseline would shift its siblings' advantages
and bring the bias back. Token-level estimators (REINFORCE++, GAE) see the masked loss mask, so
an outcome reward sits on the last fresh token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common.protocol import Trajectory
from learner.group import Group
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
    stale_tokens: int = 0  # sampled tokens taken off loss_mask as too stale (rank 0's count)

    def padded_to_multiple(self, multiple: int) -> Batch:
        """The same batch, right-padded with masked columns to a width that is a multiple of
        ``multiple`` (``LearnerConfig.width_multiple``); itself when it already is."""
        width = self.token_ids.shape[1]
        extra = round_up(width, multiple) - width
        if extra == 0:
            return self
        fills = {"token_ids": 0, "attention_mask": 0, "loss_mask": 0.0, "behavior_logprobs": 0.0,
                 "token_versions": -1}
        padded = {name: torch.nn.functional.pad(getattr(self, name), (0, extra), value=fill)
                  for name, fill in fills.items()}
        return Batch(**padded, rewards=self.rewards, group_index=self.group_index, episodes=self.episodes,
                     turns=self.turns, stale_tokens=self.stale_tokens)

    def to(self, device: torch.device) -> Batch:
        """The same batch with every tensor on ``device`` (the learner's GPU, on GPU machines)."""
        moved = {name: getattr(self, name).to(device) for name in
                 ("token_ids", "attention_mask", "loss_mask", "behavior_logprobs", "token_versions", "rewards",
                  "group_index")}
        return Batch(**moved, episodes=self.episodes, turns=self.turns, stale_tokens=self.stale_tokens)


def round_up(tokens, multiple: int):
    """``tokens`` (an int or an integer tensor) rounded up to a multiple of ``multiple``."""
    return -(-tokens // multiple) * multiple


def policy_lag(episode: Trajectory, version: int) -> int:
    """How many versions behind ``version`` the oldest sampled token of the episode is."""
    sampled = episode.token_versions[episode.loss_mask.astype(bool)]
    return version - int(sampled.min()) if sampled.size else 0


def fresh_token_mask(episode: Trajectory, min_version: int | None) -> np.ndarray:
    """[T] bool: the episode's sampled tokens of version ``min_version`` or newer (all of them
    when ``min_version`` is None)."""
    sampled = episode.loss_mask.astype(bool)
    return sampled if min_version is None else sampled & (episode.token_versions >= min_version)


def stale_token_count(episode: Trajectory, min_version: int | None) -> int:
    """Sampled tokens of ``episode`` older than ``min_version``."""
    return int(episode.loss_mask.astype(bool).sum() - fresh_token_mask(episode, min_version).sum())


def split_stale(groups: list[Group], version: int, max_lag: int) -> tuple[list[Group], list[Group]]:
    """(trainable, stale) groups at learner ``version``: a group is stale when no ok episode has
    a sampled token at most ``max_lag`` versions old; partly stale groups are trainable
    (``collate`` masks their stale tokens)."""
    min_version = version - max_lag
    trainable, stale = [], []
    for group in groups:
        fresh = any(fresh_token_mask(e, min_version).any() for e in group.episodes if e.status == "ok")
        (trainable if fresh else stale).append(group)
    return trainable, stale


def collate(groups: list[Group], format_coef: float = 0.0, min_version: int | None = None) -> Batch | None:
    """Pad the ok episodes of ``groups`` into a batch; None if none is trainable. ``format_coef``:
    the rewards carry the format penalty (``learner/shaping.py``); the episodes stay as sent.
    ``min_version``: sampled tokens older than it are off the batch's ``loss_mask`` (stale) and
    counted in ``Batch.stale_tokens``; None: none is."""
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
    loss_mask, stale_tokens = np.zeros((len(rows), width), dtype=np.float32), 0
    for i, (_, e) in enumerate(rows):
        fresh = fresh_token_mask(e, min_version)
        loss_mask[i, : len(e.loss_mask)] = fresh
        stale_tokens += int(np.count_nonzero(e.loss_mask)) - int(np.count_nonzero(fresh))
    return Batch(
        token_ids=pad("token_ids", 0, np.int64),
        attention_mask=(torch.arange(width)[None, :] < lengths[:, None]).long(),
        loss_mask=torch.from_numpy(loss_mask),
        behavior_logprobs=pad("behavior_logprobs", 0.0, np.float32),
        token_versions=pad("token_versions", -1, np.int64),
        rewards=torch.tensor([reward for reward, _ in shaped], dtype=torch.float32),
        group_index=torch.tensor([gi for gi, _ in rows], dtype=torch.long),
        episodes=[e for _, e in rows],
        turns=batch_turns([e for _, e in rows], [gi for gi, _ in rows], [turn for _, turn in shaped]),
        stale_tokens=stale_tokens,
    )
