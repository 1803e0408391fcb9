"""CpuEngine: sampled-token logprobs, continuous batching, prefix reuse, stop tokens, weight
updates, backpressure, shutdown."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from actors.cpu_engine import CpuEngine, EngineError, SamplingParams
from actors.decode_batch import sample_tokens
from actors.kv_slab import KvSlab
from actors.prefix_cache import CachedPrefix, PrefixCache

VOCAB_SIZE = 300
BLOCK_TIMEOUT_S = 10.0
"""Upper bound on how long a test hook blocks the worker, so a broken engine fails, not hangs."""


def tiny_model(seed: int = 0, attn_implementation: str = "sdpa") -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    config._attn_implementation = attn_implementation
    return Qwen2ForCausalLM(config).float().eval()


def reference_logprobs(model, prompt: list[int], generated: list[int], temperature: float) -> list[float]:
    """Logprobs of `generated` from one unpadded, uncached forward pass over prompt + generated."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + generated])).logits[0].float()
    logprobs = torch.log_softmax(logits / temperature, dim=-1)
    return [logprobs[len(prompt) + i - 1, token].item() for i, token in enumerate(generated)]


def on_forward_call(model, call_number: int, hook) -> None:
    """Run `hook()` on the worker thread inside the model's `call_number`-th forward pass."""
    original_forward = model.forward
    calls = 0

    def forward(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == call_number:
            hook()
        return original_forward(*args, **kwargs)

    model.forward = forward


async def submit_then_start(engine: CpuEngine, prompts_and_params) -> list:
    """Queue every request before the worker starts, so they all land in one wave."""
    tasks = [asyncio.create_task(engine.generate(p, params)) for p, params in prompts_and_params]
    await asyncio.sleep(0)
    engine.start()
    try:
        return await asyncio.gather(*tasks)
    finally:
        engine.stop()


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_batched_logprobs_match_an_unpadded_forward_pass(attn_implementation):
    model = tiny_model(attn_implementation=attn_implementation)
    engine = CpuEngine(model)
    requests = [
        ([1, 2, 3], SamplingParams(max_new_tokens=8, temperature=1.0)),
        ([5] * 11, SamplingParams(max_new_tokens=12, temperature=0.7)),
        ([7], SamplingParams(max_new_tokens=5, temperature=1.5)),
        (list(range(40, 58)), SamplingParams(max_new_tokens=9, temperature=1.0)),
    ]
    generations = asyncio.run(submit_then_start(engine, requests))

    assert engine.largest_batch_size == len(requests)
    for (prompt, params), generation in zip(requests, generations):
        assert len(generation.token_ids) == params.max_new_tokens
        expected = reference_logprobs(model, prompt, generation.token_ids, params.temperature)
        torch.testing.assert_close(torch.tensor(generation.logprobs), torch.tensor(expected), atol=1e-4, rtol=0)


def test_prefills_run_at_few_widths_and_their_logprobs_match_an_unpadded_forward_pass():
    # bf16 matmuls on CPU keep memory for every new row count (actors/decode_batch.py, prefill_width):
    # 24 prompts of 24 lengths are prefilled at no more than 12 widths, padding none of them by more
    # than an eighth beyond 128 tokens, and sampled exactly as an unpadded pass would.
    model = tiny_model()
    widths = []
    model.register_forward_pre_hook(lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]),
                                    with_kwargs=True)
    engine = CpuEngine(model, max_cached_prefix_tokens=0)
    prompts = [[(length + i) % (VOCAB_SIZE - 1) + 1 for i in range(length)] for length in range(141, 285, 6)]

    async def one_at_a_time():
        engine.start()
        try:
            return [await engine.generate(p, SamplingParams(max_new_tokens=2)) for p in prompts]
        finally:
            engine.stop()

    generations = asyncio.run(one_at_a_time())
    prefill_widths = [w for w in widths if w > 1]  # decode steps run one token a row
    assert len(prefill_widths) == len(prompts)
    assert len(set(prefill_widths)) <= len(prompts) // 2, sorted(set(prefill_widths))
    assert all(len(p) <= w <= len(p) * 9 / 8 for p, w in zip(prompts, prefill_widths))
    for prompt, generation in zip(prompts, generations):
        expected = reference_logprobs(model, prompt, generation.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(generation.logprobs), torch.tensor(expected), atol=1e-4, rtol=0)


