"""Configuration of the rollout actors (``actors:`` section)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ActorsConfig:
    count: int = 1
    """Number of actor processes (``--actors``)."""
    max_concurrent_episodes: int = 16
    """Episodes one actor runs at once; more leases are not requested beyond this."""
    max_batch_size: int = 32
    """Most sequences the CPU engine decodes in one forward pass."""
    torch_threads: int = 1
    """Torch intra-op threads per actor process (CPU engine)."""
    env_timeout_s: float = 30.0
    """HTTP deadline of one envhub call; a miss ends the episode with status ``timeout``."""
    stats_interval_s: float = 5.0
    """How often an actor sends ActorStats to the head."""
    join_timeout_s: float = 120.0
    """How long an actor waits to join the weight-broadcast group at start-up."""
