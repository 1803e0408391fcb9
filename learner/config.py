"""Configuration of the learner (``learner:`` section)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class HorizonConfig:
    turn_caps: list[int] = field(default_factory=lambda: [4, 6, 8])
    """Turn cap of each stage (ScalingInter-RL: small first, then longer horizons)."""
    boundaries: list[int] = field(default_factory=lambda: [10, 20])
    """Learner steps at which stage i+1 starts; one fewer than ``turn_caps``."""


@dataclass(frozen=True)
class LearnerConfig:
    num_ranks: int = 1
    """FSDP ranks (``--learner-gpus``); CPU processes over gloo when there is no GPU."""
    torch_threads: int = 1
    """Torch intra-op threads per learner rank on CPU."""
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping threshold (global norm)."""
    groups_per_step: int = 4
    """GRPO groups (task leases) in one learner batch."""
    max_policy_lag: int = 2
    """Staleness bound S: no lease is admitted that could yield samples more than S versions old."""
    lease_timeout_s: float = 120.0
    """A lease not returned by then is re-issued; late results are discarded and counted."""
    clip_eps: float = 0.2
    """PPO clip range of the ratio current / proximal policy."""
    is_cap: float = 2.0
    """Cap C of the truncated importance weight proximal / behavior policy."""
    grpo_std_norm: bool = True
    """Divide GRPO advantages by the group's reward std."""
    horizon: HorizonConfig = field(default_factory=HorizonConfig)
    """ScalingInter-RL turn-cap schedule."""
    bucket_mb: float = 16.0
    """Size of one weight-broadcast bucket in MiB."""
    broadcast_timeout_s: float = 60.0
    """Deadline of the weight-broadcast collective."""
    checkpoint_every: int = 0
    """Save a checkpoint every N steps (0: only at the end)."""
    tb_flush_s: float = 5.0
    """Tensorboard flush interval, so a live run shows current values."""