def test_concurrent_requests_are_batched():
    engine = CpuEngine(tiny_model(), max_batch_size=32)

    async def main():
        engine.start()
        try:
            prompts = [[i + 1] * (i + 2) for i in range(8)]
            return await asyncio.gather(*(engine.generate(p, SamplingParams(max_new_tokens=6)) for p in prompts))
        finally:
            engine.stop()

    generations = asyncio.run(main())
    assert [len(g.token_ids) for g in generations] == [6] * 8
    assert engine.largest_batch_size > 1
    assert engine.generated_token_count == 48


def test_stop_token_ends_request_and_max_new_tokens_gives_length():
    prompt = [10, 20, 30]
    unstopped = asyncio.run(submit_then_start(CpuEngine(tiny_model(), seed=3), [(prompt, SamplingParams(6))]))[0]
    assert unstopped.finish_reason == "length"
    assert len(unstopped.token_ids) == 6

    # Same seed and batch, so the same tokens are sampled until the stop token shows up.
    stop_token = unstopped.token_ids[2]
    stop_at = unstopped.token_ids.index(stop_token)
    params = SamplingParams(max_new_tokens=6, stop_token_ids=(stop_token,))
    stopped = asyncio.run(submit_then_start(CpuEngine(tiny_model(), seed=3), [(prompt, params)]))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == unstopped.token_ids[: stop_at + 1]
    assert stopped.logprobs == pytest.approx(unstopped.logprobs[: stop_at + 1])


def test_finished_row_is_resolved_before_the_rest_of_its_batch():
    model = tiny_model()
    short_done = threading.Event()
    # Hold the long row's 10th forward pass until the short answer has reached the caller.
    on_forward_call(model, 10, lambda: short_done.wait(BLOCK_TIMEOUT_S))
    engine = CpuEngine(model)

    async def main():
        short = asyncio.create_task(engine.generate([1, 2], SamplingParams(max_new_tokens=3)))
        long = asyncio.create_task(engine.generate([3, 4], SamplingParams(max_new_tokens=30)))
        await asyncio.sleep(0)
        engine.start()
        try:
            done, _ = await asyncio.wait([short, long], return_when=asyncio.FIRST_COMPLETED)
            first_done = set(done)
            short_done.set()
            await asyncio.gather(short, long)
            return first_done, short, long
        finally:
            engine.stop()

    first_done, short, long = asyncio.run(main())
    assert first_done == {short}
    assert len(long.result().token_ids) == 30


def test_weights_staged_mid_generation_apply_at_a_step_boundary():
    model, old_model, new_model = tiny_model(seed=0), tiny_model(seed=0), tiny_model(seed=1)
    new_state = {name: p.detach().clone() for name, p in new_model.named_parameters()}
    engine = CpuEngine(model)

    def stage_from_another_thread():
        stager = threading.Thread(target=engine.stage_weights, args=(new_state, 1))
        stager.start()
        stager.join()

    # Forward 1 is the prefill, so tokens 0..4 come from version 0 and the rest from version 1.
    on_forward_call(model, 5, stage_from_another_thread)
    prompt = [1, 2, 3]
    generation = asyncio.run(submit_then_start(engine, [(prompt, SamplingParams(max_new_tokens=20))]))[0]

    assert generation.versions == [0] * 5 + [1] * 15
    assert engine.version == 1
    for name, param in model.named_parameters():
        assert torch.equal(param, new_state[name]), name
    # The running request was re-prefilled: each token's logits come from one version over its whole context.
    old_expected = reference_logprobs(old_model, prompt, generation.token_ids, temperature=1.0)
    new_expected = reference_logprobs(new_model, prompt, generation.token_ids, temperature=1.0)
    assert generation.logprobs == pytest.approx(old_expected[:5] + new_expected[5:], abs=1e-4)
    assert engine.cached_prefix_tokens == len(prompt) + 20 - 1  # consistent with version 1, so kept


