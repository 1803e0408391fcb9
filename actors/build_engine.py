"""Build the inference engine an actor runs: the CPU engine here, vLLM on GPU machines."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import GenerationConfig

from actors.cpu_engine import CpuEngine
from actors.engine_api import InferenceEngine
from common.config import Config
from common.model_geometry import kv_bytes_per_token as config_kv_bytes_per_token
from common.models import load_model


def build_engine(cfg: Config, model_path: str, actor_id: int, version: int) -> InferenceEngine:
    """``actors.engine``: ``cpu`` (transformers, batched) or ``vllm`` (needs the vllm extra).
    ``version`` is the policy version of the weights at ``model_path`` (non-zero on a resume)."""
    seed = cfg.run.seed + actor_id
    if cfg.actors.engine == "cpu":
        model = load_model(model_path, cfg.actors.engine_dtype or cfg.model.dtype)
        cached_tokens = int(cfg.actors.max_cached_prefix_mb * 2**20 // kv_bytes_per_token(model))
        return CpuEngine(model, cfg.actors.max_batch_size, seed=seed,
                         max_queued_requests=cfg.actors.max_queued_requests,
                         max_cached_prefix_tokens=cached_tokens, initial_version=version)
    from actors.vllm_engine import VllmEngine, VllmEngineConfig  # imports vllm: only when chosen

    kv_cache_bytes = int(cfg.actors.vllm_kv_cache_mb * 2**20) or None
    longest = cfg.rollout.max_episode_tokens + cfg.rollout.max_new_tokens  # an episode's last prompt + turn
    positions = json.loads((Path(model_path) / "config.json").read_text()).get("max_position_embeddings") or longest
    dtype = vllm_serving_dtype(cfg, on_gpu=torch.cuda.is_available())
    config = VllmEngineConfig(model_path=model_path, dtype=dtype, seed=seed,
                              max_model_len=min(longest, positions),
                              max_num_seqs=cfg.actors.max_batch_size,
                              gpu_memory_utilization=cfg.actors.vllm_gpu_memory_utilization,
                              kv_cache_memory_bytes=kv_cache_bytes, enforce_eager=cfg.actors.vllm_enforce_eager,
                              update_timeout_s=cfg.learner.broadcast_timeout_s)
    return VllmEngine(config, initial_version=version)


def vllm_serving_dtype(cfg: Config, on_gpu: bool) -> str:
    """``actors.engine_dtype``; unset, bf16 on a GPU (what vLLM serves fast; the learner's updates are
    cast as they load, and the importance weights correct for the rounding), else ``model.dtype``."""
    return cfg.actors.engine_dtype or ("bfloat16" if on_gpu else cfg.model.dtype)


def kv_bytes_per_token(model) -> int:
    """Bytes of KV cache one token of this loaded model holds, in its parameters' dtype."""
    return config_kv_bytes_per_token(model.config.to_dict(), next(model.parameters()).element_size())


def stop_token_ids(tokenizer, model_path: str) -> tuple[int, ...]:
    """Every id that ends a turn: the tokenizer's eos and the model's generation-config eos ids
    (instruct models often have several; both engines stop exactly on what they are given)."""
    ids = {tokenizer.eos_token_id}
    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    ids.update(eos if isinstance(eos, list) else [eos])
    return tuple(sorted(i for i in ids if i is not None))
