"""Advantages: outcome reward placement and GRPO normalization against hand-computed cases."""

import pytest
import torch

from learner.advantages import (
    grpo_advantages,
    last_assistant_index,
    outcome_token_rewards,
    sequence_to_token_advantages,
)

# Row 0: prompt(2) turn1(2) obs(2) turn2(2) final-obs(1). Row 1: single turn then padding.
# Row 2: nothing sampled (e.g. the engine failed before the first turn).
MULTI_TURN_MASK = torch.tensor([
    [0, 0, 1, 1, 0, 0, 1, 1, 0],
    [0, 1, 1, 1, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, 0, 0, 0, 0],
], dtype=torch.uint8)


def test_outcome_reward_lands_on_last_assistant_token_not_on_env_tokens():
    token_rewards = outcome_token_rewards(torch.tensor([2.0, -1.0, 5.0]), MULTI_TURN_MASK)
    expected = torch.zeros(3, 9)
    expected[0, 7] = 2.0  # last token of turn 2, not the final observation at index 8
    expected[1, 3] = -1.0
    assert torch.equal(token_rewards, expected)
    assert torch.equal(last_assistant_index(MULTI_TURN_MASK), torch.tensor([7, 3, -1]))


def test_outcome_reward_accepts_bool_mask_and_keeps_reward_dtype():
    token_rewards = outcome_token_rewards(torch.tensor([0.5], dtype=torch.float64), torch.tensor([[True, False]]))
    assert token_rewards.dtype == torch.float64
    assert token_rewards.tolist() == [[0.5, 0.0]]


def test_grpo_hand_computed_with_unbiased_std_interleaved_labels_and_singleton():
    # group 7: rewards 1, 0, 1, 1 -> mean 0.75, unbiased std sqrt(0.75 / 3) = 0.5
    # group 3: rewards 0.2, 0.2 -> all equal -> 0; group 9: singleton -> 0
    rewards = torch.tensor([1.0, 0.2, 0.0, 1.0, 0.2, 1.0, 4.0])
    groups = torch.tensor([7, 3, 7, 7, 3, 7, 9])
    adv = grpo_advantages(rewards, groups, std_norm=True, eps=0.0)
    assert torch.allclose(adv, torch.tensor([0.25, 0.0, -0.75, 0.25, 0.0, 0.25, 0.0]) / 0.5)
    centered = grpo_advantages(rewards, groups, std_norm=False)
    assert torch.allclose(centered, torch.tensor([0.25, 0.0, -0.75, 0.25, 0.0, 0.25, 0.0]))


def test_grpo_eps_keeps_constant_groups_finite_and_is_added_to_std():
    adv = grpo_advantages(torch.tensor([3.0, 3.0, 1.0, 3.0]), torch.tensor([0, 0, 1, 1]), std_norm=True, eps=0.1)
    # group 1: mean 2, unbiased std sqrt(2) -> (1 - 2) / (sqrt 2 + 0.1)
    expected_b = 1.0 / (2.0 ** 0.5 + 0.1)
    assert torch.allclose(adv, torch.tensor([0.0, 0.0, -expected_b, expected_b]))


def test_grpo_rejects_misaligned_or_float_groups():
    with pytest.raises(ValueError, match="group_index"):
        grpo_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.long), std_norm=True)
    with pytest.raises(ValueError, match="integer"):
        grpo_advantages(torch.zeros(3), torch.zeros(3), std_norm=True)


def test_sequence_advantage_broadcast_only_over_assistant_tokens():
    token_adv = sequence_to_token_advantages(torch.tensor([1.5, -2.0, 3.0]), MULTI_TURN_MASK)
    assert token_adv[0].tolist() == [0, 0, 1.5, 1.5, 0, 0, 1.5, 1.5, 0]
    assert token_adv[1].tolist() == [0, -2.0, -2.0, -2.0, 0, 0, 0, 0, 0]
    assert token_adv[2].abs().sum() == 0


def test_grpo_then_broadcast_end_to_end_for_one_group():
    rewards = torch.tensor([1.0, 0.0, 0.0])
    adv = grpo_advantages(rewards, torch.tensor([0, 0, 0]), std_norm=False)
    token_adv = sequence_to_token_advantages(adv, MULTI_TURN_MASK)
    # the failed row 2 still has a nonzero advantage but no token to carry it
    assert torch.allclose(token_adv[0, 2], torch.tensor(2 / 3))
    assert torch.allclose(token_adv[1, 1], torch.tensor(-1 / 3))
    assert token_adv[2].abs().sum() == 0


def test_shape_errors_are_clear():
    with pytest.raises(ValueError, match=r"rewards must be \[B\]"):
        outcome_token_rewards(torch.zeros(2), MULTI_TURN_MASK)
    with pytest.raises(ValueError, match=r"loss_mask must be \[B, T\]"):
        sequence_to_token_advantages(torch.zeros(3), torch.zeros(3))
