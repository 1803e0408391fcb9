"""The policy on the learner: process group, FSDP2 wrapping, and full weights for broadcast."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    """The learner's own group (FSDP); gloo on CPU. With CUDA, NCCL for CUDA tensors (FSDP's
    collectives, the loss denominators) and gloo for the small CPU ones (commands, batch shapes,
    logged scalars), so the same code runs on both."""
    if dist.is_initialized():
        return
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master_addr, str(master_port)
    backend = "gloo"
    if torch.cuda.is_available():
        # Ray gives each rank its own GPU (device 0 of its view); several visible: one per rank.
        torch.cuda.set_device(rank % torch.cuda.device_count())
        backend = "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def use_deterministic_algorithms(deterministic: bool) -> None:
    """``run.deterministic``: torch's deterministic kernels. On CUDA, cuBLAS is deterministic only
    with a fixed workspace, set before it first runs (torch raises at the first matmul otherwise),
    so ``CUBLAS_WORKSPACE_CONFIG`` is set here unless the user chose a value."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic)


def learner_device() -> torch.device:
    """Where the sharded model lives (FSDP2 moves it to the mesh's device) and batches go."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def computes_in_bfloat16(dtype: str, mixed_precision: bool) -> bool:
    """The learner's precision rule: master weights (and so the optimizer state) are always
    float32, since at a learning rate near 1e-5 most AdamW updates are below half a bfloat16 ulp
    of the weight and would round away. ``model.dtype: bfloat16`` (what the actors serve and
    receive) therefore means bfloat16 *compute* on the learner, as ``learner.mixed_precision``."""
    return mixed_precision or dtype == "bfloat16"


def load_sharded_model(path: str, dtype: str, mixed_precision: bool = False,
                       activation_checkpointing: bool = False, frozen: bool = False) -> torch.nn.Module:
    """Load the HF model with float32 master weights and shard it with FSDP2: each decoder
    layer, then the root.

    Compute in bfloat16 (gradients reduced in float32) with ``mixed_precision`` or a bfloat16
    ``dtype`` (``computes_in_bfloat16``). ``activation_checkpointing``: recompute each decoder
    layer in backward. ``frozen`` (the KL reference): never updated, so it is stored in its compute
    dtype, half the memory under bfloat16 compute and the same values the policy computes with.
    """
    bf16 = computes_in_bfloat16(dtype, mixed_precision)
    stored = torch.bfloat16 if frozen and bf16 else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=stored)
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    shard_layers_then_root(model, model.model.layers, bf16)
    return model


def enable_activation_checkpointing(model) -> None:
    """HF's per-decoder-layer checkpointing (before sharding; module names stay unchanged, so
    weight broadcast and checkpoints see the same keys). Non-reentrant: composes with FSDP2,
    whose pre-backward hook unshards a layer for its recompute. Active in train mode only."""
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


def shard_layers_then_root(root: torch.nn.Module, layers, mixed_precision: bool) -> None:
    """``fully_shard`` each decoder layer, then ``root``, with one precision policy for all."""
    kwargs = {}
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(root, **kwargs)


def full_parameters(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Unsharded parameters by name, all at once (a collective: every learner rank must call it).

    ``named_parameters`` skips tied duplicates, so a tied embedding is sent once; the actor's
    model ties it back on load. Holds the whole model: the learner streams ``UnshardedParameters``.
    """
    return dict(UnshardedParameters(model, dtype))


class UnshardedParameters:
    """A sharded model's parameters, each gathered whole only when iterated to, one at a time.

    Iterating is a collective: every learner rank iterates to the end, in ``named_parameters``
    order (``drain`` on a rank that keeps nothing). ``dtype``: each shard is cast before the
    gather (elementwise, so the same bytes as casting the full tensor), so neither the gather
    nor what is kept is ever in the master dtype when the actors serve another.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = None):
        self.model, self.dtype = model, dtype

    def specs(self) -> list[tuple[str, torch.Tensor]]:
        """Name and a meta tensor of each full parameter's shape and dtype, in iteration order."""
        return [(name, torch.empty(param.shape, dtype=self.dtype or param.dtype, device="meta"))
                for name, param in self.model.named_parameters()]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in self.model.named_parameters():
            shard = param.data if self.dtype is None else param.data.to(self.dtype)
            yield name, shard.full_tensor() if hasattr(shard, "full_tensor") else shard

    def drain(self) -> None:
        """Take part in the gathers, keeping nothing: each full tensor is dropped before the next."""
        deque(self, maxlen=0)