def test_weights_staged_while_idle_apply_before_the_next_request():
    model = tiny_model(seed=0)
    new_model = tiny_model(seed=1)
    engine = CpuEngine(model)
    engine.stage_weights(dict(new_model.named_parameters()), version=7)
    prompt = [4, 5, 6]
    generation = asyncio.run(submit_then_start(engine, [(prompt, SamplingParams(max_new_tokens=5))]))[0]

    assert generation.versions == [7] * 5
    expected = reference_logprobs(new_model, prompt, generation.token_ids, temperature=1.0)
    assert generation.logprobs == pytest.approx(expected, abs=1e-4)


def test_bad_staged_weights_are_rejected():
    engine = CpuEngine(tiny_model())
    state = {name: p.detach().clone() for name, p in tiny_model(seed=1).named_parameters()}
    some_name = next(iter(state))
    with pytest.raises(ValueError, match="unknown"):
        engine.stage_weights({**state, "not.a.param": torch.zeros(1)}, version=1)
    with pytest.raises(ValueError, match="shape"):
        engine.stage_weights({**state, some_name: torch.zeros(3)}, version=1)
    with pytest.raises(ValueError, match="miss"):
        engine.stage_weights({k: v for k, v in state.items() if k != some_name}, version=1)


def test_a_resent_version_is_ignored_and_counted_whether_staged_or_applied():
    model = tiny_model(seed=0)
    engine = CpuEngine(model)
    v2 = {name: p.detach().clone() for name, p in tiny_model(seed=1).named_parameters()}
    stale = {name: p.detach().clone() for name, p in tiny_model(seed=2).named_parameters()}
    assert engine.stage_weights(v2, version=2)
    assert not engine.stage_weights(stale, version=2)  # staged, not applied yet: a resend
    assert not engine.stage_weights(stale, version=1)  # older than what is staged
    generation = asyncio.run(submit_then_start(engine, [([1, 2, 3], SamplingParams(max_new_tokens=3))]))[0]
    assert generation.versions == [2, 2, 2] and engine.version == 2
    assert not engine.stage_weights(stale, version=2)  # serving it already
    assert engine.ignored_stagings == 3 and engine.failure is None
    for name, param in model.named_parameters():
        assert torch.equal(param, v2[name]), name


def test_a_crashed_worker_says_the_engine_is_dead_and_fails_every_request():
    engine = CpuEngine(tiny_model())
    # Weights that pass every check but cannot be copied in: applying them crashes the worker thread.
    unreadable = {name: torch.empty(p.shape, device="meta") for name, p in tiny_model().named_parameters()}

    async def main():
        engine.start()
        try:
            await engine.generate([1, 2], SamplingParams(max_new_tokens=2))
            assert engine.failure is None
            engine.stage_weights(unreadable, version=1)
            deadline = time.monotonic() + BLOCK_TIMEOUT_S
            while engine.failure is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            with pytest.raises(EngineError):
                await engine.generate([1, 2], SamplingParams(max_new_tokens=2))
        finally:
            engine.stop()

    asyncio.run(main())
    assert "worker thread crashed" in engine.failure and "meta" in engine.failure
    assert engine.version == 0


