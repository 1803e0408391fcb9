"""Advantages: reward placement, GRPO, RLOO, REINFORCE++ and GAE against hand-computed cases."""

import math
import typing

import pytest
import torch

from common.config.learner import ALGORITHMS, Advantage, GigpoAlgorithm, GrpoAlgorithm, RlooAlgorithm
from learner.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    assistant_returns,
    gae_advantages,
    gigpo_advantages,
    grpo_advantages,
    kl_shaped_token_rewards,
    last_assistant_index,
    outcome_token_rewards,
    reinforce_pp_advantages,
    rloo_advantages,
    sequence_to_token_advantages,
    turn_returns,
    turn_rewards_summing_to,
    turn_token_rewards,
    whiten,
)
from learner.turns import BatchTurns

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


NAN = float("nan")


def test_rloo_baseline_is_the_mean_of_the_other_episodes():
    # group 5: rewards 1, 0, 2 -> others' means 1, 1.5, 0.5; group 2: singleton -> 0
    adv = rloo_advantages(torch.tensor([1.0, 3.0, 0.0, 2.0]), torch.tensor([5, 2, 5, 5]))
    assert torch.allclose(adv, torch.tensor([0.0, 0.0, -1.5, 1.5]))


def test_kl_penalty_lands_on_assistant_tokens_only():
    kl = torch.full((3, 9), NAN)  # garbage off the mask must not leak into the rewards
    kl[0, [2, 3, 6, 7]] = torch.tensor([0.5, 1.0, 0.0, 2.0])
    kl[1, [1, 2, 3]] = torch.tensor([1.0, 1.0, 1.0])
    rewards = kl_shaped_token_rewards(torch.tensor([1.0, 0.0, 3.0]), MULTI_TURN_MASK, kl, kl_coef=0.1)
    assert torch.allclose(rewards[0], torch.tensor([0, 0, -0.05, -0.1, 0, 0, 0, 1 - 0.2, 0]))
    assert torch.allclose(rewards[1], torch.tensor([0, -0.1, -0.1, -0.1, 0, 0, 0, 0, 0]))
    assert rewards[2].abs().sum() == 0


def test_returns_skip_env_tokens_and_discount_once_per_assistant_token():
    token_rewards = torch.zeros(3, 9)
    token_rewards[0, 2], token_rewards[0, 7] = -0.1, 1.0
    token_rewards[0, 4] = 50.0  # an env token: never part of a return
    returns = assistant_returns(token_rewards, MULTI_TURN_MASK, gamma=0.5)
    # G7 = 1, G6 = 0.5, G3 = 0.25 (one discount across the observation), G2 = -0.1 + 0.125
    assert torch.allclose(returns[0], torch.tensor([0, 0, 0.025, 0.25, 0, 0, 0.5, 1.0, 0]))
    assert returns[1:].abs().sum() == 0


def masked_stats(x, mask):
    values = x[mask.bool()]
    return float(values.mean()), float(values.var(unbiased=False))


def test_reinforce_pp_whitens_returns_over_all_assistant_tokens_of_the_batch():
    token_rewards = outcome_token_rewards(torch.tensor([2.0, -1.0, 7.0]), MULTI_TURN_MASK)
    adv = reinforce_pp_advantages(token_rewards, MULTI_TURN_MASK, gamma=1.0)
    # returns: 2 on row 0's four tokens, -1 on row 1's three; row 2 has none
    mean = (4 * 2 - 3) / 7
    std = math.sqrt((4 * (2 - mean) ** 2 + 3 * (-1 - mean) ** 2) / 7)
    assert torch.allclose(adv[0, [2, 3, 6, 7]], torch.full((4,), (2 - mean) / std))
    assert torch.allclose(adv[1, [1, 2, 3]], torch.full((3,), (-1 - mean) / std))
    assert adv[MULTI_TURN_MASK == 0].abs().sum() == 0
    assert masked_stats(adv, MULTI_TURN_MASK) == pytest.approx((0.0, 1.0), abs=1e-6)


def test_whiten_of_constant_returns_is_zero_not_nan():
    adv = whiten(torch.ones(2, 3), torch.tensor([[1, 1, 0], [0, 1, 1]]))
    assert torch.equal(adv, torch.zeros(2, 3))


