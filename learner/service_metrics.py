"""Scalars about the services around the learner: envhub health and the actors' own stats."""

from __future__ import annotations

import httpx

from common.auth import token_from_env
from common.protocol import ActorStats


def envhub_scalars(envhub_url: str | None, timeout_s: float = 2.0) -> dict[str, float]:
    """``envhub/`` scalars from the server's /health; ``envhub/up`` is 0 when it does not answer."""
    if not envhub_url:
        return {}
    try:
        token = token_from_env()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        health = httpx.get(f"{envhub_url}/health", timeout=timeout_s, trust_env=False, headers=headers).json()
    except (httpx.HTTPError, ValueError):
        return {"envhub/up": 0.0}
    stats = health.get("stats", {})
    latency = stats.get("step_latency_s", {})
    out = {"envhub/up": 1.0, "envhub/sessions": float(health.get("sessions", 0)),
           "envhub/steps_total": float(stats.get("steps_total", 0)),
           "envhub/errors_total": float(sum(stats.get("errors", {}).values()))}
    for key in ("p50", "p99"):
        if latency.get(key) is not None:
            out[f"envhub/step_latency_{key}_s"] = float(latency[key])
    return out


def actor_scalars(stats: dict[int, ActorStats]) -> dict[str, float]:
    """Sums and extremes over the latest ``ActorStats`` of every actor."""
    if not stats:
        return {}
    latest = list(stats.values())
    return {
        "perf/actor_tokens_per_s": sum(s.tokens_per_s for s in latest),
        "async/actor_engine_queue_depth": float(sum(s.engine_queue_depth for s in latest)),
        "async/actor_episodes_running": float(sum(s.episodes_running for s in latest)),
        "async/actor_weight_version_min": float(min(s.weight_version for s in latest)),
        "rollout/actor_errors_total": float(sum(sum(s.errors.values()) for s in latest)),
    }
