"""Data parallelism across learner ranks: rank 0 (the head) drives, the others follow.

Each iteration rank 0 broadcasts a command (train, checkpoint, stop) over the learner's own
process group. For ``train`` it then broadcasts the batch as plain tensors (no pickle), every
rank computes advantages over the whole batch (GRPO needs whole groups) and runs forward and
backward on its own rows (``learner/train_step.py``, whose loss normalisation makes the update
equal to the one-rank update).
"""

from __future__ import annotations

from enum import IntEnum

import torch
import torch.distributed as dist

from learner.batching import Batch
from learner.turns import BatchTurns

_TENSOR_FIELDS = ("token_ids", "attention_mask", "loss_mask", "behavior_logprobs", "token_versions")
_ROW_FIELDS = ("rewards", "group_index")
_DTYPES = {"token_ids": torch.long, "attention_mask": torch.long, "loss_mask": torch.float32,
           "behavior_logprobs": torch.float32, "token_versions": torch.long,
           "rewards": torch.float32, "group_index": torch.long}


class Command(IntEnum):
    TRAIN = 0
    CHECKPOINT = 1
    STOP = 2
    GATHER = 3  # resend the current weights to the actors: every rank joins the gather


def world() -> tuple[int, int]:
    """(rank, world size) of the learner group; (0, 1) without one."""
    if not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def broadcast_command(command: Command | None = None, step: int = 0) -> tuple[Command, int]:
    """Rank 0 passes the command; every rank returns (command, step)."""
    header = torch.tensor([int(command or 0), step], dtype=torch.long)
    if world()[1] > 1:
        dist.broadcast(header, src=0)
    return Command(int(header[0])), int(header[1])


def broadcast_batch(batch: Batch | None) -> Batch:
    """Rank 0 passes its batch; the others pass None and receive the same tensors."""
    rank, size = world()
    if size == 1:
        assert batch is not None
        return batch
    shape = torch.tensor(list(batch.token_ids.shape) if rank == 0 else [0, 0], dtype=torch.long)
    dist.broadcast(shape, src=0)
    rows, width = int(shape[0]), int(shape[1])
    tensors = {}
    for name in _TENSOR_FIELDS + _ROW_FIELDS:
        dims = (rows, width) if name in _TENSOR_FIELDS else (rows,)
        tensor = getattr(batch, name).contiguous() if rank == 0 else torch.empty(dims, dtype=_DTYPES[name])
        dist.broadcast(tensor, src=0)
        tensors[name] = tensor
    turns = _broadcast_turns(batch.turns if rank == 0 else None)
    return Batch(**tensors, episodes=batch.episodes if rank == 0 else [], turns=turns)


def _broadcast_turns(turns: BatchTurns | None) -> BatchTurns | None:
    """Rank 0's per-turn tensors (or its None) to every rank: step-level credit needs them."""
    count = torch.tensor([-1 if turns is None else len(turns.row)], dtype=torch.long)
    dist.broadcast(count, src=0)
    n = int(count[0])
    if n < 0:
        return None
    if turns is None:
        turns = BatchTurns(row=torch.empty(n, dtype=torch.long), spans=torch.empty(n, 2, dtype=torch.long),
                           rewards=torch.empty(n, dtype=torch.float32), anchor=torch.empty(n, dtype=torch.long))
    for tensor in (turns.row, turns.spans, turns.rewards, turns.anchor):  # all built contiguous
        dist.broadcast(tensor, src=0)
    return turns


def mean_over_ranks(values: dict[str, float]) -> dict[str, float]:
    """Average logged scalars over the learner ranks (each rank saw only its rows)."""
    if world()[1] == 1 or not values:
        return values
    keys = sorted(values)
    tensor = torch.tensor([values[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(tensor)
    return {k: float(v) / world()[1] for k, v in zip(keys, tensor)}