# One episode: prompt, turn 1 (2 tokens), observation (2), turn 2 (1 token), final observation.
GAE_MASK = torch.tensor([[0, 1, 1, 0, 0, 1, 0]])
GAE_VALUES = torch.tensor([[NAN, 0.5, 0.6, NAN, NAN, 0.8, NAN]])  # env values are never read


def test_gae_hand_computed_over_assistant_tokens_only():
    token_rewards = outcome_token_rewards(torch.tensor([1.0]), GAE_MASK)
    adv, returns = gae_advantages(token_rewards, GAE_VALUES, GAE_MASK, gamma=0.9, lam=0.8)
    # t=5: delta = 1 - 0.8 = 0.2 (terminal)        A = 0.2
    # t=2: delta = 0.9 * 0.8 - 0.6 = 0.12          A = 0.12 + 0.72 * 0.2 = 0.264
    # t=1: delta = 0.9 * 0.6 - 0.5 = 0.04          A = 0.04 + 0.72 * 0.264 = 0.23008
    assert torch.allclose(adv, torch.tensor([[0, 0.23008, 0.264, 0, 0, 0.2, 0]]))
    assert torch.allclose(returns, torch.tensor([[0, 0.73008, 0.864, 0, 0, 1.0, 0]]))


def test_gae_with_lambda_one_is_the_monte_carlo_return_minus_the_value():
    token_rewards = outcome_token_rewards(torch.tensor([1.0]), GAE_MASK)
    adv, returns = gae_advantages(token_rewards, GAE_VALUES, GAE_MASK, gamma=1.0, lam=1.0)
    assert torch.allclose(adv, torch.tensor([[0, 0.5, 0.4, 0, 0, 0.2, 0]]))
    assert torch.allclose(returns, GAE_MASK.float())


def test_gae_with_lambda_zero_is_one_step_td():
    token_rewards = outcome_token_rewards(torch.tensor([1.0]), GAE_MASK)
    adv, _ = gae_advantages(token_rewards, GAE_VALUES, GAE_MASK, gamma=1.0, lam=0.0)
    assert torch.allclose(adv, torch.tensor([[0, 0.1, 0.2, 0, 0, 0.2, 0]]))


def test_per_token_shape_errors_are_clear():
    with pytest.raises(ValueError, match="values and loss_mask"):
        gae_advantages(torch.zeros(1, 7), torch.zeros(1, 6), GAE_MASK, 1.0, 1.0)
    with pytest.raises(ValueError, match="kl must be"):
        kl_shaped_token_rewards(torch.zeros(1), GAE_MASK, torch.zeros(1, 3), kl_coef=0.1)


def test_turn_returns_discount_within_each_row_only():
    # rows interleaved: row 0 has turns 0, 2, 3; row 1 has turn 1
    rewards = torch.tensor([0.0, 5.0, 0.2, 1.0])
    rows = torch.tensor([0, 1, 0, 0])
    returns = turn_returns(rewards, rows, gamma=0.5)
    assert torch.allclose(returns, torch.tensor([0.2 * 0.5 + 0.25, 5.0, 0.2 + 0.5, 1.0]))


def test_gigpo_credits_the_better_action_from_a_shared_state():
    # One group of two won episodes (equal outcomes: episode advantage 0). Both start from the
    # same observation (anchor 0); episode 0 wins at once, episode 1 wastes a turn in a state
    # only it saw (anchor 1) and wins a turn later. The step advantage must favour episode 0's
    # first turn over episode 1's, and leave the unshared state's turn at 0.
    loss_mask = torch.tensor([[0, 1, 1, 0, 0, 0, 0], [0, 1, 1, 0, 1, 0, 1]])
    spans = torch.tensor([[1, 3], [1, 3], [4, 5], [6, 7]])
    rows, anchors = torch.tensor([0, 1, 1, 1]), torch.tensor([0, 0, 1, 2])
    returns = turn_returns(torch.tensor([1.0, 0.0, 0.0, 1.0]), rows, gamma=0.9)
    step = grpo_advantages(returns, anchors, std_norm=False)
    episode = grpo_advantages(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), std_norm=False)
    advantages = gigpo_advantages(episode, step, rows, spans, loss_mask, step_weight=1.0)
    first_turn_gap = (1.0 - 0.81) / 2
    assert torch.allclose(advantages[0], torch.tensor([0, 1, 1, 0, 0, 0, 0]) * first_turn_gap)
    assert torch.allclose(advantages[1], torch.tensor([0, -1, -1, 0, 0, 0, 0]) * first_turn_gap)