def test_stop_fails_running_and_waiting_requests():
    model = tiny_model()
    worker_busy = threading.Event()
    release_worker = threading.Event()

    def hold_worker():
        worker_busy.set()
        release_worker.wait(BLOCK_TIMEOUT_S)

    on_forward_call(model, 3, hold_worker)
    engine = CpuEngine(model, max_batch_size=1)

    async def main():
        engine.start()
        running = asyncio.create_task(engine.generate([1, 2], SamplingParams(max_new_tokens=50)))
        waiting = asyncio.create_task(engine.generate([3, 4], SamplingParams(max_new_tokens=50)))
        await asyncio.to_thread(worker_busy.wait, BLOCK_TIMEOUT_S)
        assert engine.queue_depth == 2
        threading.Timer(0.05, release_worker.set).start()  # stop() joins the held worker
        engine.stop()
        results = await asyncio.gather(running, waiting, return_exceptions=True)
        with pytest.raises(EngineError):
            await engine.generate([5], SamplingParams(max_new_tokens=1))
        return results

    results = asyncio.run(main())
    assert [type(r) for r in results] == [EngineError, EngineError]


def test_cancelled_request_does_not_disturb_the_others():
    engine = CpuEngine(tiny_model())

    async def main():
        cancelled = asyncio.create_task(engine.generate([1], SamplingParams(max_new_tokens=40)))
        kept = asyncio.create_task(engine.generate([2], SamplingParams(max_new_tokens=8)))
        await asyncio.sleep(0)
        cancelled.cancel()
        engine.start()
        try:
            return await kept
        finally:
            engine.stop()

    assert len(asyncio.run(main()).token_ids) == 8


@pytest.mark.parametrize(
    ("prompt", "params_kwargs", "message"),
    [
        ([], {"max_new_tokens": 4}, "empty"),
        ([1, VOCAB_SIZE], {"max_new_tokens": 4}, "token ids"),
        ([1, 2], {"max_new_tokens": 10**6}, "positions"),
    ],
)
def test_bad_prompts_are_rejected(prompt, params_kwargs, message):
    engine = CpuEngine(tiny_model())
    with pytest.raises(ValueError, match=message):
        asyncio.run(engine.generate(prompt, SamplingParams(**params_kwargs)))


