"""The optional format reward (``learner.algorithm.format_coef``): a signal a small model can learn from.

A model that rarely writes an action in the env's format fails every episode, every group scores
the same, and group-relative estimators have nothing to learn from. The format reward makes a
reply that holds no parsable action cost ``format_coef / num_turns``, paid on that turn, so an
episode loses ``format_coef`` times its share of unparsable turns, never more. With
``format_coef < 1`` a successful episode (task reward 1, at worst ``1 - format_coef``) still
outscores every failed one (task reward 0, at best 0): the format term can break ties between
failures, it can never hide task success. (A credit for parsable turns instead of a penalty for
the others differs by a constant per episode, which GRPO, RLOO and REINFORCE++ subtract away.)

Why parsed and not carried out (``turn_action_accepted``): tried on SmolLM2 in AgentGym's BabyAI
(a penalty on every turn the env refused), the policy found the action no turn refuses: within 5
steps every reply was ``turn left`` (57 of 64 turns at step 7, up from 14 of 57), success 0. A
penalty that one always-valid action escapes pays for that action, not for the grammar.

Only the learner's training signal is shaped: ``rollout/reward`` and ``rollout/success`` stay the
task's, and ``rollout/valid_action_frac`` shows the share of parsable turns.
"""

from __future__ import annotations

import numpy as np

from common.protocol import Trajectory


def format_shaped_rewards(episode: Trajectory, format_coef: float) -> tuple[float, np.ndarray]:
    """(episode reward, per-turn rewards) with the format penalty applied; unchanged at coef 0."""
    if format_coef == 0:
        return episode.reward, episode.turn_rewards
    parsed = episode.turn_action_parsed
    if len(parsed) != episode.num_turns:
        raise ValueError(f"format_coef > 0 needs each turn's action_parsed flag; episode {episode.lease_id}/"
                         f"{episode.episode_index} carries {len(parsed)} for {episode.num_turns} turns (a "
                         "recording made before actors sent them): set learner.algorithm.format_coef 0")
    if episode.num_turns == 0:
        return episode.reward, episode.turn_rewards
    penalties = format_coef * (1 - parsed.astype(np.float32)) / episode.num_turns
    per_turn = len(episode.turn_rewards) == len(penalties)
    turn_rewards = episode.turn_rewards - penalties if per_turn else episode.turn_rewards
    return float(episode.reward - penalties.sum()), turn_rewards.astype(np.float32)
