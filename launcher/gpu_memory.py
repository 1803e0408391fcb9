"""What one vLLM actor's GPU holds, estimated from the model's config.json (``--dry-run`` prints it).

weights (parameters x the serving dtype's bytes) + the weight receive path (``common/weight_sync.py``
keeps two buckets of ``learner.bucket_mb`` in flight; vLLM's layerwise reload holds about one layer
until its last tensor arrives) + the KV cache that ``actors.max_concurrent_episodes`` episodes of
``rollout.max_episode_tokens`` fill (2 x layers x KV heads x head dim x dtype bytes a token). vLLM
gives its KV cache whatever ``actors.vllm_gpu_memory_utilization`` of the GPU leaves after the
weights, so the last figure is what that share must leave.
"""

from __future__ import annotations

from common.config import Config
from common.model_geometry import kv_bytes_per_token, parameter_counts

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def actor_gpu_memory(model: dict | None, cfg: Config, dtype: str = "bfloat16") -> str:
    """One line: each actor GPU's weights, receive buffers and KV cache for full concurrency."""
    if model is None:
        return (f"actor GPU memory: {cfg.model.name!r} is not on this machine yet, so its size is unknown "
                f"(it is resolved when the run starts)")
    dtype_bytes = _DTYPE_BYTES[dtype]
    params, layer = parameter_counts(model)
    weights = params * dtype_bytes
    receive = 2 * cfg.learner.bucket_mb * 2**20 + layer * dtype_bytes
    per_token = kv_bytes_per_token(model, dtype_bytes)
    tokens = cfg.actors.max_concurrent_episodes * cfg.rollout.max_episode_tokens
    kv = per_token * tokens
    return (f"actor GPU memory (each): weights {_gib(weights)} ({_count(params)} params in {dtype}) + weight "
            f"receive {_gib(receive)} (2 x {cfg.learner.bucket_mb:g} MiB buckets + one layer) + KV cache {_gib(kv)} "
            f"for {cfg.actors.max_concurrent_episodes} episodes x {cfg.rollout.max_episode_tokens} tokens "
            f"({per_token / 1024:.0f} KiB a token) = {_gib(weights + receive + kv)}; vLLM may use "
            f"{cfg.actors.vllm_gpu_memory_utilization:g} of the GPU")


def _count(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.1f}M"  # the tiny model reads as 1.0M


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB"
