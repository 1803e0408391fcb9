"""Whether an actor's engine is dead for good, so that the actor stops and the launcher restarts it.

A request error is the episode's business: one failed forward pass fails the requests of its
batch, those episodes end ``engine_error`` and the next ones go on. The engine is dead when it
says so (``InferenceEngine.failure``: a crashed worker thread, a failed weight update), or when
``max_consecutive_errors`` episodes in a row ended ``engine_error`` with no ``ok`` one between
them (an engine that claims to serve and never does). Leasing more work would then only turn
tasks into errors while the process, alive, is never restarted.
"""

from __future__ import annotations

from actors.engine_api import InferenceEngine


class EngineDead(RuntimeError):
    """The actor's engine will never serve again: the actor process must be restarted."""


class EngineHealth:
    """Reads the engine's own word and the outcomes of the actor's episodes."""

    def __init__(self, engine: InferenceEngine, max_consecutive_errors: int):
        if max_consecutive_errors < 1:
            raise ValueError(f"max_consecutive_errors must be >= 1, got {max_consecutive_errors}")
        self.engine, self.max_consecutive_errors = engine, max_consecutive_errors
        self.consecutive_errors = 0
        self._last_error = ""

    def observe(self, status: str, error: str = "") -> None:
        """One finished episode: ``engine_error`` counts, ``ok`` clears the count, others say nothing
        about the engine (an env failure may end an episode before it ever generated)."""
        if status == "engine_error":
            self.consecutive_errors += 1
            self._last_error = error
        elif status == "ok":
            self.consecutive_errors = 0

    def dead_reason(self) -> str | None:
        """Why the engine is dead for good, or None while it may still serve."""
        failure = self.engine.failure
        if failure is not None:
            return f"the inference engine stopped serving: {failure}"
        if self.consecutive_errors >= self.max_consecutive_errors:
            return (f"{self.consecutive_errors} episodes in a row ended engine_error, none ok in between "
                    f"(last: {self._last_error})")
        return None
