"""Batched CPU inference engine over a transformers causal LM (the test/dev backend).

Episodes on the actor's asyncio loop call ``await engine.generate(prompt_ids, params)``.
A dedicated worker thread does all torch work so the loop stays responsive:

1. wait until requests are queued (or weights are staged, which are then applied at once);
2. take up to ``max_batch_size`` waiting requests as one wave;
3. prefill them together: left-padded, with an attention mask and position ids derived
   from it, so padding does not change any row's logits;
4. decode step by step over a ``DynamicCache``; each step samples from
   softmax(logits / temperature) and records the sampled token's log-prob and the policy
   version that produced it; a row that hits a stop token or ``max_new_tokens`` is
   resolved right away and pruned from the batch;
5. between steps (a safe point: no forward pass in flight) apply staged weights, so
   every later token carries the new version.

Requests arriving during a wave wait for the next one. Continuous batching would admit
them in step 5 instead: a ``DecodeBatch.admit`` that prefills the newcomers and merges
their cache rows; nothing outside ``DecodeBatch`` and ``CpuEngine._run_wave`` changes.

The engine never changes torch's thread count: the actor process sets it
(``actors.torch_threads``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import deque
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

logger = logging.getLogger(__name__)

_PAD_TOKEN_ID = 0
"""Any valid id: padded positions are masked out of attention."""


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


@dataclass(eq=False)
class _Request:
    """One generate() call in flight; its output lists grow as the worker decodes."""

    prompt_token_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    cancelled: bool = False
    """Set on the event loop when the awaiting task is cancelled; the worker drops the row."""

    def finish_reason(self) -> str | None:
        if self.token_ids and self.token_ids[-1] in self.params.stop_token_ids:
            return "stop"
        if len(self.token_ids) >= self.params.max_new_tokens:
            return "length"
        return None


class DecodeBatch:
    """Rows decoding together: their KV cache, attention mask and next position ids."""

    def __init__(self, model: torch.nn.Module, requests: list[_Request], generator: torch.Generator):
        self.requests = list(requests)
        self._model = model
        self._generator = generator
        self._cache = DynamicCache(config=model.config)
        self._temperatures = torch.tensor([[r.params.temperature] for r in requests], dtype=torch.float32)
        self._attention_mask = torch.empty(0)
        self._next_position_ids = torch.empty(0)
        self._last_token_ids = torch.empty(0)

    @torch.inference_mode()
    def prefill(self, version: int) -> None:
        input_ids, self._attention_mask = _left_pad([r.prompt_token_ids for r in self.requests])
        # Left padding shifts every row; positions count only real tokens.
        position_ids = (self._attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        logits = self._forward(input_ids, position_ids, logits_to_keep=1)
        self._next_position_ids = position_ids[:, -1] + 1
        self._sample(logits, version)

    @torch.inference_mode()
    def decode_step(self, version: int) -> None:
        ones = torch.ones(len(self.requests), 1, dtype=self._attention_mask.dtype)
        self._attention_mask = torch.cat([self._attention_mask, ones], dim=1)
        logits = self._forward(self._last_token_ids[:, None], self._next_position_ids[:, None])
        self._next_position_ids = self._next_position_ids + 1
        self._sample(logits, version)

    @torch.inference_mode()
    def pop_finished(self) -> list[tuple[_Request, str]]:
        """Remove finished and cancelled rows; return the finished ones with their reason."""
        finished, keep = [], []
        for row, request in enumerate(self.requests):
            reason = request.finish_reason()
            if reason is not None:
                finished.append((request, reason))
            elif not request.cancelled:
                keep.append(row)
        if len(keep) < len(self.requests):
            self._keep_rows(keep)
        return finished

    def _keep_rows(self, rows: list[int]) -> None:
        self.requests = [self.requests[row] for row in rows]
        if not rows:
            return
        index = torch.tensor(rows, dtype=torch.long)
        self._cache.batch_select_indices(index)
        self._attention_mask = self._attention_mask[index]
        self._next_position_ids = self._next_position_ids[index]
        self._last_token_ids = self._last_token_ids[index]
        self._temperatures = self._temperatures[index]

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, logits_to_keep: int = 0) -> torch.Tensor:
        output = self._model(
            input_ids=input_ids,
            attention_mask=self._attention_mask,
            position_ids=position_ids,
            cache=self._cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
        )
        return output.logits[:, -1, :].float()

    def _sample(self, logits: torch.Tensor, version: int) -> None:
        logprobs = torch.log_softmax(logits / self._temperatures, dim=-1)
        token_ids = torch.multinomial(logprobs.exp(), num_samples=1, generator=self._generator)
        token_logprobs = logprobs.gather(1, token_ids).squeeze(1)
        self._last_token_ids = token_ids.squeeze(1)
        for request, token_id, logprob in zip(self.requests, token_ids.squeeze(1).tolist(), token_logprobs.tolist()):
            request.token_ids.append(token_id)
            request.logprobs.append(logprob)
            request.versions.append(version)


def _left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-align prompts in one (rows, longest) id tensor; return it with its attention mask."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), _PAD_TOKEN_ID, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, width - len(prompt) :] = 1
    return input_ids, attention_mask


def _settle(request: _Request, result: Generation | None = None, error: BaseException | None = None) -> None:
    """Resolve a request's future on its own event loop (called from the worker thread)."""

    def settle_on_loop() -> None:
        if request.future.done():  # cancelled by its caller meanwhile
            return
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(result)

    try:
        request.loop.call_soon_threadsafe(settle_on_loop)
    except RuntimeError:  # the loop is closed: nobody is waiting for this answer any more
        pass