def test_gigpo_adds_the_weighted_step_advantage_to_the_episode_advantage_on_turn_tokens_only():
    loss_mask = torch.tensor([[0, 1, 1, 0, 1]])
    episode = torch.tensor([0.5])
    step = torch.tensor([2.0, -1.0])
    advantages = gigpo_advantages(episode, step, torch.tensor([0, 0]), torch.tensor([[1, 3], [4, 5]]), loss_mask, 0.5)
    assert torch.allclose(advantages, torch.tensor([[0.0, 1.5, 1.5, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="turn_spans"):
        gigpo_advantages(episode, step, torch.tensor([0, 0]), torch.tensor([1, 3]), loss_mask, 0.5)


def test_gigpo_step_returns_are_in_the_units_of_the_episode_reward_trained_on():
    # Two one-turn episodes of one group from the same observation. The first one's progress rewards
    # add to 2, clipped to an episode reward of 1: its turn must count 1 there too, so that a one-turn
    # episode's step return is its episode reward and the step advantage equals the episode one.
    loss_mask = torch.tensor([[0, 1, 1], [0, 1, 1]])
    turns = BatchTurns(row=torch.tensor([0, 1]), spans=torch.tensor([[1, 3], [1, 3]]),
                       rewards=torch.tensor([2.0, 0.5]), anchor=torch.tensor([0, 0]))
    inputs = AdvantageInputs(torch.tensor([1.0, 0.5]), torch.tensor([0, 0]), loss_mask, turns=turns)
    settings = GigpoAlgorithm(gamma=0.9, step_advantage_weight=1.0, std_norm=False)
    advantages = ADVANTAGE_ESTIMATORS["gigpo"].compute(inputs, settings).advantages
    episode_advantage = 0.25  # (1.0 - 0.5) / 2
    assert torch.allclose(advantages, torch.tensor([[0.0, 1.0, 1.0], [0.0, -1.0, -1.0]]) * 2 * episode_advantage)


# One episode of three turns (prompt, turn, observation, turn, observation, turn, final observation)
# and an episode of one turn; spans are [start, end) of each turn's tokens in its row.
THREE_TURN_MASK = torch.tensor([
    [0, 1, 1, 0, 1, 1, 0, 1, 1, 0],
    [0, 0, 1, 1, 0, 0, 0, 0, 0, 0],
])
THREE_TURN_ROWS = torch.tensor([0, 0, 0, 1])
THREE_TURN_SPANS = torch.tensor([[1, 3], [4, 6], [7, 9], [2, 4]])


def _turn_token_returns(turn_rewards, gamma):
    token_rewards = turn_token_rewards(turn_rewards, THREE_TURN_ROWS, THREE_TURN_SPANS, THREE_TURN_MASK)
    return assistant_returns(token_rewards, THREE_TURN_MASK, gamma)


def test_each_turns_reward_lands_on_the_last_token_of_that_turn():
    token_rewards = turn_token_rewards(torch.tensor([0.2, 0.0, 0.5, 1.0]), THREE_TURN_ROWS, THREE_TURN_SPANS,
                                       THREE_TURN_MASK)
    placed = {tuple(at) for at in torch.nonzero(token_rewards).tolist()}
    assert placed == {(0, 2), (0, 8), (1, 3)}  # ends of turns 1 and 3 of row 0, end of row 1's turn
    assert token_rewards.sum(dim=1).tolist() == pytest.approx([0.7, 1.0])


def test_a_reward_earned_at_turn_one_is_credited_to_turn_one_not_to_later_turns():
    gamma = 0.9
    returns = _turn_token_returns(torch.tensor([1.0, 0.0, 0.0, 0.0]), gamma)
    turn = [returns[0, start:end] for start, end in THREE_TURN_SPANS[:3].tolist()]
    assert turn[0].min() > turn[2].max()  # turn 1 earned it: it gets more of it than turn 3
    assert turn[1].abs().max() == 0 and turn[2].abs().max() == 0  # later turns never see an earlier reward
    # what the episode-sum-on-the-last-token placement did instead: turn 3 got the most
    outcome = assistant_returns(outcome_token_rewards(torch.tensor([1.0, 0.0]), THREE_TURN_MASK),
                                THREE_TURN_MASK, gamma)
    assert outcome[0, 7:9].min() > outcome[0, 1:3].max()


def test_a_turns_return_never_includes_the_rewards_of_earlier_turns():
    gamma = 0.8
    full = _turn_token_returns(torch.tensor([0.3, 0.5, 0.7, 0.0]), gamma)
    late = _turn_token_returns(torch.tensor([0.0, 0.5, 0.7, 0.0]), gamma)  # turn 1's reward taken away
    assert torch.equal(full[0, 4:], late[0, 4:])  # turns 2 and 3 are unaffected
    assert (full[0, 1:3] > late[0, 1:3]).all()  # turn 1 lost exactly its own reward


def test_turn_rewards_sum_to_the_clipped_episode_reward_keeping_where_it_was_earned():
    rows = torch.tensor([0, 0, 1, 1, 2, 2, 3])
    env = torch.tensor([0.5, 1.0, 0.2, 0.3, 0.6, -0.6, 0.4])
    episode = torch.tensor([1.0, 0.5, 0.25, 0.0])  # row 0 clipped from 1.5; row 2 shaped from 0
    scaled = turn_rewards_summing_to(env, rows, episode)
    sums = torch.zeros(4).index_add_(0, rows, scaled)
    assert torch.allclose(sums, episode)
    assert torch.allclose(scaled[:2], env[:2] / 1.5)  # the clip scales every turn alike
    assert torch.allclose(scaled[2:4], env[2:4])  # nothing clipped: unchanged
    assert torch.allclose(scaled[4:6], torch.tensor([0.6, -0.6 + 0.25]))  # no scale fits a sum of 0: last turn
    assert torch.allclose(scaled[6:], torch.tensor([0.0]))


def test_a_turn_without_sampled_tokens_credits_a_nearby_token_so_no_reward_is_lost():
    mask = torch.tensor([[0, 0, 1, 1, 0, 0, 0]])
    spans = torch.tensor([[1, 1], [2, 4], [5, 5]])  # turns 1 and 3 sampled nothing
    token_rewards = turn_token_rewards(torch.tensor([0.1, 0.2, 0.4]), torch.tensor([0, 0, 0]), spans, mask)
    # turn 1 has no earlier token: the row's first one; turn 3: the last token before it
    assert token_rewards[0, 2].item() == pytest.approx(0.1) and token_rewards[0, 3].item() == pytest.approx(0.6)
    assert token_rewards.sum().item() == pytest.approx(0.7)


def _loop_returns(token_rewards, loss_mask, gamma):
    """The Python loop over T that ``assistant_returns`` replaced: the reference it must equal."""
    keep = loss_mask.bool()
    returns, running = torch.zeros_like(token_rewards), torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        step = token_rewards[:, t] + gamma * running
        running = torch.where(keep[:, t], step, running)
        returns[:, t] = torch.where(keep[:, t], step, torch.zeros_like(step))
    return returns


def _loop_gae(token_rewards, values, loss_mask, gamma, lam):
    """The Python loop over T that ``gae_advantages`` replaced."""
    keep = loss_mask.bool()
    values = torch.where(keep, values.to(token_rewards.dtype), torch.zeros_like(token_rewards))
    advantages = torch.zeros_like(token_rewards)
    next_value, running = torch.zeros_like(token_rewards[:, 0]), torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        step = token_rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * running
        running = torch.where(keep[:, t], step, running)
        next_value = torch.where(keep[:, t], values[:, t], next_value)
        advantages[:, t] = torch.where(keep[:, t], step, torch.zeros_like(step))
    return advantages, advantages + values


def _loop_turn_returns(turn_rewards, turn_row, gamma):
    returns, running = torch.zeros_like(turn_rewards), {}
    for n in reversed(range(turn_rewards.shape[0])):
        returns[n] = turn_rewards[n] + gamma * running.get(int(turn_row[n]), 0.0)
        running[int(turn_row[n])] = returns[n]
    return returns


def _random_episodes(seed, rows=5, width=300):
    # widths past the 128-token sweep chunk; a row with no assistant token; env gaps of any length
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.rand(rows, width, generator=generator) < 0.6).float()
    mask[0] = 0
    return (torch.randn(rows, width, generator=generator, dtype=torch.float64), mask,
            torch.randn(rows, width, generator=generator, dtype=torch.float64))


# float64 sums in a different order agree to rounding; float32 results round once from the float64 sum
TOLERANCE = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=1e-6, atol=1e-6)}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.97, 0.95), (0.5, 0.0), (0.0, 0.9)])
def test_vectorised_returns_and_gae_equal_the_loop_over_tokens(dtype, gamma, lam):
    for seed in range(3):
        rewards, mask, values = _random_episodes(seed)
        expected_returns = _loop_returns(rewards, mask, gamma)  # float64 reference
        expected_gae = _loop_gae(rewards, values, mask, gamma, lam)
        returns = assistant_returns(rewards.to(dtype), mask, gamma)
        advantages, targets = gae_advantages(rewards.to(dtype), values.to(dtype), mask, gamma, lam)
        assert returns.dtype == advantages.dtype == targets.dtype == dtype
        torch.testing.assert_close(returns, expected_returns.to(dtype), **TOLERANCE[dtype])
        torch.testing.assert_close(advantages, expected_gae[0].to(dtype), **TOLERANCE[dtype])
        torch.testing.assert_close(targets, expected_gae[1].to(dtype), **TOLERANCE[dtype])
        assert (returns[mask == 0] == 0).all() and (advantages[mask == 0] == 0).all()


