"""Bucketed weight broadcast from learner rank 0 to every actor engine.

A group is the learner head (rank 0) plus the actors of one *generation*, formed over a
TCPStore that the head hosts. It is a separate process group from the learner's FSDP group,
built directly as a ``ProcessGroupGloo`` on CPU or a ``ProcessGroupNCCL`` on GPU (same code, the
backend follows the buffers' device), so each side keeps its own default group.
Parameters are packed into fixed-size byte buckets, so the number of collectives does not grow
with the number of tensors and dtypes survive the trip (a bf16 tensor is sent as its bytes).
Tied weights are sent once: ``named_parameters()`` already drops the duplicates.

What makes it cost about as much as one raw broadcast of the same bytes:
- a tensor as large as a bucket travels alone, straight from its own memory (no packing);
- packing overlaps the transfers of earlier buckets (two in flight, three pack buffers in turn),
  and a receiver posts every bucket's receive at once;
- buffers are kept between broadcasts on both sides: on CPU, fresh pages cost about as much
  as the transfer itself (a receiver reuses its buffers once the engine copied them out).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping

import torch
import torch.distributed as dist

from common.protocol import TensorSlot, WeightsAnnounce

_ALIGN_BYTES = 64  # keeps every slot's byte offset valid for a dtype view
_MAX_IN_FLIGHT = 2
"""Buckets the sender has in flight at once: the next one starts without a gap after the last."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def plan_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_nbytes: int, version: int,
                 large_first: bool = True) -> WeightsAnnounce:
    """Assign each tensor a bucket and byte offset; a tensor larger than a bucket gets its own.

    Slots start at aligned offsets; a bucket ends right after its last slot, so a bucket of
    one tensor is exactly that tensor's bytes (and can be sent from the tensor itself). Only a
    tensor's shape and dtype are read (a meta tensor will do). ``large_first=False`` keeps the
    given order, so that tensors produced one at a time (``send_stream``) fill buckets in turn.
    """
    sizes: list[int] = []
    slots: list[TensorSlot] = []
    if large_first:
        # Tensors that fill a bucket alone go first: they leave at once, from their own memory, while the
        # shared buckets after them are packed (the first bucket's packing would otherwise be idle time).
        named = sorted(named, key=lambda item: item[1].numel() * item[1].element_size() < bucket_nbytes)
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        offset = _aligned(sizes[-1]) if sizes else 0
        if not sizes or offset + nbytes > bucket_nbytes:
            sizes.append(0)
            offset = 0
        slots.append(TensorSlot(name, list(tensor.shape), dtype_name(tensor.dtype), len(sizes) - 1, offset, nbytes))
        sizes[-1] = offset + nbytes
    return WeightsAnnounce(version=version, bucket_nbytes=sizes, slots=slots)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN_BYTES) * _ALIGN_BYTES


def pack_bucket(announce: WeightsAnnounce, bucket: int, tensors: dict[str, torch.Tensor],
                out: torch.Tensor | None = None) -> torch.Tensor:
    """The bucket's bytes, written into ``out`` (at least as large) when given."""
    nbytes = announce.bucket_nbytes[bucket]
    buf = torch.empty(nbytes, dtype=torch.uint8) if out is None else out[:nbytes]  # padding is never read
    for slot in announce.slots:
        if slot.bucket == bucket:
            src = tensors[slot.name].detach().reshape(-1).view(torch.uint8)
            buf[slot.offset_bytes : slot.offset_bytes + slot.nbytes].copy_(src, non_blocking=True)
    return buf


