"""CpuEngine: sampled-token logprobs, batching, stop tokens, weight updates, shutdown."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from actors.engine import CpuEngine, EngineError, SamplingParams

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
    model = tiny_model(seed=0)
    new_state = {name: p.detach().clone() for name, p in tiny_model(seed=1).named_parameters()}
    engine = CpuEngine(model)

    def stage_from_another_thread():
        stager = threading.Thread(target=engine.stage_weights, args=(new_state, 1))
        stager.start()
        stager.join()

    # Forward 1 is the prefill, so tokens 0..4 come from version 0 and the rest from version 1.
    on_forward_call(model, 5, stage_from_another_thread)
    generation = asyncio.run(submit_then_start(engine, [([1, 2, 3], SamplingParams(max_new_tokens=20))]))[0]

    assert generation.versions == [0] * 5 + [1] * 15
    assert engine.version == 1
    for name, param in model.named_parameters():
        assert torch.equal(param, new_state[name]), name


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
    engine.stage_weights(state, version=2)
    with pytest.raises(ValueError, match="not newer"):
        engine.stage_weights(state, version=2)


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
