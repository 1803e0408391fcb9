"""The policy on the learner: process group, FSDP2 wrapping, and full weights for broadcast."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int) -> None:
    """The learner's own group (FSDP); gloo on CPU, NCCL when CUDA is there."""
    if dist.is_initialized():
        return
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master_addr, str(master_port)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def load_sharded_model(path: str, dtype: str) -> torch.nn.Module:
    """Load the HF model and shard it with FSDP2: each decoder layer, then the root."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


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