def unpack_bucket(announce: WeightsAnnounce, bucket: int, buf: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views of the bucket's tensors into ``buf`` (no copy)."""
    out = {}
    for slot in announce.slots:
        if slot.bucket == bucket:
            raw = buf[slot.offset_bytes : slot.offset_bytes + slot.nbytes]
            out[slot.name] = raw.view(getattr(torch, slot.dtype)).reshape(slot.shape)
    return out


def _sole_tensor(announce: WeightsAnnounce, bucket: int, tensors: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The bucket's bytes as a view of its only tensor, when it holds one contiguous tensor."""
    slots = [slot for slot in announce.slots if slot.bucket == bucket]
    if len(slots) != 1:
        return None
    tensor = tensors[slots[0].name].detach()
    return tensor.reshape(-1).view(torch.uint8) if tensor.is_contiguous() else None


_NCCL_NO_TEARDOWN = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "TORCH_NCCL_ENABLE_MONITORING": "0",
                     "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
"""Read by each ProcessGroupNCCL as it is built. By default NCCL's watchdog tears the whole process
down when a collective times out (a dead actor mid-broadcast would kill the learner), and its
heartbeat monitor kills a process whose watchdog seems stuck. A weight group's failures are ours
to handle, as on gloo: the wait raises, the group is aborted and re-formed."""


def _weight_group(store: dist.Store, generation: int, rank: int, world_size: int, timeout_s: float,
                  device: torch.device) -> dist.ProcessGroup:
    """Form the group now (eager: a member that never comes fails here, within the deadline)."""
    prefixed = dist.PrefixStore(f"weights/{generation}", store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if device.type != "cuda":
        return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)  # connects every pair now
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    with _environment(_NCCL_NO_TEARDOWN):
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    # NCCL builds its communicator lazily, at the first collective, where a missing member would
    # hang the sender's first bucket instead of failing the regroup; connect it now.
    group.eager_connect_single_device(torch.device("cuda", torch.cuda.current_device()))
    return group


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the block only (other groups of the process keep their own)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _start_broadcast(group: dist.ProcessGroup, buf: torch.Tensor) -> dist.Work:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    return group.broadcast([buf], opts)


def _finish(work: dist.Work, buf: torch.Tensor, timeout_s: float) -> None:
    """Wait for a collective, bounded by the deadline (NCCL's wait only orders CUDA streams)."""
    work.wait(datetime.timedelta(seconds=timeout_s))
    if buf.is_cuda:
        torch.cuda.current_stream(buf.device).synchronize()


def _drop(group: dist.ProcessGroup | None) -> None:
    """Abort a failed NCCL communicator, so a peer stuck in it cannot hold the GPU; gloo needs nothing."""
    abort = getattr(group, "abort", None)
    if group is not None and abort is not None and isinstance(group, getattr(dist, "ProcessGroupNCCL", ())):
        abort()


class BroadcastFailed(RuntimeError):
    """A weight group could not be formed or a broadcast missed its deadline; the group is
    dropped and its members must join again (the learner carries on meanwhile)."""


class PlanMismatch(ValueError):
    """The tensors handed to ``send_stream`` are not the ones its announce planned (a bug of the caller)."""


class WeightBroadcaster:
    """Learner side: hosts the rendezvous store and sends buckets as rank 0.

    Membership is per *generation*: ``regroup(members)`` forms a fresh group of rank 0 plus
    those actors, each collective has a deadline, and any failure drops the whole group (a
    collective cannot continue past an error): survivors and restarted actors join the next one.
    """

    def __init__(self, host: str, bucket_nbytes: int, timeout_s: float, device: str = "cpu"):
        self.bucket_nbytes = bucket_nbytes
        self.timeout_s = timeout_s
        self.device = torch.device(device)
        self._store = dist.TCPStore(host, 0, None, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        self.address = f"{host}:{self._store.port}"
        self.generation = 0
        self.members: list[int] = []
        self._group: dist.ProcessGroup | None = None
        self._pack_buffers: list[torch.Tensor] = []

    def regroup(self, members: list[int]) -> None:
        """Form generation+1 from ``members`` (call after announcing it); BroadcastFailed on timeout."""
        self.generation += 1
        _drop(self._group)
        self.members, self._group = sorted(members), None
        try:
            self._group = _weight_group(self._store, self.generation, 0, len(self.members) + 1, self.timeout_s,
                                        self.device)
        except Exception as exc:  # gloo/NCCL raise RuntimeError / DistStoreError variants
            self.members = []
            raise BroadcastFailed(f"generation {self.generation} did not form: {exc}") from None

    def retire(self) -> int:
        """End the current generation without forming the next; returns generation+1, which the
        learner announces with no members, so that every actor still in an older one leaves it."""
        self.generation += 1
        _drop(self._group)
        self._group, self.members = None, []
        return self.generation

    @property
    def connected(self) -> bool:
        return self._group is not None

    def plan(self, tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int,
             large_first: bool = True) -> WeightsAnnounce:
        named = tensors.items() if isinstance(tensors, Mapping) else tensors
        announce = plan_buckets(named, self.bucket_nbytes, version, large_first)
        return dataclasses.replace(announce, generation=self.generation)

    def send(self, announce: WeightsAnnounce, tensors: Mapping[str, torch.Tensor]) -> None:
        """Broadcast every bucket (after the announce went out); BroadcastFailed drops the group."""
        self.send_stream(announce, ((slot.name, tensors[slot.name]) for slot in announce.slots))

    def send_stream(self, announce: WeightsAnnounce, named: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Broadcast each bucket as soon as ``named``, yielding the tensors in slot order, completes it:
        besides the buckets in flight only the one being filled is held. BroadcastFailed drops the
        group; the caller drains ``named`` if producing it is a collective."""
        assert self._group is not None, "regroup() first"
        slots_left = Counter(slot.bucket for slot in announce.slots)
        try:
            in_flight: list[tuple[dist.Work, torch.Tensor]] = []  # a buffer must outlive its collective
            filling: dict[str, torch.Tensor] = {}
            for slot in announce.slots:
                name, filling[slot.name] = next(named)
                if name != slot.name:
                    raise PlanMismatch(f"tensor {name!r} arrived where the plan has {slot.name!r}")
                slots_left[slot.bucket] -= 1
                if slots_left[slot.bucket]:
                    continue
                buf = self._bucket_bytes(announce, slot.bucket, filling)  # packs while earlier buckets fly
                filling = {}
                if len(in_flight) == _MAX_IN_FLIGHT:
                    _finish(*in_flight.pop(0), self.timeout_s)
                in_flight.append((_start_broadcast(self._group, buf), buf))
            for work, buf in in_flight:
                _finish(work, buf, self.timeout_s)
        except Exception as exc:
            _drop(self._group)
            self._group, self.members = None, []
            if isinstance(exc, PlanMismatch):
                raise  # a caller's bug, not a peer's failure
            raise BroadcastFailed(f"broadcast of version {announce.version} failed: {exc}") from None

    def _bucket_bytes(self, announce: WeightsAnnounce, bucket: int, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        sole = _sole_tensor(announce, bucket, tensors)
        if sole is not None and sole.device == self.device:
            return sole
        # Pack buffers in turn: the transfer that used this one finished before it is packed again.
        nbytes, count = max(announce.bucket_nbytes), _MAX_IN_FLIGHT + 1
        if len(self._pack_buffers) < count or self._pack_buffers[0].numel() < nbytes:
            self._pack_buffers = [torch.empty(nbytes, dtype=torch.uint8, device=self.device) for _ in range(count)]
        return pack_bucket(announce, bucket, tensors, out=self._pack_buffers[bucket % count])


class WeightReceiver:
    """Actor side: joins a generation's group as ``rank`` and receives what an announce describes."""

    def __init__(self, address: str, timeout_s: float, device: str = "cpu"):
        host, port = address.rsplit(":", 1)
        self.address, self.timeout_s = address, timeout_s
        self.device = torch.device(device)
        self._store = dist.TCPStore(host, int(port), None, is_master=False,
                                    timeout=datetime.timedelta(seconds=timeout_s))
        self.generation: int | None = None
        self._group: dist.ProcessGroup | None = None
        self._buffers: list[torch.Tensor] = []
        self._ring: list[torch.Tensor] = []  # receive_stream's buffers

    def join(self, generation: int, rank: int, world_size: int) -> None:
        """Join ``generation`` (blocking, bounded by the deadline); BroadcastFailed if it fails."""
        self.leave()
        try:
            self._group = _weight_group(self._store, generation, rank, world_size, self.timeout_s, self.device)
        except Exception as exc:
            raise BroadcastFailed(f"could not join generation {generation}: {exc}") from None
        self.generation = generation

    def leave(self) -> None:
        _drop(self._group)
        self._group, self.generation = None, None

    def receive(self, announce: WeightsAnnounce, reuse_buffers: bool = False) -> dict[str, torch.Tensor]:
        """All buckets of ``announce`` as views into receive buffers; BroadcastFailed (and out of the
        group) on any failure. ``reuse_buffers``: the tensors of the previous call are no longer
        used (the engine has copied them), so their memory may be written again."""
        assert self._group is not None and announce.generation == self.generation
        buffers = self._receive_buffers(announce.bucket_nbytes, reuse_buffers)
        tensors: dict[str, torch.Tensor] = {}
        try:
            # Every bucket's receive is posted at once: the backend runs them back to back.
            in_flight = [(_start_broadcast(self._group, buf), buf) for buf in buffers]
            for bucket, (work, buf) in enumerate(in_flight):
                _finish(work, buf, self.timeout_s)
                tensors.update(unpack_bucket(announce, bucket, buf))
        except Exception as exc:
            self.leave()
            raise BroadcastFailed(f"receiving version {announce.version} failed: {exc}") from None
        return tensors

    def receive_stream(self, announce: WeightsAnnounce) -> Iterator[dict[str, torch.Tensor]]:
        """Each bucket of ``announce`` in turn, as views into one of a few buffers kept between calls:
        a bucket's views are valid until the next bucket is asked for, so the caller copies them out
        (loads them into its model) first. At most ``_MAX_IN_FLIGHT`` buckets are held, whatever the
        model's size. BroadcastFailed (and out of the group) on any failure; a caller that stops early
        leaves the group too, since the rest of the broadcast was never received."""
        assert self._group is not None and announce.generation == self.generation
        sizes = announce.bucket_nbytes
        ring = self._ring_buffers(max(sizes, default=0), min(_MAX_IN_FLIGHT, len(sizes)))
        posted: deque[tuple[int, dist.Work, torch.Tensor]] = deque()
        received = 0
        try:
            for bucket in range(min(len(ring), len(sizes))):
                posted.append(self._post(bucket, ring[bucket][: sizes[bucket]]))
            while posted:
                bucket, work, buf = posted.popleft()
                _finish(work, buf, self.timeout_s)
                yield unpack_bucket(announce, bucket, buf)
                received += 1
                following = bucket + len(ring)  # into the buffer just handed back
                if following < len(sizes):
                    posted.append(self._post(following, ring[bucket % len(ring)][: sizes[following]]))
        except GeneratorExit:
            if received < len(sizes):
                self.leave()
            raise
        except Exception as exc:
            self.leave()
            raise BroadcastFailed(f"receiving version {announce.version} failed: {exc}") from None

    def _post(self, bucket: int, buf: torch.Tensor) -> tuple[int, dist.Work, torch.Tensor]:
        return bucket, _start_broadcast(self._group, buf), buf

    def _ring_buffers(self, nbytes: int, count: int) -> list[torch.Tensor]:
        if len(self._ring) < count or (self._ring and self._ring[0].numel() < nbytes):
            self._ring = [torch.empty(nbytes, dtype=torch.uint8, device=self.device) for _ in range(count)]
        return self._ring

    def _receive_buffers(self, sizes: list[int], reuse: bool) -> list[torch.Tensor]:
        if not reuse or [b.numel() for b in self._buffers] != sizes:
            self._buffers = [torch.empty(n, dtype=torch.uint8, device=self.device) for n in sizes]
        return self._buffers
