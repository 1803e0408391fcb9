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


def deal_by_tokens(lengths: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """Rows (indices into ``lengths``, each rank's ascending) for each rank, balanced by tokens.

    Greedy longest-first: each row, longest first (ties by index), goes to the rank with the
    fewest tokens so far (ties: fewer rows, then the lower rank), so every rank computes the same
    deal without talking, and a rank never waits on another that drew all the long episodes
    (round-robin can hand one rank every long row). With at least ``world_size`` rows no rank is empty.
    """
    sizes, order = torch.sort(lengths.cpu(), descending=True, stable=True)
    loads = [(0, 0, rank) for rank in range(world_size)]  # (tokens, rows, rank)
    dealt: list[list[int]] = [[] for _ in range(world_size)]
    for size, row in zip(sizes.tolist(), order.tolist()):
        tokens, count, rank = min(loads)
        dealt[rank].append(row)
        loads[rank] = (tokens + size, count + 1, rank)
    return [torch.tensor(sorted(rows), dtype=torch.long) for rows in dealt]


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
    """Combine logged scalars over the learner ranks (each rank saw only its rows): the mean,
    except ``*_max`` (the maximum over ranks) and ``*_min`` (the minimum); a mean of per-rank
    maxima would understate the batch's maximum."""
    size = world()[1]
    if size == 1 or not values:
        return values
    out = {}
    for suffix, op in (("_max", dist.ReduceOp.MAX), ("_min", dist.ReduceOp.MIN), ("", dist.ReduceOp.SUM)):
        keys = sorted(k for k in values if k not in out and k.endswith(suffix))
        if not keys:  # the same on every rank: all skip together
            continue
        tensor = torch.tensor([values[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(tensor, op=op)  # every rank logs the same keys, so all make the same calls
        out.update({k: float(v) / (size if op == dist.ReduceOp.SUM else 1) for k, v in zip(keys, tensor)})
    return out
