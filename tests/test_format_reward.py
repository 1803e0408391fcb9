"""The optional format reward and the share of parsable actions: what a small model learns from
before it wins anything, and what shows in tensorboard."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from common.config import ConfigError, load_config
from common.protocol import Trajectory, decode, encode
from learner.advantages import grpo_advantages
from learner.batching import collate
from learner.group import Group
from learner.rollout_metrics import rollout_scalars
from learner.shaping import format_shaped_rewards
from tests.test_protocol import make_trajectory


def episode(parsed: list[int], reward: float = 0.0, env_id: str = "keydoor-v0", index: int = 0,
            accepted: list[int] | None = None) -> Trajectory:
    turns = len(parsed)
    n = 2 * turns + 1
    spans = np.array([[2 * t + 1, 2 * t + 2] for t in range(turns)], np.int32).reshape(-1, 2)
    return dataclasses.replace(
        make_trajectory(n), env_id=env_id, episode_index=index, num_turns=turns, reward=reward, success=reward == 1.0,
        turn_spans=spans, loss_mask=(np.arange(n) % 2 == 1).astype(np.uint8),
        turn_rewards=np.array([0.0] * (turns - 1) + [reward], np.float32),
        turn_observations=np.arange(turns, dtype=np.uint64), turn_action_parsed=np.array(parsed, np.uint8),
        turn_action_accepted=np.array(parsed if accepted is None else accepted, np.uint8))


def test_each_unparsable_turn_costs_its_share_of_the_coefficient_on_that_turn() -> None:
    reward, turn_rewards = format_shaped_rewards(episode([1, 0, 0, 1], reward=1.0), 0.5)
    assert reward == pytest.approx(1.0 - 0.5 * 2 / 4)
    np.testing.assert_allclose(turn_rewards, [0.0, -0.125, -0.125, 1.0])
    unshaped, turn_rewards = format_shaped_rewards(episode([0, 0], reward=1.0), 0.0)
    assert unshaped == 1.0 and turn_rewards.tolist() == [0.0, 1.0]


def test_task_success_always_outscores_the_format_term() -> None:
    coef = 0.9  # the largest allowed values are the worst case
    worst_win, _ = format_shaped_rewards(episode([0, 0, 0, 1], reward=1.0), coef)
    best_failure, _ = format_shaped_rewards(episode([1, 1, 1, 1], reward=0.0), coef)
    assert worst_win > best_failure
    with pytest.raises(ConfigError, match="format_coef"):
        load_config(None, ["--learner.algorithm.format_coef", "1.0"])


def test_an_all_failed_group_learns_toward_parsable_replies_only_with_the_format_reward() -> None:
    group = Group(lease=None, episodes=[episode([1, 1], index=0), episode([0, 0], index=1), episode([1, 0], index=2)])
    plain = collate([group])
    shaped = collate([group], format_coef=0.2)
    assert torch.equal(plain.rewards, torch.zeros(3))  # nothing to learn from
    advantages = grpo_advantages(shaped.rewards, shaped.group_index, std_norm=True)
    assert advantages[0] > advantages[2] > advantages[1]
    torch.testing.assert_close(shaped.turns.rewards, torch.tensor([0.0, 0.0, -0.1, -0.1, 0.0, -0.1]))
    assert [e.reward for e in shaped.episodes] == [0.0, 0.0, 0.0]  # the episodes stay as sent


def test_format_reward_refuses_episodes_recorded_without_the_flags() -> None:
    old = dataclasses.replace(episode([1, 1]), turn_action_parsed=np.zeros(0, np.uint8))
    with pytest.raises(ValueError, match="format_coef 0"):
        collate([Group(lease=None, episodes=[old])], format_coef=0.1)


def test_valid_action_frac_is_the_share_of_parsable_turns_overall_and_per_env() -> None:
    episodes = [episode([1, 0, 0, 0]), episode([1, 1], env_id="textcraft-v0"),
                dataclasses.replace(episode([0, 0]), status="env_error")]  # failed episodes do not count
    scalars = rollout_scalars(episodes, version=4)
    assert scalars["rollout/valid_action_frac"] == pytest.approx(3 / 6)
    assert scalars["env/keydoor-v0/valid_action_frac"] == pytest.approx(1 / 4)
    assert scalars["env/textcraft-v0/valid_action_frac"] == 1.0


def test_accepted_action_frac_is_the_share_of_turns_the_env_carried_out() -> None:
    episodes = [episode([1, 1, 0, 0], accepted=[1, 0, 0, 0]), episode([1, 1], env_id="textcraft-v0")]
    scalars = rollout_scalars(episodes, version=4)
    assert scalars["rollout/valid_action_frac"] == pytest.approx(4 / 6)
    assert scalars["rollout/accepted_action_frac"] == pytest.approx(3 / 6)
    assert scalars["env/keydoor-v0/accepted_action_frac"] == pytest.approx(1 / 4)


def test_parsed_flags_travel_on_the_wire_and_may_be_absent() -> None:
    sent = episode([1, 0, 1])
    np.testing.assert_array_equal(decode(encode(sent), Trajectory).turn_action_parsed, [1, 0, 1])
    assert len(decode(encode(make_trajectory()), Trajectory).turn_action_parsed) == 0
    np.testing.assert_array_equal(decode(encode(episode([1, 1], accepted=[0, 1])), Trajectory).turn_action_accepted,
                                  [0, 1])
    assert len(decode(encode(make_trajectory()), Trajectory).turn_action_accepted) == 0
