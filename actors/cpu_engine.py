"""Continuously batched CPU inference engine over a transformers causal LM (the test/dev backend).

Episodes on the actor's asyncio loop call ``await engine.generate(prompt_ids, params)``.
A dedicated worker thread does all torch work so the loop stays responsive. Each step:

1. apply staged weights, if any (a safe point: no forward pass in flight); every later token
   carries the new version. States computed by the old weights would give logprobs of neither
   version, so the prefix cache is cleared and every running request is re-prefilled (its
   prompt and sampled tokens run through the new weights, as the vLLM engine does): each token
   labelled v comes from weights v over its whole context;
2. take waiting requests while the batch has free rows (``max_batch_size``); for each, take
   the longest cached prefix of its prompt (``actors.prefix_cache``), prefill only the rest
   (grouped by width, ``actors.decode_batch.prefill``), sample its first token and merge it
   into the running batch: requests join between decode steps and never wait for a wave
   (while a batch decodes, newcomers gather for at most a few steps to share one prefill);
3. decode one token for every running row in one forward pass over the shared KV slab
   (``actors.kv_slab``), recording each token's fp32 logprob and policy version;
4. resolve finished rows at once (stop token or ``max_new_tokens``) and free their rows; a
   finished request's states go to the prefix cache under its token ids (prompt + sampled
   tokens but the last), so the episode's next turn prefills only its new tokens.

``generate`` waits (asynchronously) while ``max_queued_requests`` requests already wait for
a row, so a burst of episodes cannot grow the queue without bound.

The engine never changes torch's thread count: the actor process sets it
(``actors.torch_threads``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque

import torch

from actors.decode_batch import DecodeBatch, EngineRequest, Newcomer, prefill, prefill_groups
from actors.engine_api import EngineError, Generation, SamplingParams
from actors.kv_slab import RowKv
from actors.prefix_cache import CachedPrefix, PrefixCache
from actors.weight_member import HostReceivedWeights
from common.heap import HeapTrimmer

__all__ = ["CpuEngine", "EngineError", "Generation", "SamplingParams"]

logger = logging.getLogger(__name__)

_ADMIT_FRACTION = 8
"""Newcomers are prefilled once at least 1/8 of the running batch waits (or after a few steps)."""
_MAX_DEFERRED_STEPS = 4
"""Decode steps a newcomer waits at most for others to share its prefill."""


def _settle(request: EngineRequest, result: Generation | None = None, error: BaseException | None = None) -> None:
    """Resolve a request's future on its own event loop (called from the worker thread)."""

    def settle_on_loop() -> None:
        if request.future.done():  # cancelled by its caller meanwhile
            return
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(result)

    _call_on_loop(request.loop, settle_on_loop)


def _call_on_loop(loop: asyncio.AbstractEventLoop, callback) -> None:
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:  # the loop is closed: nobody is waiting for this answer any more
        pass


