"""Handing freed heap memory back to the OS, where the C library can (glibc's ``malloc_trim``).

Why a long-running torch process needs it: CPU tensors come from malloc, and glibc serves blocks
under its mmap threshold from heaps, raising that threshold to the size of each large block freed
(up to 32 MB). The transient tensors of prefills and decode steps (MBs each, their sizes changing
with every batch) thus end up in heaps that fragment: freed, yet still resident. Measured with
SmolLM2: an actor's engine (8 BabyAI episodes a round, new weights after each) went 2.0 -> 3.8 GB
over 6 rounds with no more live tensors, and ``malloc_trim(0)`` once a round kept it at 1.9-2.0 GB,
for 20-65 ms a call; the learner went 3.3 -> 5.1 GB over 8 steps, and trimmed after each step
2.5 -> 2.7 GB (``tests/bench/memory_growth_bench.py``). A fixed ``MALLOC_MMAP_THRESHOLD_`` kept the
actor flat too, but made each round ~40 % slower (every large tensor a fresh mapping, page-faulted in).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable


def _find_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # no glibc (macOS, musl): nothing to hand back this way
        return None


_MALLOC_TRIM = _find_malloc_trim()


def trim_heap() -> bool:
    """Return the heaps' free pages to the OS; False where the C library has no ``malloc_trim``.
    ctypes lets go of the GIL for the call, so other threads run on meanwhile."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


class HeapTrimmer:
    """Calls ``trim_heap`` at most once per ``interval_s`` (never when None), from whatever loop
    asks it to."""

    def __init__(self, interval_s: float | None, clock: Callable[[], float] = time.monotonic):
        if interval_s is not None and interval_s < 0:
            raise ValueError(f"heap trim interval must be >= 0 s, got {interval_s}")
        self.interval_s = interval_s
        self.trims = 0
        self._clock = clock
        self._last_s = clock()

    def maybe_trim(self) -> bool:
        """Trim when ``interval_s`` has passed since the last time; whether it did."""
        if self.interval_s is None or _MALLOC_TRIM is None:
            return False
        now = self._clock()
        if now - self._last_s < self.interval_s:
            return False
        self._last_s = now
        trim_heap()
        self.trims += 1
        return True