def test_vectorised_returns_with_gamma_one_equal_the_loop_bit_for_bit():
    # integer-valued rewards: every partial sum is exact, so any summation order gives the same bits
    rewards, mask, _ = _random_episodes(7)
    rewards = rewards.mul(8).round().float()
    assert torch.equal(assistant_returns(rewards, mask, 1.0), _loop_returns(rewards, mask, 1.0))


def test_vectorised_turn_returns_equal_the_loop_over_turns():
    generator = torch.Generator().manual_seed(3)
    rows = torch.randint(0, 7, (400,), generator=generator) * 3  # sparse, interleaved labels
    rewards = torch.randn(400, generator=generator, dtype=torch.float64)
    for gamma in (1.0, 0.9, 0.0):
        torch.testing.assert_close(turn_returns(rewards, rows, gamma), _loop_turn_returns(rewards, rows, gamma),
                                   **TOLERANCE[torch.float64])
    assert turn_returns(torch.zeros(0), torch.zeros(0, dtype=torch.long), 0.9).shape == (0,)


def test_the_registry_holds_exactly_the_estimators_the_config_offers():
    assert set(ADVANTAGE_ESTIMATORS) == set(typing.get_args(Advantage))
    assert set(ALGORITHMS) == set(ADVANTAGE_ESTIMATORS)  # each estimator has its learner.algorithm section
    assert [name for name, estimator in ADVANTAGE_ESTIMATORS.items() if estimator.critic] == ["gae"]


def test_a_registered_estimator_is_the_pure_function_with_its_settings():
    rewards, groups = torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 1, 1], [1, 1, 1]])
    inputs = AdvantageInputs(rewards, groups, mask)
    for std_norm in (True, False):
        expected = sequence_to_token_advantages(grpo_advantages(rewards, groups, std_norm), mask)
        grpo = ADVANTAGE_ESTIMATORS["grpo"].compute(inputs, GrpoAlgorithm(std_norm=std_norm))
        assert torch.equal(grpo.advantages, expected)
    rloo = ADVANTAGE_ESTIMATORS["rloo"].compute(inputs, RlooAlgorithm())
    assert torch.equal(rloo.advantages, sequence_to_token_advantages(rloo_advantages(rewards, groups), mask))
    with pytest.raises(ValueError, match="gigpo needs each turn's reward"):
        ADVANTAGE_ESTIMATORS["gigpo"].compute(inputs, GigpoAlgorithm())
