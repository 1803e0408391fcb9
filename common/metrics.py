"""The one tensorboard writer: owns the metric namespaces of docs/architecture.md.

Every scalar is logged against the learner step. A name outside the known namespaces is a bug
(a typo would silently create a new curve), so it raises.
"""

from __future__ import annotations

import time
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

NAMESPACES = ("rollout", "env", "eval", "learner", "optim", "async", "horizon", "perf", "time", "envhub")


class MetricsWriter:
    """Tensorboard scalars and text under ``<run>/tb``, flushed every ``flush_s`` seconds."""

    def __init__(self, tb_dir: Path, flush_s: float = 5.0):
        self._writer = SummaryWriter(log_dir=str(tb_dir), flush_secs=max(1, int(flush_s)))
        self._flush_s = flush_s
        self._last_flush = time.monotonic()

    def scalars(self, values: dict[str, float], step: int) -> None:
        for name, value in values.items():
            if name.split("/", 1)[0] not in NAMESPACES or "/" not in name:
                raise ValueError(f"metric {name!r} is outside the namespaces {NAMESPACES}")
            self._writer.add_scalar(name, float(value), global_step=step)
        if time.monotonic() - self._last_flush >= self._flush_s:
            self.flush()

    def text(self, tag: str, markdown: str, step: int = 0) -> None:
        self._writer.add_text(tag, markdown, global_step=step)

    def flush(self) -> None:
        self._writer.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        self._writer.close()