@pytest.mark.parametrize("kwargs", [{"max_new_tokens": 0}, {"max_new_tokens": 4, "temperature": 0.0}])
def test_bad_sampling_params_are_rejected(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def assert_matches_reference(model, prompt, generation, temperature: float = 1.0) -> None:
    expected = reference_logprobs(model, prompt, generation.token_ids, temperature)
    torch.testing.assert_close(torch.tensor(generation.logprobs), torch.tensor(expected), atol=1e-4, rtol=0)


async def wait_until(predicate, timeout_s: float = BLOCK_TIMEOUT_S) -> None:
    """Yield to the loop until `predicate()` holds (the worker thread makes progress meanwhile)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_requests_joining_a_running_batch_match_an_unpadded_forward_pass(attn_implementation):
    model = tiny_model(attn_implementation=attn_implementation)
    engine = CpuEngine(model, seed=1)
    worker_held, release_worker = threading.Event(), threading.Event()

    def hold_worker():
        worker_held.set()
        release_worker.wait(BLOCK_TIMEOUT_S)

    async def main():
        engine.start()
        try:
            earlier_prompt = [9, 8, 7, 6, 5]
            earlier = await engine.generate(earlier_prompt, SamplingParams(max_new_tokens=7))
            # Forward 1 prefills the long request; newcomers queue while forward 3 is held.
            on_forward_call(model, 3, hold_worker)
            long = asyncio.create_task(engine.generate([1, 2, 3], SamplingParams(max_new_tokens=40)))
            await asyncio.to_thread(worker_held.wait, BLOCK_TIMEOUT_S)
            newcomers = [
                (earlier_prompt + earlier.token_ids + [11, 12], SamplingParams(max_new_tokens=6, temperature=0.8)),
                ([5] * 13, SamplingParams(max_new_tokens=12, temperature=1.3)),
                ([40, 41], SamplingParams(max_new_tokens=9)),
            ]
            tasks = [asyncio.create_task(engine.generate(p, params)) for p, params in newcomers]
            await wait_until(lambda: engine.queue_depth == 4)
            release_worker.set()
            results = await asyncio.gather(long, *tasks)
            return [([1, 2, 3], SamplingParams(40)), *newcomers], results
        finally:
            engine.stop()

    requests, generations = asyncio.run(main())
    assert engine.largest_batch_size == 4  # the newcomers decoded alongside the long request
    assert engine.reused_tokens == 5 + 7 - 1  # the extended prompt skipped its cached prefix
    for (prompt, params), generation in zip(requests, generations):
        assert len(generation.token_ids) == params.max_new_tokens
        assert_matches_reference(model, prompt, generation, params.temperature)


def test_rows_leave_and_join_over_many_steps():
    model = tiny_model()
    engine = CpuEngine(model, max_batch_size=8, seed=2)
    # Six long prompts fill rows 0-5 and leave after 2 tokens: the two short prompts that keep
    # decoding in rows 6-7 are compacted to the front, then later requests join and leave.
    requests = [(list(range(10 * i, 10 * i + 20)), SamplingParams(2)) for i in range(6)]
    requests += [([2, 3], SamplingParams(30)), ([4, 5, 6], SamplingParams(30))]
    requests += [
        ([(13 * i + j) % VOCAB_SIZE for j in range(1 + (37 * i) % 71)], SamplingParams(max_new_tokens=2 + (5 * i) % 17))
        for i in range(6)
    ]
    generations = asyncio.run(submit_then_start(engine, requests))

    assert engine.largest_batch_size == 8
    for (prompt, params), generation in zip(requests, generations):
        assert len(generation.token_ids) == params.max_new_tokens
        assert_matches_reference(model, prompt, generation)


def test_kv_slab_trim_and_compaction_keep_every_row_s_states():
    slab = KvSlab(num_layers=2)

    def states(tokens: int, fill: float):
        return [(torch.full((2, tokens, 4), fill + layer), torch.full((2, tokens, 4), -fill - layer))
                for layer in range(2)]

    for row, tokens in enumerate([3, 7, 5]):
        slab.write_row(row, states(tokens, float(row)))
    slab.clear_row(1)
    slab.trim(longest_row_tokens=5)
    assert slab.length - slab.start == 5  # the freed 7-token row no longer widens the window
    before = {row: slab.row_kv(row) for row in (0, 2)}
    slab.compact([0, 2])

    assert (slab.num_rows, slab.length - slab.start) == (2, 5)
    for new_row, old_row in enumerate((0, 2)):
        for (k, v), (old_k, old_v) in zip(slab.row_kv(new_row), before[old_row]):
            assert torch.equal(k, old_k) and torch.equal(v, old_v)


def test_kv_states_are_freed_when_dropped_not_at_python_s_next_full_collection():
    # Every prefill and every weight update makes a KV slab; a slab that outlived its use until a
    # rare full collection held hundreds of MB each for a real model (an actor grew to 7.8 GiB).
    model = tiny_model()
    engine = CpuEngine(model, max_batch_size=4, seed=5)
    new_weights = {name: p.detach().clone() for name, p in model.named_parameters()}

    async def episodes():
        engine.start()
        try:
            for version in (1, 2, 3):
                await asyncio.gather(*(run_episode_turns(engine, turns=3) for _ in range(3)))
                engine.stage_weights(new_weights, version)
            await run_episode_turns(engine, turns=2)
            return engine.version
        finally:
            engine.stop()

    gc.collect()
    gc.disable()  # process-wide: the engine's thread runs without the cycle collector too
    try:
        assert asyncio.run(episodes()) == 3
        live_slabs = sum(type(o) is KvSlab for o in gc.get_objects())  # garbage cycles included; not proxies
    finally:
        gc.enable()
    assert engine.prefill_tokens > 0 and live_slabs <= 1  # the batch's own slab, no more


async def run_episode_turns(engine: CpuEngine, turns: int) -> list[tuple[list[int], object]]:
    """Each turn's prompt = previous prompt + its sampled tokens + an 'observation' delta."""
    prompt, history = [3, 1, 4, 1, 5], []
    for turn in range(turns):
        generation = await engine.generate(prompt, SamplingParams(max_new_tokens=6))
        history.append((prompt, generation))
        prompt = prompt + generation.token_ids + [100 + turn, 101 + turn, 102 + turn]
    return history


def test_prefix_reuse_gives_the_same_logprobs_and_prefills_fewer_tokens():
    model = tiny_model()
    with_reuse, without_reuse = CpuEngine(model, seed=4), CpuEngine(model, seed=4, max_cached_prefix_tokens=0)

    async def main(engine):
        engine.start()
        try:
            return await run_episode_turns(engine, turns=3)
        finally:
            engine.stop()

    reused, fresh = asyncio.run(main(with_reuse)), asyncio.run(main(without_reuse))

    for (prompt, generation), (_, fresh_generation) in zip(reused, fresh):
        assert generation.token_ids == fresh_generation.token_ids
        assert generation.logprobs == pytest.approx(fresh_generation.logprobs, abs=1e-4)
        assert_matches_reference(model, prompt, generation)
    # Turns 2 and 3 prefill only the last sampled token and the 3-token delta.
    assert with_reuse.prefill_tokens == 5 + 2 * (1 + 3)
    assert with_reuse.reused_tokens == sum(len(prompt) - 4 for prompt, _ in reused[1:])
    assert without_reuse.prefill_tokens == sum(len(prompt) for prompt, _ in fresh)
    assert without_reuse.reused_tokens == 0


def test_new_weights_invalidate_cached_prefixes():
    model, new_model = tiny_model(seed=0), tiny_model(seed=1)
    engine = CpuEngine(model)

    async def main():
        engine.start()
        try:
            first = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=5))
            assert engine.cached_prefix_tokens == 3 + 5 - 1
            engine.stage_weights(dict(new_model.named_parameters()), version=1)
            await wait_until(lambda: engine.version == 1)
            prompt = [1, 2, 3, *first.token_ids, 50]
            return prompt, await engine.generate(prompt, SamplingParams(max_new_tokens=5))
        finally:
            engine.stop()

    prompt, second = asyncio.run(main())
    assert engine.reused_tokens == 0
    assert second.versions == [1] * 5
    assert_matches_reference(new_model, prompt, second)


