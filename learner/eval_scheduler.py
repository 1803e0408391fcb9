"""Validation around the training loop: when rounds start, when they are logged, when the loop waits.

The rounds themselves (held-out tasks, scalars) are ``learner/evaluation.py``'s ``EvalRounds``.
After every step the scheduler logs the round that completed (at the step it started) and starts
one when due, never waiting for eval episodes. Only ``learner.eval_at_start`` (the untrained policy,
before step 1) and ``eval_at_end`` (the final policy) wait for their round. Without rounds (replay,
or validation off) every call is a no-op.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Protocol

from common.config.learner import LearnerConfig
from common.metrics import MetricsWriter
from learner.evaluation import EvalLeaseIssuer, EvalRounds
from learner.group import Group

log = logging.getLogger("learner")


class EvalHead(EvalLeaseIssuer, Protocol):
    """What validation needs from the live head (``HeadServer``)."""

    eval_groups: queue.Queue[Group]

    def check_alive(self) -> None: ...


class EvalScheduler:
    """Starts, collects and logs validation rounds for the loop (rank 0)."""

    def __init__(self, rounds: EvalRounds | None, head: EvalHead, metrics: MetricsWriter, lc: LearnerConfig,
                 stop: threading.Event):
        self.rounds, self.head, self.metrics, self.lc, self._stop = rounds, head, metrics, lc, stop
        self.logged: list[dict[str, float]] = []
        """Every logged round as ``{"step": s, **scalars}``: the run's summary carries them."""

    def after_step(self, step: int, start: bool = True) -> None:
        """Log the round that completed (at the step it started); start one when due at ``step``."""
        if self.rounds is None:
            return
        for started_at, scalars in self.rounds.collect(self.head.eval_groups):
            self.metrics.scalars(scalars, started_at)
            self.logged.append({"step": started_at, **scalars})
        if start:
            self.rounds.maybe_start(step, self.head)

    def before_training(self, step: int) -> None:
        """``eval_at_start``: the untrained policy's round, before any update reaches the actors."""
        if self.rounds is not None and self.lc.eval_at_start and step == 0:
            self.validate_and_wait(step)

    def after_training(self, step: int) -> None:
        """``eval_at_end``: one more round on the final policy, waited for."""
        if self.rounds is not None and self.lc.eval_at_end and not self._stop.is_set():
            self.validate_and_wait(step)

    def validate_and_wait(self, step: int) -> None:
        """A round of the policy at ``step``, waited for: a round in flight from an earlier step is
        finished first; the actors keep serving training leases meanwhile."""
        assert self.rounds is not None
        deadline_s = time.monotonic() + self.lc.eval_end_timeout_s
        started = self.rounds.in_flight_step == step
        while time.monotonic() < deadline_s and not self._stop.is_set():
            self.head.check_alive()  # a dead head would otherwise be waited on for the whole timeout
            self.after_step(step, start=False)
            if not self.rounds.in_flight:
                if started:
                    return
                self.rounds.start(step, self.head)
                started = True
            time.sleep(0.2)
        log.warning("the validation round of step %d did not complete within %.0f s", step, self.lc.eval_end_timeout_s)