class CpuEngine:
    """Serves concurrent generate() calls from one continuously batched causal LM on a worker thread."""

    def __init__(self, model: torch.nn.Module, max_batch_size: int = 32, seed: int = 0,
                 max_queued_requests: int = 1024, max_cached_prefix_tokens: int = 65536,
                 initial_version: int = 0, heap_trim_interval_s: float | None = 30.0):
        """``max_cached_prefix_tokens`` bounds the prefix cache; 0 turns prefix reuse off. A
        cached token costs 2 x layers x kv_heads x head_dim x dtype bytes (tiny model: 2 KiB).
        ``initial_version``: the policy version of ``model``'s weights (non-zero on a resume).
        ``heap_trim_interval_s``: how often, at most, the worker hands the heap's freed memory
        back to the OS between two steps (``common/heap.py``: without it an actor's resident memory
        grows with fragments of freed tensors); None: never."""
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {max_queued_requests}")
        layer_types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise ValueError(f"CpuEngine serves full-attention models only; this one has layers {sorted(layer_types)}")
        self._model = model.eval()
        self._max_batch_size = max_batch_size
        self._max_queued_requests = max_queued_requests
        self._generator = torch.Generator().manual_seed(seed)
        self._params_by_name = dict(model.named_parameters(remove_duplicate=False))
        self._vocab_size = int(model.config.vocab_size)
        self._max_positions = getattr(model.config, "max_position_embeddings", None)
        self._batch = DecodeBatch(self._model, self._generator)
        self._prefix_cache = PrefixCache(max_cached_prefix_tokens)
        self._condition = threading.Condition()
        self._waiting: deque[EngineRequest] = deque()
        self._room_waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = deque()
        self._running_count = 0
        self._staged: tuple[dict[str, torch.Tensor], int] | None = None
        self._version = initial_version
        self._stopping = False
        self._failure: str | None = None
        self._thread: threading.Thread | None = None
        self.ignored_stagings = 0
        """``stage_weights`` calls with a version already staged or serving (resends), ignored."""
        self.largest_batch_size = 0
        """Most requests decoding together so far (shows that batching happens)."""
        self.generated_token_count = 0
        """Tokens sampled since construction, for tokens/s statistics."""
        self.prefill_tokens = 0
        """Context tokens run through the model: prompts past their cached prefix, and running
        requests re-prefilled after a weight update."""
        self.reused_tokens = 0
        """Prompt tokens whose KV states came from the prefix cache instead of a forward pass."""
        self._deferred_steps = 0
        self.heap = HeapTrimmer(heap_trim_interval_s)
        """Trims the heap now and then; ``heap.trims`` counts how often it has."""
        self.busy_cpu_s = 0.0
        """CPU seconds the worker thread spent serving (forward passes and bookkeeping, not idle
        waits): per generated token it measures batching efficiency even on a contended machine."""

    @property
    def version(self) -> int:
        """Policy version of the weights now in the model."""
        return self._version

    @property
    def failure(self) -> str | None:
        """Why the engine stopped serving on its own (its worker thread crashed); None otherwise."""
        return self._failure

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a row plus running (not those held back by ``max_queued_requests``)."""
        with self._condition:
            return len(self._waiting) + self._running_count

    @property
    def cached_prefix_tokens(self) -> int:
        """Tokens whose KV states the prefix cache holds now."""
        return self._prefix_cache.token_count

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
        self._fail_pending(EngineError("engine stopped"))

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation:
        """Sample a completion of the prompt; raises EngineError if the engine stops first."""
        self._check_prompt(prompt_token_ids, params)
        loop = asyncio.get_running_loop()
        request = EngineRequest(list(prompt_token_ids), params, loop, loop.create_future())
        await self._enqueue(request)
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True
            self._forget_waiting(request)
            raise

    def weight_group_member(self, address: str, timeout_s: float, device: str) -> HostReceivedWeights:
        """The actor process receives each version and stages it here (``stage_weights``)."""
        return HostReceivedWeights(self, address, timeout_s, device)

    def stage_weights(self, state: dict[str, torch.Tensor], version: int) -> bool:
        """Stage new weights (thread-safe); they are copied in at the next step boundary.

        ``state`` must name every parameter (tied ones once under either name) with its
        exact shape. The engine keeps references to the tensors until it has copied them,
        so the caller must not modify them meanwhile. A newer staging replaces an older one
        not yet applied; a version not newer than the one staged or serving (a resend) is
        ignored and counted in ``ignored_stagings``. Returns whether the weights were staged.
        """
        self._check_weights(state)
        with self._condition:
            newest = self._staged[1] if self._staged is not None else self._version
            if version <= newest:
                self.ignored_stagings += 1
                return False
            self._staged = (dict(state), version)
            self._condition.notify_all()
        return True

    async def _enqueue(self, request: EngineRequest) -> None:
        """Queue the request, first waiting (FIFO) while ``max_queued_requests`` already wait."""
        woken = False
        while True:
            with self._condition:
                if self._stopping:
                    raise EngineError("engine stopped")
                has_room = len(self._waiting) < self._max_queued_requests
                if has_room and (woken or not self._room_waiters):
                    self._waiting.append(request)
                    self._condition.notify_all()
                    return
                room = request.loop.create_future()
                # A woken waiter that lost its slot to a newcomer keeps its place at the front.
                (self._room_waiters.appendleft if woken else self._room_waiters.append)((request.loop, room))
            try:
                await room
            except asyncio.CancelledError:
                with self._condition:
                    if (request.loop, room) in self._room_waiters:
                        self._room_waiters.remove((request.loop, room))
                    else:  # it was woken already: pass the free slot on
                        self._wake_room_waiters_locked(1)
                raise
            woken = True

    def _wake_room_waiters_locked(self, count: int) -> None:
        for _ in range(min(count, len(self._room_waiters))):
            loop, room = self._room_waiters.popleft()
            _call_on_loop(loop, lambda room=room: room.done() or room.set_result(None))

    def _forget_waiting(self, request: EngineRequest) -> None:
        """A cancelled request leaves the queue at once, so it does not hold a queue slot."""
        with self._condition:
            if request in self._waiting:
                self._waiting.remove(request)
                self._wake_room_waiters_locked(1)

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

    def _apply_staged_weights(self) -> bool:
        with self._condition:
            staged, self._staged = self._staged, None
        if staged is None:
            return False
        state, version = staged
        with torch.no_grad():
            for name, tensor in state.items():
                self._params_by_name[name].copy_(tensor)
        self._version = version
        self._prefix_cache.clear()  # states computed by the old weights must not seed new requests
        logger.info("applied weights of version %d", version)
        return True

    def _worker_main(self) -> None:
        try:
            while True:
                started_cpu_s = time.thread_time()
                if self._apply_staged_weights():
                    self._reprefill(self._batch.drop_all())
                self.busy_cpu_s += time.thread_time() - started_cpu_s
                if (newcomers := self._next_newcomers()) is None:
                    break
                started_cpu_s = time.thread_time()
                self._step(newcomers)
                self.heap.maybe_trim()
                self.busy_cpu_s += time.thread_time() - started_cpu_s
        except Exception as error:
            logger.exception("cpu engine worker crashed")
            with self._condition:
                self._stopping = True
                self._failure = f"the worker thread crashed: {error!r}"
        self._fail_pending(EngineError("engine stopped"))

    def _next_newcomers(self) -> list[EngineRequest] | None:
        """Waiting requests that fit in the batch; blocks while idle; None when stopping.

        Returns none at once when weights are staged, so they apply before anything else runs.
        """
        with self._condition:
            while True:
                if self._stopping:
                    return None
                if self._staged is not None:
                    return []
                if self._defer_admission_locked():
                    return []
                newcomers, queued = [], len(self._waiting)
                while self._waiting and len(self._batch) + len(newcomers) < self._max_batch_size:
                    request = self._waiting.popleft()
                    if not request.cancelled:
                        newcomers.append(request)
                self._wake_room_waiters_locked(queued - len(self._waiting))
                self._deferred_steps = 0
                if newcomers or len(self._batch):
                    self._running_count = len(self._batch) + len(newcomers)
                    return newcomers
                self._condition.wait()

    def _defer_admission_locked(self) -> bool:
        """Let a few newcomers gather before a prefill while a batch is decoding.

        A prefill is a forward pass of its own, about as costly as a decode step for a small
        batch: admitting each newcomer the step it arrives (episodes finish their env steps one
        by one) would double the forward passes. Waiting while fewer than 1/8 of the running
        batch wait, for at most ``_MAX_DEFERRED_STEPS`` decode steps, prefills them together.
        """
        running, waiting = len(self._batch), len(self._waiting)
        if not running or not waiting or running + waiting <= 1:
            return False
        if waiting * _ADMIT_FRACTION >= running or self._deferred_steps >= _MAX_DEFERRED_STEPS:
            return False
        if running >= self._max_batch_size:
            return False  # no free row: the waiting cannot join anyway, nothing to gather
        self._deferred_steps += 1
        return True

    @torch.inference_mode()
    def _step(self, newcomers: list[EngineRequest]) -> None:
        """Admit the newcomers, then decode one token for every row; a failed forward pass fails them all."""
        in_flight = [*self._batch.requests, *newcomers]  # settling twice is harmless; forgetting one hangs it
        try:
            if newcomers:
                self._admit(newcomers)
            if len(self._batch):
                self._batch.decode_step(self._version)
                self.generated_token_count += len(self._batch)
                self._resolve(self._batch.pop_finished(keep_states=self._prefix_cache.max_tokens > 0))
        except Exception as error:
            logger.exception("generation failed for a batch of %d", len(self._batch) + len(newcomers))
            failure = EngineError(f"generation failed: {error!r}")
            self._batch.drop_all()
            for request in in_flight:
                _settle(request, error=failure)
        with self._condition:
            self._running_count = len(self._batch)

    @torch.inference_mode()
    def _reprefill(self, running: list[EngineRequest]) -> None:
        """Recompute the running requests' states with the weights just applied; they decode on."""
        try:
            self._prefill_and_join([Newcomer(request, None) for request in running])
        except Exception as error:
            logger.exception("re-prefill after a weight update failed for %d requests", len(running))
            failure = EngineError(f"generation failed: {error!r}")
            self._batch.drop_all()
            for request in running:
                _settle(request, error=failure)

    def _admit(self, requests: list[EngineRequest]) -> None:
        self._prefill_and_join([Newcomer(r, self._prefix_cache.take(r.prompt_token_ids)) for r in requests])

    def _prefill_and_join(self, newcomers: list[Newcomer]) -> None:
        for group in prefill_groups(newcomers):
            self.reused_tokens += sum(n.reused_token_count for n in group)
            self.prefill_tokens += sum(len(n.suffix) for n in group)
            sampled_before = sum(len(n.request.token_ids) for n in group)
            states = prefill(self._model, group, self._version, self._generator)
            self.generated_token_count += sum(len(n.request.token_ids) for n in group) - sampled_before
            for newcomer, kv in zip(group, states):
                request = newcomer.request
                reason = request.finish_reason()
                if reason is not None:
                    self._resolve([(request, reason, kv)])
                elif not request.cancelled:
                    self._batch.admit(request, kv)
        self.largest_batch_size = max(self.largest_batch_size, len(self._batch))

    def _resolve(self, finished: list[tuple[EngineRequest, str, RowKv | None]]) -> None:
        for request, reason, kv in finished:
            if kv is not None:
                # The states cover the context up to the last token that went through the model;
                # a request that ended at its first sampled token holds one token fewer than its
                # context. Cache exactly what is held: a shorter prefix is still a valid prefix.
                held = kv[0][0].shape[1] if kv else 0
                tokens = request.context_token_ids()[:held]
                if tokens:
                    self._prefix_cache.put(tokens, CachedPrefix(len(tokens), kv))
            _settle(request, result=Generation(request.token_ids, request.logprobs, request.versions, reason))

    def _fail_pending(self, error: EngineError) -> None:
        """Fail waiting requests, the running batch (worker thread only) and generate() calls held back."""
        with self._condition:
            waiting = list(self._waiting)
            self._waiting.clear()
            self._wake_room_waiters_locked(len(self._room_waiters))
        if self._thread is None or threading.current_thread() is self._thread or not self._thread.is_alive():
            waiting += self._batch.drop_all()
        for request in waiting:
            _settle(request, error=error)
