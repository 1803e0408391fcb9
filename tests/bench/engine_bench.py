"""CpuEngine throughput at 1, 8 and 32 concurrent requests, as ratios against 1 request.

Not a test: it prints figures and asserts nothing. Each concurrency level runs a few
rounds of N concurrent generate() calls on the tiny random Qwen2 model; the best round
counts. Run from the repo root:

    .venv/bin/python -m tests.bench.engine_bench [--torch-threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch
import uvloop
from transformers import Qwen2Config, Qwen2ForCausalLM

from actors.engine import CpuEngine, SamplingParams

CONCURRENCY_LEVELS = (1, 8, 32)
PROMPT_TOKENS = 16
NEW_TOKENS = 64


def tiny_model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).float().eval()


async def tokens_per_s(engine: CpuEngine, concurrency: int, rounds: int) -> float:
    """Best generated-tokens-per-second over `rounds` rounds of `concurrency` requests."""
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    best = 0.0
    for _ in range(rounds):
        prompts = [[(7 * i + j) % 300 for j in range(PROMPT_TOKENS)] for i in range(concurrency)]
        start_s = time.perf_counter()
        generations = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        elapsed_s = time.perf_counter() - start_s
        best = max(best, sum(len(g.token_ids) for g in generations) / elapsed_s)
    return best


async def main(rounds: int) -> None:
    engine = CpuEngine(tiny_model(), max_batch_size=max(CONCURRENCY_LEVELS))
    engine.start()
    try:
        await tokens_per_s(engine, 1, 1)  # warm-up
        rates = {n: await tokens_per_s(engine, n, rounds) for n in CONCURRENCY_LEVELS}
    finally:
        engine.stop()
    baseline = rates[CONCURRENCY_LEVELS[0]]
    print(f"torch threads {torch.get_num_threads()}, prompt {PROMPT_TOKENS}, new tokens {NEW_TOKENS}")
    for n, rate in rates.items():
        print(f"concurrency {n:>3}: {rate:9.0f} tokens/s  x{rate / baseline:5.2f} vs 1 request")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per concurrency level")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    uvloop.run(main(args.rounds))
