"""Staleness is judged per token: a long episode keeps its fresh late turns (learner/batching.py)."""

from __future__ import annotations

import threading

import numpy as np
import torch

from common.protocol import Trajectory
from learner.batching import collate, split_stale
from learner.group import Group
from learner.group_collector import GroupCollector

VERSION, MAX_LAG = 5, 2  # tokens of version 3 or newer are fresh


def episode(versions: list[int], reward: float, status: str = "ok") -> Trajectory:
    """A prompt token, then one sampled token per entry of ``versions`` (the weights that sampled it)."""
    n = len(versions) + 1
    return Trajectory(lease_id="l", group_id="g", env_id="keydoor-v0", task_id="t", actor_id=0, episode_index=0,
                      group_size=2, token_ids=np.arange(3, 3 + n, dtype="<i4"),
                      loss_mask=np.array([0] + [1] * len(versions), "u1"), behavior_logprobs=np.zeros(n, "<f4"),
                      token_versions=np.array([-1] + versions, "<i4"), turn_spans=np.array([[1, n]], "<i4"),
                      reward=reward, success=reward == 1.0, num_turns=1, turn_cap=8, finish_reason="terminated",
                      terminated=True, truncated=False, status=status)


def groups_out_of_order() -> list[Group]:
    # Completion order: a short group leased late, then a long episode's group leased early (its
    # first turns sampled on versions 1-2, its last on 3-4), then a group sampled entirely long ago.
    short = Group(lease=None, episodes=[episode([4, 4], 1.0), episode([4], 0.0)])
    long = Group(lease=None, episodes=[episode([1, 1, 2, 2, 3, 4, 4], 1.0), episode([2, 2], 0.0)])
    old = Group(lease=None, episodes=[episode([1, 2], 1.0), episode([2], 0.0), episode([4], 0.0, status="error")])
    return [short, long, old]


def test_a_long_episode_keeps_its_fresh_tokens_and_its_stale_ones_are_masked_and_counted():
    short, long, old = groups_out_of_order()
    trainable, stale = split_stale([short, long, old], VERSION, MAX_LAG)
    assert trainable == [short, long]  # the long group has fresh tokens: kept, not dropped whole
    assert stale == [old]  # no fresh token in any ok episode (the errored one does not count)

    batch = collate(trainable, min_version=VERSION - MAX_LAG)
    long_row, sibling_row = 2, 3
    assert batch.loss_mask[long_row].tolist()[:8] == [0, 0, 0, 0, 0, 1, 1, 1]  # versions 3, 4, 4 train
    assert batch.loss_mask[sibling_row].sum() == 0  # wholly stale: no token in the loss ...
    assert batch.stale_tokens == 4 + 2
    # ... but the episode stays in its group's baseline: the long episode's reward is compared to it.
    assert batch.group_index.tolist() == [0, 0, 1, 1] and batch.rewards[sibling_row] == 0.0
    assert batch.loss_mask[:2].sum() == 3  # the fresh group is untouched


def test_without_a_min_version_every_sampled_token_trains():
    batch = collate(groups_out_of_order()[1:2])
    assert batch.stale_tokens == 0
    assert batch.loss_mask.sum() == 7 + 2


class _Source:
    max_policy_lag = MAX_LAG

    def __init__(self):
        self.released: list[Group] = []

    def release(self, group: Group) -> None:
        self.released.append(group)


def test_the_loop_drops_only_groups_without_a_fresh_token_and_still_asks_for_a_resend():
    resends = []
    collector = GroupCollector(_Source(), groups_per_step=2, stop=threading.Event(),
                               on_stale=lambda: resends.append(1))
    short, long, old = groups_out_of_order()
    assert collector.drop_stale([short, long, old], VERSION) == [short, long]
    assert collector.source.released == [old] and collector.dropped_stale == 1
    assert len(resends) == 1
    # Partly stale data alone still means some actor may lack the current weights.
    assert collector.drop_stale([long], VERSION) == [long] and len(resends) == 2
    assert collector.drop_stale([short], VERSION) == [short] and len(resends) == 2
    assert collector.dropped_stale == 1


def test_a_recording_trains_as_recorded():
    source = _Source()
    source.max_policy_lag = None  # replay: no staleness judged
    collector = GroupCollector(source, groups_per_step=2, stop=threading.Event())
    groups = groups_out_of_order()
    assert collector.drop_stale(groups, VERSION) == groups  # the wholly stale group too
    assert collector.min_version(VERSION) is None and source.released == [] and collector.dropped_stale == 0


def test_a_partly_stale_episode_keeps_its_advantage_on_its_fresh_tokens():
    from learner.advantages import grpo_advantages, sequence_to_token_advantages
    batch = collate(groups_out_of_order()[1:2], min_version=VERSION - MAX_LAG)
    per_episode = grpo_advantages(batch.rewards, batch.group_index, True)
    tokens = sequence_to_token_advantages(per_episode, batch.loss_mask)
    assert per_episode[0] > 0 > per_episode[1]  # the baseline still holds the stale sibling
    assert torch.all(tokens[0, 5:8] == per_episode[0]) and torch.all(tokens[0, :5] == 0)
