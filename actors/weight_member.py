"""Where an actor's engine meets the weight group: in the actor process, or inside the engine.

The control thread (``actors/weights.py``) only joins, leaves and receives through a
``WeightGroupMember``; each engine says which one it has (``InferenceEngine.weight_group_member``):
- ``HostReceivedWeights`` (the CPU engine): the actor process joins the group, receives every bucket
  into its own buffers and stages the whole version in the engine, which copies it in between two
  decode steps;
- the vLLM engine's member (``actors/vllm_engine.py``): vLLM's workers join and receive themselves,
  bucket by bucket into the model, so no copy of the model sits beside the engine.
"""

from __future__ import annotations

from typing import Protocol

import torch

from common.protocol import WeightsAnnounce
from common.weight_sync import WeightReceiver


class WeightGroupMember(Protocol):
    """One engine's place in the weight group. Every call blocks, bounded by the broadcast deadline."""

    @property
    def generation(self) -> int | None:
        """The generation joined, or None while out of every group."""

    def join(self, generation: int, rank: int, world_size: int) -> None:
        """Join ``generation`` as ``rank``; BroadcastFailed (and out of every group) if it fails."""

    def leave(self) -> None: ...

    def receive(self, announce: WeightsAnnounce) -> bool:
        """Take part in the broadcast ``announce`` describes. True: its version is now served or staged;
        False: a resend of a version not newer than that, received and ignored. BroadcastFailed (and
        out of the group) on any failure."""


class StagingEngine(Protocol):
    """What ``HostReceivedWeights`` needs of its engine (the CPU engine), named here so that this
    module, which that engine imports, does not import it back."""

    @property
    def version(self) -> int:
        """The policy version it serves."""

    def stage_weights(self, state: dict[str, torch.Tensor], version: int) -> bool:
        """Copy ``state`` in at the next safe point; False for a version not newer than its own."""


class HostReceivedWeights:
    """The actor process receives each version whole and stages it in the engine."""

    def __init__(self, engine: StagingEngine, address: str, timeout_s: float, device: str):
        self._engine = engine
        self._receiver = WeightReceiver(address, timeout_s, device)
        self._last_staged: int | None = None

    @property
    def generation(self) -> int | None:
        return self._receiver.generation

    def join(self, generation: int, rank: int, world_size: int) -> None:
        self._receiver.join(generation, rank, world_size)

    def leave(self) -> None:
        self._receiver.leave()

    def receive(self, announce: WeightsAnnounce) -> bool:
        # The engine holds the staged tensors (views of the receive buffers) until it has copied
        # them in, which it has done once it serves their version: only then may they be reused.
        reuse = self._last_staged is not None and self._engine.version >= self._last_staged
        tensors = self._receiver.receive(announce, reuse_buffers=reuse)
        # The engine decides what a resend is (a version not newer than the one staged or serving):
        # the collective had to be joined all the same.
        if not self._engine.stage_weights(tensors, announce.version):
            return False
        self._last_staged = announce.version
        return True
