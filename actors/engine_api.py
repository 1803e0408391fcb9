"""The one interface every inference engine serves (CPU engine here, vLLM on GPU machines).

Actors and tests see only this: ``generate`` returns the sampled token ids exactly as sampled,
their behavior logprobs and the policy version that produced each token; ``weight_group_member``
takes part in the weight group, and each new policy version applies at the next safe point
between decode steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from actors.weight_member import WeightGroupMember


class EngineError(RuntimeError):
    """A request could not be served: the engine stopped or a forward pass failed."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion."""

    max_new_tokens: int
    """Most tokens to generate; reaching it ends the request with finish_reason "length"."""
    temperature: float = 1.0
    """Logits are divided by this before softmax; must be > 0 (no greedy mode)."""
    stop_token_ids: tuple[int, ...] = ()
    """Sampling one of these ends the request with "stop"; the stop token is kept in the output."""
    greedy: bool = False
    """Take the most likely token instead of sampling (held-out evaluation, ``rollout.eval_greedy``);
    the logprob recorded is still the tempered one. Never for training: the learner's importance
    weights assume tokens drawn from softmax(logits / temperature)."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be finite and > 0, got {self.temperature!r}")
        # A list would make the frozen dataclass unhashable; store a tuple whatever was given.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclass(frozen=True)
class Generation:
    """The sampled completion of one request, aligned token by token."""

    token_ids: list[int]
    """Sampled token ids, exactly as sampled (never re-tokenized)."""
    logprobs: list[float]
    """log p(token) under the tempered sampling distribution softmax(logits / temperature), fp32."""
    versions: list[int]
    """Policy version of the weights that produced each token's logits."""
    finish_reason: str
    """"stop" (a stop token was sampled) or "length" (max_new_tokens reached)."""


class InferenceEngine(Protocol):
    """What an actor needs from an engine."""

    @property
    def version(self) -> int:
        """Policy version of the weights now serving."""

    @property
    def queue_depth(self) -> int:
        """Requests waiting or running (for backpressure and ActorStats)."""

    @property
    def failure(self) -> str | None:
        """Why the engine stopped serving on its own (a crashed worker, a failed weight update):
        it will never serve again. None while it serves, and after an orderly ``stop()``."""

    def start(self) -> None:
        """Start serving."""

    def stop(self) -> None:
        """Stop; pending requests fail with EngineError."""

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation:
        """Sample one completion of ``prompt_token_ids``. The list is the caller's episode transcript:
        never change it, and copy whatever of it the engine keeps, since the caller extends it once
        this returns."""

    def weight_group_member(self, address: str, timeout_s: float, device: str) -> WeightGroupMember:
        """How this engine takes part in the weight group hosted at ``address`` (the learner's store):
        receiving in the actor process and staging whole versions, or inside the engine itself
        (``actors/weight_member.py``). New versions apply between two decode steps; a version not
        newer than the one staged or serving (a resend) is received and ignored."""
