"""The policy on the learner: process group, FSDP2 wrapping, and full weights for broadcast."""

from __future__ import annotations

import os

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


def learner_device() -> torch.device:
    """Where the sharded model lives (FSDP2 moves it to the mesh's device) and batches go."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def load_sharded_model(path: str, dtype: str, mixed_precision: bool = False,
                       activation_checkpointing: bool = False) -> torch.nn.Module:
    """Load the HF model and shard it with FSDP2: each decoder layer, then the root.

    ``mixed_precision``: compute in bfloat16, reduce gradients in float32, keep the master
    weights in ``dtype``. ``activation_checkpointing``: recompute each decoder layer in backward.
    """
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    if activation_checkpointing:
        enable_activation_checkpointing(model)
    shard_layers_then_root(model, model.model.layers, mixed_precision)
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


def full_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded parameters by name (a collective: every learner rank must call it).

    ``named_parameters`` skips tied duplicates, so a tied embedding is sent once; the actor's
    model ties it back on load.
    """
    out = {}
    for name, param in model.named_parameters():
        data = param.data
        out[name] = data.full_tensor() if hasattr(data, "full_tensor") else data
    return out
