"""Bucketed weight broadcast from learner rank 0 to every actor engine.

A group is the learner head (rank 0) plus the actors of one *generation*, formed over a
TCPStore that the head hosts. It is a separate process group from the learner's FSDP group, built directly as a
``ProcessGroupGloo`` (``ProcessGroupNCCL`` on GPU) so each side keeps its own default group.
Parameters are packed into fixed-size byte buckets, so the number of collectives does not grow
with the number of tensors and dtypes survive the trip (a bf16 tensor is sent as its bytes).
Tied weights are sent once: ``named_parameters()`` already drops the duplicates.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable

import torch
import torch.distributed as dist

from common.protocol import TensorSlot, WeightsAnnounce

_ALIGN_BYTES = 64  # keeps every slot's byte offset valid for a dtype view


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plan_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_nbytes: int, version: int) -> WeightsAnnounce:
    """Assign each tensor a bucket and byte offset; a tensor larger than a bucket gets its own."""
    sizes: list[int] = []
    slots: list[TensorSlot] = []
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if not sizes or sizes[-1] + nbytes > bucket_nbytes:
            sizes.append(0)
        offset = sizes[-1]
        slots.append(TensorSlot(name, list(tensor.shape), dtype_name(tensor.dtype), len(sizes) - 1, offset, nbytes))
        sizes[-1] = _aligned(offset + nbytes)
    return WeightsAnnounce(version=version, bucket_nbytes=sizes, slots=slots)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN_BYTES) * _ALIGN_BYTES


def pack_bucket(announce: WeightsAnnounce, bucket: int, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    buf = torch.empty(announce.bucket_nbytes[bucket], dtype=torch.uint8)  # alignment padding is never read
    for slot in announce.slots:
        if slot.bucket == bucket:
            src = tensors[slot.name].detach().contiguous().reshape(-1).view(torch.uint8)
            buf[slot.offset_bytes : slot.offset_bytes + slot.nbytes] = src
    return buf


def unpack_bucket(announce: WeightsAnnounce, bucket: int, buf: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {}
    for slot in announce.slots:
        if slot.bucket == bucket:
            raw = buf[slot.offset_bytes : slot.offset_bytes + slot.nbytes]
            out[slot.name] = raw.view(getattr(torch, slot.dtype)).reshape(slot.shape)  # views: buf is fresh
    return out


def _gloo_group(store: dist.Store, generation: int, rank: int, world_size: int, timeout_s: float) -> dist.ProcessGroup:
    prefixed = dist.PrefixStore(f"weights/{generation}", store)
    return dist.ProcessGroupGloo(prefixed, rank, world_size, datetime.timedelta(seconds=timeout_s))


def _broadcast(group: dist.ProcessGroup, buf: torch.Tensor) -> None:
    _start_broadcast(group, buf).wait()


def _start_broadcast(group: dist.ProcessGroup, buf: torch.Tensor) -> dist.Work:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return group.broadcast([buf], opts)


class BroadcastFailed(RuntimeError):
    """A weight group could not be formed or a broadcast missed its deadline; the group is
    dropped and its members must join again (the learner carries on meanwhile)."""


class WeightBroadcaster:
    """Learner side: hosts the rendezvous store and sends buckets as rank 0.

    Membership is per *generation*: ``regroup(members)`` forms a fresh group of rank 0 plus
    those actors, each collective has a deadline, and any failure drops the whole group (gloo
    cannot continue past an error): survivors and restarted actors simply join the next one.
    """

    def __init__(self, host: str, bucket_nbytes: int, timeout_s: float):
        self.bucket_nbytes = bucket_nbytes
        self.timeout_s = timeout_s
        self._store = dist.TCPStore(host, 0, None, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        self.address = f"{host}:{self._store.port}"
        self.generation = 0
        self.members: list[int] = []
        self._group: dist.ProcessGroup | None = None

    def regroup(self, members: list[int]) -> None:
        """Form generation+1 from ``members`` (call after announcing it); BroadcastFailed on timeout."""
        self.generation += 1
        self.members, self._group = sorted(members), None
        try:
            self._group = _gloo_group(self._store, self.generation, 0, len(self.members) + 1, self.timeout_s)
        except Exception as exc:  # gloo raises RuntimeError / DistStoreError variants
            self.members = []
            raise BroadcastFailed(f"generation {self.generation} did not form: {exc}") from None

    @property
    def connected(self) -> bool:
        return self._group is not None

    def plan(self, tensors: dict[str, torch.Tensor], version: int) -> WeightsAnnounce:
        announce = plan_buckets(tensors.items(), self.bucket_nbytes, version)
        return dataclasses.replace(announce, generation=self.generation)

    def send(self, announce: WeightsAnnounce, tensors: dict[str, torch.Tensor]) -> None:
        """Broadcast every bucket (after the announce went out); BroadcastFailed drops the group."""
        assert self._group is not None, "regroup() first"
        try:
            in_flight = None  # (work, its buffer): the buffer must outlive the collective
            for bucket in range(len(announce.bucket_nbytes)):
                buf = pack_bucket(announce, bucket, tensors)  # packs while the previous bucket flies
                if in_flight is not None:
                    in_flight[0].wait()
                in_flight = (_start_broadcast(self._group, buf), buf)
            if in_flight is not None:
                in_flight[0].wait()
        except Exception as exc:
            self._group, self.members = None, []
            raise BroadcastFailed(f"broadcast of version {announce.version} failed: {exc}") from None


class WeightReceiver:
    """Actor side: joins a generation's group as ``rank`` and receives what an announce describes."""

    def __init__(self, address: str, timeout_s: float):
        host, port = address.rsplit(":", 1)
        self.timeout_s = timeout_s
        self._store = dist.TCPStore(host, int(port), None, is_master=False,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        self.generation: int | None = None
        self._group: dist.ProcessGroup | None = None

    def join(self, generation: int, rank: int, world_size: int) -> None:
        """Join ``generation`` (blocking, bounded by the deadline); BroadcastFailed if it fails."""
        self.leave()
        try:
            self._group = _gloo_group(self._store, generation, rank, world_size, self.timeout_s)
        except Exception as exc:
            raise BroadcastFailed(f"could not join generation {generation}: {exc}") from None
        self.generation = generation

    def leave(self) -> None:
        self._group, self.generation = None, None

    def receive(self, announce: WeightsAnnounce) -> dict[str, torch.Tensor]:
        """All buckets of ``announce``; BroadcastFailed (and out of the group) on any failure."""
        assert self._group is not None and announce.generation == self.generation
        tensors: dict[str, torch.Tensor] = {}
        try:
            for bucket, nbytes in enumerate(announce.bucket_nbytes):
                buf = torch.empty(nbytes, dtype=torch.uint8)
                _broadcast(self._group, buf)
                tensors.update(unpack_bucket(announce, bucket, buf))
        except Exception as exc:
            self.leave()
            raise BroadcastFailed(f"receiving version {announce.version} failed: {exc}") from None
        return tensors
