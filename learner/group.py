"""One completed lease's episodes: what the head hands the training loop, replay and evaluation.

Its own module, not the head's, so that what reads groups (batching, replay, the collector,
evaluation) does not import the head's sockets (ZeroMQ) to name the type.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from common.protocol import TaskLease, Trajectory


@dataclass
class Group:
    """All episodes of one completed lease (one GRPO group)."""

    lease: TaskLease
    episodes: list[Trajectory] = field(default_factory=list)
    completed_at: float = 0.0