def test_prefix_cache_takes_the_longest_extended_prefix_and_stays_within_its_token_bound():
    def prefix(tokens: int) -> CachedPrefix:
        return CachedPrefix(tokens, [(torch.arange(tokens, dtype=torch.float32)[None, :, None],) * 2])

    cache = PrefixCache(max_tokens=10)
    cache.put([1, 2], prefix(2))
    cache.put([1, 2, 3, 4], prefix(4))
    assert cache.take([7, 1, 2, 3]) is None
    taken = cache.take([1, 2, 3, 4, 5])
    assert taken.token_count == 4 and len(cache) == 1  # taken entries leave the cache
    cache.put([1, 2, 3, 4], prefix(4))
    exact = cache.take([1, 2, 3, 4])  # the same prompt again: reuse all but its last token
    assert exact.token_count == 3 and exact.kv[0][0].shape[1] == 3
    cache.put([5, 6, 7, 8, 9], prefix(5))
    cache.put([6, 7, 8, 9, 10, 11], prefix(6))  # 2 + 5 + 6 > 10: the oldest entries go
    assert cache.token_count == 6 and len(cache) == 1
    cache.put(list(range(11)), prefix(11))  # larger than the whole cache: not stored
    assert cache.token_count == 6


def test_generate_waits_for_room_beyond_max_queued_requests():
    model = tiny_model()
    worker_held, release_worker = threading.Event(), threading.Event()

    def hold_worker():
        worker_held.set()
        release_worker.wait(BLOCK_TIMEOUT_S)

    on_forward_call(model, 1, hold_worker)
    engine = CpuEngine(model, max_batch_size=1, max_queued_requests=2)

    async def main():
        engine.start()
        try:
            tasks = [asyncio.create_task(engine.generate([i + 1], SamplingParams(max_new_tokens=3))) for i in range(6)]
            await asyncio.to_thread(worker_held.wait, BLOCK_TIMEOUT_S)
            await wait_until(lambda: engine.queue_depth == 3)
            await asyncio.sleep(0.05)  # time enough for a queue without a bound to take all 6
            depth_while_held = engine.queue_depth
            tasks[4].cancel()  # a call held back may give up; the others still get served
            release_worker.set()
            return depth_while_held, await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            engine.stop()

    depth_while_held, results = asyncio.run(main())
    assert depth_while_held == 3  # one running + max_queued_requests waiting
    assert isinstance(results[4], asyncio.CancelledError)
    assert [len(r.token_ids) for i, r in enumerate(results) if i != 4] == [3] * 5


