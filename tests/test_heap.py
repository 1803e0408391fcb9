"""Freed heap memory goes back to the OS (common/heap.py), and the CPU engine hands it back as it serves."""

from __future__ import annotations

import asyncio

import pytest
import torch

from actors.cpu_engine import CpuEngine, SamplingParams
from common import heap
from common.heap import HeapTrimmer
from tests.bench.memory_growth_bench import resident_mb
from tests.test_engine import tiny_model

needs_malloc_trim = pytest.mark.skipif(heap._MALLOC_TRIM is None, reason="no glibc malloc_trim here")


@needs_malloc_trim
def test_trimming_hands_the_heap_s_freed_memory_back_to_the_os():
    # 3,000 tensors of 64 KB, under every mmap threshold glibc may have reached: heap blocks. The last
    # one stays, so free() cannot give back the heap's top itself: ~190 MB freed but resident.
    blocks = [torch.ones(16 * 1024) for _ in range(3000)]
    last = blocks.pop()
    del blocks
    before_mb = resident_mb()
    assert heap.trim_heap()
    after_mb = resident_mb()
    assert before_mb - after_mb >= 100, f"resident {before_mb:.0f} MB before the trim, {after_mb:.0f} MB after"
    assert last.sum() == 16 * 1024


def test_a_trimmer_trims_at_most_once_per_interval_and_never_without_one():
    now = [0.0]
    trimmer, never = HeapTrimmer(30.0, clock=lambda: now[0]), HeapTrimmer(None, clock=lambda: now[0])
    calls = []
    for now[0] in (1.0, 29.0, 31.0, 45.0, 61.5, 62.0):
        calls.append(trimmer.maybe_trim())
        assert not never.maybe_trim()
    if heap._MALLOC_TRIM is not None:
        assert calls == [False, False, True, False, True, False] and trimmer.trims == 2
    with pytest.raises(ValueError, match="interval"):
        HeapTrimmer(-1.0)


@needs_malloc_trim
def test_the_engine_trims_the_heap_between_steps():
    engine = CpuEngine(tiny_model(), max_batch_size=4, heap_trim_interval_s=0.0)

    async def generate():
        engine.start()
        try:
            return await asyncio.gather(*(engine.generate([1, 2, 3 + i], SamplingParams(5)) for i in range(3)))
        finally:
            engine.stop()

    generations = asyncio.run(generate())
    assert all(len(g.token_ids) == 5 for g in generations)
    assert engine.heap.trims > 0