class CpuEngine:
    """Batches concurrent generate() calls over one causal LM on a worker thread."""

    def __init__(self, model: torch.nn.Module, max_batch_size: int = 32, seed: int = 0):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self._model = model.eval()
        self._max_batch_size = max_batch_size
        self._generator = torch.Generator().manual_seed(seed)
        self._params_by_name = dict(model.named_parameters(remove_duplicate=False))
        self._vocab_size = int(model.config.vocab_size)
        self._max_positions = getattr(model.config, "max_position_embeddings", None)
        self._condition = threading.Condition()
        self._waiting: deque[_Request] = deque()
        self._running_count = 0
        self._staged: tuple[dict[str, torch.Tensor], int] | None = None
        self._version = 0
        self._largest_batch_size = 0
        self._generated_token_count = 0
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def version(self) -> int:
        """Policy version of the weights now in the model."""
        return self._version

    @property
    def queue_depth(self) -> int:
        """Requests waiting plus running."""
        with self._condition:
            return len(self._waiting) + self._running_count

    @property
    def largest_batch_size(self) -> int:
        """Most requests prefilled together so far (shows that batching happens)."""
        return self._largest_batch_size

    @property
    def generated_token_count(self) -> int:
        """Tokens sampled since construction, for tokens/s statistics."""
        return self._generated_token_count

    def start(self) -> None:
        """Start the worker thread; requests queued before this wait for it."""
        with self._condition:
            if self._stopping:
                raise EngineError("a stopped engine cannot be restarted")
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._worker_main, name="cpu-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the worker at the next step boundary; every pending request fails with EngineError."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._fail_waiting(EngineError("engine stopped"))

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation:
        """Sample a completion of the prompt; raises EngineError if the engine stops first."""
        self._check_prompt(prompt_token_ids, params)
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_token_ids), params, loop, loop.create_future())
        with self._condition:
            if self._stopping:
                raise EngineError("engine stopped")
            self._waiting.append(request)
            self._condition.notify_all()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True
            raise

    def stage_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Stage new weights (thread-safe); they are copied in at the next step boundary.

        ``state`` must name every parameter (tied ones once under either name) with its
        exact shape. The engine keeps references to the tensors until it has copied them,
        so the caller must not modify them meanwhile. A newer staging replaces an older one
        not yet applied.
        """
        self._check_weights(state)
        with self._condition:
            newest = self._staged[1] if self._staged is not None else self._version
            if version <= newest:
                raise ValueError(f"staged version {version} is not newer than version {newest}")
            self._staged = (dict(state), version)
            self._condition.notify_all()

    def _check_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if len(prompt_token_ids) == 0:
            raise ValueError("prompt_token_ids is empty; the engine needs at least one token")
        bad = [t for t in prompt_token_ids if not (isinstance(t, int) and 0 <= t < self._vocab_size)]
        if bad:
            raise ValueError(f"prompt token ids must be ints in [0, {self._vocab_size}), got {bad[:5]}")
        total = len(prompt_token_ids) + params.max_new_tokens
        if self._max_positions is not None and total > self._max_positions:
            raise ValueError(f"prompt + max_new_tokens = {total} exceeds the model's {self._max_positions} positions")

    def _check_weights(self, state: dict[str, torch.Tensor]) -> None:
        unknown = sorted(set(state) - set(self._params_by_name))
        if unknown:
            raise ValueError(f"staged weights name unknown parameters: {unknown[:5]}")
        for name, tensor in state.items():
            expected = self._params_by_name[name].shape
            if not isinstance(tensor, torch.Tensor) or tensor.shape != expected:
                got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                raise ValueError(f"staged weight {name!r} is {got}, expected shape {tuple(expected)}")
        covered = {id(self._params_by_name[name]) for name in state}
        missing = sorted(n for n, p in self._params_by_name.items() if id(p) not in covered)
        if missing:
            raise ValueError(f"staged weights miss parameters: {missing[:5]}")

    def _apply_staged_weights(self) -> None:
        with self._condition:
            staged, self._staged = self._staged, None
        if staged is None:
            return
        state, version = staged
        with torch.no_grad():
            for name, tensor in state.items():
                self._params_by_name[name].copy_(tensor)
        self._version = version
        logger.info("applied weights of version %d", version)

    def _worker_main(self) -> None:
        try:
            while (requests := self._next_wave()) is not None:
                self._run_wave(requests)
        except Exception:
            logger.exception("cpu engine worker crashed")
            with self._condition:
                self._stopping = True
        self._fail_waiting(EngineError("engine stopped"))

    def _next_wave(self) -> list[_Request] | None:
        """Block until requests wait; return up to max_batch_size of them (None when stopping)."""
        while True:
            self._apply_staged_weights()  # also while idle, so `version` is current
            with self._condition:
                if self._stopping:
                    return None
                requests = self._take_waiting_locked()
                if requests:
                    self._running_count = len(requests)
                    self._largest_batch_size = max(self._largest_batch_size, len(requests))
                    return requests
                if self._staged is None:
                    self._condition.wait()

    def _take_waiting_locked(self) -> list[_Request]:
        requests = []
        while self._waiting and len(requests) < self._max_batch_size:
            request = self._waiting.popleft()
            if not request.cancelled:
                requests.append(request)
        return requests

    def _run_wave(self, requests: list[_Request]) -> None:
        batch = DecodeBatch(self._model, requests, self._generator)
        try:
            batch.prefill(self._version)
            self._resolve_finished(batch)
            while batch.requests:
                if self._stopping:
                    raise EngineError("engine stopped")
                self._apply_staged_weights()
                batch.decode_step(self._version)
                self._resolve_finished(batch)
        except Exception as error:
            if not isinstance(error, EngineError):
                logger.exception("generation failed for a batch of %d", len(batch.requests))
                error = EngineError(f"generation failed: {error!r}")
            for request in batch.requests:
                _settle(request, error=error)
        finally:
            with self._condition:
                self._running_count = 0

    def _resolve_finished(self, batch: DecodeBatch) -> None:
        self._generated_token_count += len(batch.requests)
        for request, reason in batch.pop_finished():
            generation = Generation(request.token_ids, request.logprobs, request.versions, reason)
            _settle(request, result=generation)
        with self._condition:
            self._running_count = len(batch.requests)

    def _fail_waiting(self, error: EngineError) -> None:
        with self._condition:
            waiting = list(self._waiting)
            self._waiting.clear()
        for request in waiting:
            _settle(request, error=error)
