"""Learner-group helpers: logged scalars combined over ranks, and the deterministic setting."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common.net import free_port
from learner.distributed import mean_over_ranks
from learner.model import init_process_group, use_deterministic_algorithms

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)


def _combine_on_rank(rank: int, world_size: int, port: int, out_file: str) -> None:
    init_process_group(rank, world_size, "127.0.0.1", port)
    # Rank 0 saw an importance weight of 5, rank 1 one of 1.5.
    values = {"learner/loss": [1.0, 3.0][rank], "learner/is_weight_max": [5.0, 1.5][rank],
              "learner/ratio_min": [0.5, 0.25][rank]}
    combined = mean_over_ranks(values)
    if rank == 0:
        with open(out_file, "w") as f:
            json.dump(combined, f)
    dist.destroy_process_group()


def test_max_stats_are_the_maximum_over_ranks_not_a_mean_of_maxima(tmp_path):
    out_file = str(tmp_path / "combined.json")
    mp.spawn(_combine_on_rank, args=(2, free_port(), out_file), nprocs=2, join=True)
    with open(out_file) as f:
        combined = json.load(f)
    assert combined == {"learner/loss": 2.0, "learner/is_weight_max": 5.0, "learner/ratio_min": 0.25}


def test_deterministic_sets_the_cublas_workspace_before_cuda_starts(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    try:
        use_deterministic_algorithms(True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.are_deterministic_algorithms_enabled()
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # a user's choice is kept
        use_deterministic_algorithms(True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        use_deterministic_algorithms(False)
    assert not torch.are_deterministic_algorithms_enabled()
