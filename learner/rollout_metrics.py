"""Scalars that describe the episodes of one learner step (``rollout/``, ``env/``, ``async/``)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from common.protocol import Trajectory
from learner.batching import policy_lag


def rollout_scalars(episodes: list[Trajectory], version: int) -> dict[str, float]:
    if not episodes:
        return {}
    out = episode_summary("rollout", episodes)
    by_env: dict[str, list[Trajectory]] = defaultdict(list)
    for e in episodes:
        by_env[e.env_id].append(e)
    for env_id, env_episodes in by_env.items():
        summary = episode_summary(f"env/{env_id}", env_episodes)
        out.update({k: v for k, v in summary.items()
                    if k.rsplit("/", 1)[1] in ("reward", "success", "num_turns", "valid_action_frac",
                                                    "accepted_action_frac")})
    lags = [policy_lag(e, version) for e in episodes if e.status == "ok"]
    if lags:
        out["async/policy_lag_mean"] = float(np.mean(lags))
        out["async/policy_lag_max"] = float(np.max(lags))
    at_cap = [e.truncated and e.finish_reason == "turn_cap" for e in episodes]
    out["horizon/truncated_at_cap"] = float(np.mean(at_cap))
    return out


def episode_summary(prefix: str, episodes: list[Trajectory]) -> dict[str, float]:
    """``<prefix>/{reward,success,num_turns}`` over the ok episodes (all if none is ok), and
    ``valid_action_frac`` over their turns (the share whose reply held an action in the env's format),
    ``accepted_action_frac`` (the share the env carried out), and ``truncated_frac``, ``error_frac``,
    ``episode_tokens`` over all of them."""
    ok = [e for e in episodes if e.status == "ok"] or episodes
    return _turn_share(prefix, "valid_action_frac", [e.turn_action_parsed for e in ok]) | _turn_share(
        prefix, "accepted_action_frac", [e.turn_action_accepted for e in ok]) | {
        f"{prefix}/reward": float(np.mean([e.reward for e in ok])),
        f"{prefix}/success": float(np.mean([e.success for e in ok])),
        f"{prefix}/num_turns": float(np.mean([e.num_turns for e in ok])),
        f"{prefix}/truncated_frac": float(np.mean([e.truncated for e in episodes])),
        f"{prefix}/error_frac": float(np.mean([e.status != "ok" for e in episodes])),
        f"{prefix}/episode_tokens": float(np.mean([len(e.token_ids) for e in episodes])),
    }


def _turn_share(prefix: str, name: str, flags: list[np.ndarray]) -> dict[str, float]:
    """``<prefix>/<name>``: the share of 1s over the episodes' per-turn flags; none when none carries them."""
    present = [f for f in flags if len(f)]
    return {f"{prefix}/{name}": float(np.concatenate(present).mean())} if present else {}
