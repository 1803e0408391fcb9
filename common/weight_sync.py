"""Bucketed weight broadcast from learner rank 0 to every actor engine.

The group is learner head (rank 0) plus actor k (rank k + 1), formed over a TCPStore that the
head hosts. It is a separate process group from the learner's FSDP group, built directly as a
``ProcessGroupGloo`` (``ProcessGroupNCCL`` on GPU) so each side keeps its own default group.
Parameters are packed into fixed-size byte buckets, so the number of collectives does not grow
with the number of tensors and dtypes survive the trip (a bf16 tensor is sent as its bytes).
Tied weights are sent once: ``named_parameters()`` already drops the duplicates.
"""

from __future__ import annotations

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
    buf = torch.zeros(announce.bucket_nbytes[bucket], dtype=torch.uint8)
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
            out[slot.name] = raw.view(getattr(torch, slot.dtype)).reshape(slot.shape).clone()
    return out


def _gloo_group(store: dist.Store, rank: int, world_size: int, timeout_s: float) -> dist.ProcessGroup:
    prefixed = dist.PrefixStore("weights", store)
    return dist.ProcessGroupGloo(prefixed, rank, world_size, datetime.timedelta(seconds=timeout_s))


def _broadcast(group: dist.ProcessGroup, buf: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([buf], opts).wait()


class WeightBroadcaster:
    """Learner side: hosts the rendezvous store and sends buckets as rank 0."""

    def __init__(self, host: str, num_actors: int, bucket_nbytes: int, timeout_s: float):
        self.world_size = num_actors + 1
        self.bucket_nbytes = bucket_nbytes
        self.timeout_s = timeout_s
        self._store = dist.TCPStore(host, 0, self.world_size, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        self.address = f"{host}:{self._store.port}"
        self._group: dist.ProcessGroup | None = None

    def connect(self) -> None:
        """Block until every actor has joined the group (each actor calls ``WeightReceiver.connect``)."""
        self._group = _gloo_group(self._store, 0, self.world_size, self.timeout_s)

    def plan(self, tensors: dict[str, torch.Tensor], version: int) -> WeightsAnnounce:
        return plan_buckets(tensors.items(), self.bucket_nbytes, version)

    def send(self, announce: WeightsAnnounce, tensors: dict[str, torch.Tensor]) -> None:
        """Broadcast every bucket; call after the announce went out on the control channel."""
        assert self._group is not None, "connect() first"
        for bucket in range(len(announce.bucket_nbytes)):
            _broadcast(self._group, pack_bucket(announce, bucket, tensors))


class WeightReceiver:
    """Actor side: joins the group as ``rank`` and receives what an announce describes."""

    def __init__(self, address: str, rank: int, world_size: int, timeout_s: float):
        host, port = address.rsplit(":", 1)
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self._store = dist.TCPStore(host, int(port), world_size, is_master=False,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        self._group: dist.ProcessGroup | None = None

    def connect(self) -> None:
        self._group = _gloo_group(self._store, self.rank, self.world_size, self.timeout_s)

    def receive(self, announce: WeightsAnnounce) -> dict[str, torch.Tensor]:
        assert self._group is not None, "connect() first"
        tensors: dict[str, torch.Tensor] = {}
        for bucket, nbytes in enumerate(announce.bucket_nbytes):
            buf = torch.empty(nbytes, dtype=torch.uint8)
            _broadcast(self._group, buf)
            tensors.update(unpack_bucket(announce, bucket, buf))
        return tensors
