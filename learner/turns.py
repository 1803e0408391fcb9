"""The turns of a batch, flattened, for step-level credit (GiGPO's anchor states).

A turn is one sampled assistant segment of an episode (``Trajectory.turn_spans``), with the
env's reward for it and the fingerprint of the observation it answered. Turns of the same group
(one task lease) that answered the same observation share an *anchor*: an integer id, equal for
exactly those turns, that ``grpo_advantages`` groups by.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from common.protocol import Trajectory


@dataclass
class BatchTurns:
    """``N`` turns of a batch in row order, each row's turns in episode order."""

    row: torch.Tensor  # [N] long: the batch row (episode)
    spans: torch.Tensor  # [N, 2] long: [start, end) of the turn's tokens in its row
    rewards: torch.Tensor  # [N] float32: the env's reward for the turn
    anchor: torch.Tensor  # [N] long: equal for turns of one group that saw the same observation


def has_turn_data(episode: Trajectory) -> bool:
    """Whether the episode carries a reward and an observation fingerprint for every turn (a
    recording made before they were sent has neither)."""
    turns = len(episode.turn_spans.reshape(-1, 2))
    return len(episode.turn_rewards) == turns and len(episode.turn_observations) == turns


def batch_turns(episodes: list[Trajectory], group_index: list[int],
                turn_rewards: list[np.ndarray] | None = None) -> BatchTurns | None:
    """The turns of ``episodes`` (batch rows, with their groups); None if one lacks turn data.
    ``turn_rewards``: each episode's turn rewards as trained on (shaped), else the env's."""
    if not all(has_turn_data(e) for e in episodes):
        return None
    turn_rewards = [e.turn_rewards for e in episodes] if turn_rewards is None else turn_rewards
    rows, keys = [], []
    for row, (episode, group) in enumerate(zip(episodes, group_index)):
        rows.extend([row] * len(episode.turn_rewards))
        keys.extend((group, int(fingerprint)) for fingerprint in episode.turn_observations)
    anchor_ids: dict[tuple[int, int], int] = {}
    return BatchTurns(
        row=torch.tensor(rows, dtype=torch.long),
        spans=torch.from_numpy(np.concatenate([e.turn_spans.reshape(-1, 2) for e in episodes]).astype(np.int64)),
        rewards=torch.from_numpy(np.concatenate(turn_rewards).astype(np.float32)),
        anchor=torch.tensor([anchor_ids.setdefault(key, len(anchor_ids)) for key in keys], dtype=torch.long),
    )