def test_a_failed_forward_pass_fails_its_requests_and_the_engine_serves_on():
    model = tiny_model()

    def fail():
        raise RuntimeError("injected forward failure")

    on_forward_call(model, 3, fail)
    engine = CpuEngine(model)

    async def main():
        engine.start()
        try:
            failed = await asyncio.gather(*(engine.generate([i + 1, 2], SamplingParams(max_new_tokens=10))
                                            for i in range(2)), return_exceptions=True)
            return failed, await engine.generate([3, 4], SamplingParams(max_new_tokens=4))
        finally:
            engine.stop()

    failed, later = asyncio.run(main())
    assert [type(f) for f in failed] == [EngineError, EngineError]
    assert len(later.token_ids) == 4


def test_sampling_follows_the_tempered_distribution_and_reports_its_logprobs():
    probabilities = torch.tensor([0.1, 0.2, 0.0, 0.3, 0.4])
    rows = 20000
    logits = probabilities.log().expand(rows, -1) * 0.5  # temperature 0.5 restores the probabilities
    token_ids, logprobs = sample_tokens(logits, [0.5] * rows, torch.Generator().manual_seed(0))

    frequencies = torch.bincount(torch.tensor(token_ids), minlength=5).float() / rows
    torch.testing.assert_close(frequencies, probabilities, atol=0.015, rtol=0)
    assert frequencies[2] == 0  # a zero-probability token is never drawn
    torch.testing.assert_close(torch.tensor(logprobs), probabilities.log()[token_ids], atol=1e-5, rtol=0)


def test_greedy_rows_take_the_argmax_beside_sampled_rows_and_report_tempered_logprobs():
    logits = torch.tensor([[0.0, 1.0, 3.0, 2.0]]).expand(400, -1).contiguous()
    greedy = [row % 2 == 0 for row in range(400)]
    token_ids, logprobs = sample_tokens(logits, [0.5] * 400, torch.Generator().manual_seed(0), greedy)

    assert {token_ids[row] for row in range(0, 400, 2)} == {2}
    assert len({token_ids[row] for row in range(1, 400, 2)}) > 1  # the other rows still sample
    expected = torch.log_softmax(logits[0] / 0.5, dim=-1)[torch.tensor(token_ids)]
    torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-5, rtol=0)


def test_greedy_requests_generate_the_same_tokens_every_time_and_sampled_ones_do_not():
    model = tiny_model()
    prompts = [[1, 2, 3], [9] * 7, list(range(40, 52))]

    def generate(greedy: bool, seed: int) -> list[list[int]]:
        params = SamplingParams(max_new_tokens=10, temperature=1.0, greedy=greedy)
        engine = CpuEngine(model, seed=seed)
        return [g.token_ids for g in asyncio.run(submit_then_start(engine, [(p, params) for p in prompts]))]

    assert generate(True, seed=0) == generate(True, seed=1)
    assert generate(False, seed=0) != generate(False, seed=1)
    with torch.no_grad():  # greedy is the argmax of an unpadded forward pass, token after token
        ids = list(prompts[0])
        for _ in range(10):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert generate(True, seed=2)[0] == ids[len(prompts[0]):]
