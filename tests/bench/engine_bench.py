"""CpuEngine throughput at 1, 8 and 64 concurrent clients, as ratios against 1 client.

Not a test: it prints figures and asserts nothing. On the tiny model (``resolve_model("tiny")``):

- burst: N requests submitted at once, all of the same length (one batch from start to end);
- closed loop: N clients, each sending its next request as soon as the last one is answered,
  with mixed lengths (8 to 64 new tokens), so requests join and leave the running batch all
  the time (what continuous batching is for; a wave-batched engine makes short requests wait
  for the longest of their wave);
- multi-turn: the closed loop again, but each client's next prompt extends its previous one
  (prompt + sampled tokens + 24 new tokens), with and without the prefix cache.

The best of a few rounds counts. Run from the repo root:

    .venv/bin/python -m tests.bench.engine_bench [--torch-threads 1] [--rounds 2] [--quick] [--json PATH]

``--quick``: one round per level; ``--json PATH`` also writes the ratios (8 and 64 clients against 1)
as JSON for tests/bench/run_all.py.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
import time
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import uvloop

from actors.cpu_engine import CpuEngine, SamplingParams
from common.models import load_model, resolve_model
from common.paths import default_cache_dir
from tests.bench.run_all import write_json

CONCURRENCY_LEVELS = (1, 8, 64)
PROMPT_TOKENS = 16
BURST_NEW_TOKENS = 64
MIXED_NEW_TOKENS = (8, 64, 16, 32)
TOKENS_PER_CLIENT = 192
"""Closed loop: each client stops after sampling at least this many tokens."""
TURN_DELTA_TOKENS = 24
VOCAB = 500


def prompt_of(client: int, length: int) -> list[int]:
    return [(7 * client + j) % VOCAB for j in range(length)]


async def burst(engine: CpuEngine, concurrency: int) -> int:
    params = SamplingParams(max_new_tokens=BURST_NEW_TOKENS)
    prompts = [prompt_of(i, PROMPT_TOKENS) for i in range(concurrency)]
    generations = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    return sum(len(g.token_ids) for g in generations)


async def closed_loop(engine: CpuEngine, concurrency: int, multi_turn: bool = False) -> int:
    async def client(index: int) -> int:
        sampled, prompt = 0, prompt_of(index, PROMPT_TOKENS)
        lengths = itertools.cycle(MIXED_NEW_TOKENS[index % len(MIXED_NEW_TOKENS):] + MIXED_NEW_TOKENS)
        while sampled < TOKENS_PER_CLIENT:
            generation = await engine.generate(prompt, SamplingParams(max_new_tokens=next(lengths)))
            sampled += len(generation.token_ids)
            if multi_turn:
                prompt = prompt + generation.token_ids + prompt_of(index + sampled, TURN_DELTA_TOKENS)
        return sampled

    return sum(await asyncio.gather(*(client(i) for i in range(concurrency))))


async def best_rate(run, engine: CpuEngine, concurrency: int, rounds: int) -> tuple[float, float]:
    """Best tokens/s over the rounds, and the engine's CPU microseconds per token over all of them."""
    best, tokens_total, cpu_before = 0.0, 0, engine.busy_cpu_s
    for _ in range(rounds):
        started_s = time.perf_counter()
        tokens = await run(engine, concurrency)
        best = max(best, tokens / (time.perf_counter() - started_s))
        tokens_total += tokens
    return best, 1e6 * (engine.busy_cpu_s - cpu_before) / tokens_total


async def measure(model: torch.nn.Module, rounds: int) -> dict[str, dict[int, tuple[float, float]]]:
    engines = {"reuse": CpuEngine(model, max_batch_size=max(CONCURRENCY_LEVELS)),
               "no_reuse": CpuEngine(model, max_batch_size=max(CONCURRENCY_LEVELS), max_cached_prefix_tokens=0)}
    for engine in engines.values():
        engine.start()
    try:
        await burst(engines["reuse"], 1)  # warm-up
        scenarios = {
            "burst": (burst, engines["reuse"]),
            "closed loop, mixed lengths": (closed_loop, engines["reuse"]),
            "multi-turn, prefix cache": (lambda e, n: closed_loop(e, n, multi_turn=True), engines["reuse"]),
            "multi-turn, no prefix cache": (lambda e, n: closed_loop(e, n, multi_turn=True), engines["no_reuse"]),
        }
        return {name: {n: await best_rate(run, engine, n, rounds) for n in CONCURRENCY_LEVELS}
                for name, (run, engine) in scenarios.items()}
    finally:
        for engine in engines.values():
            engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--rounds", type=int, help="rounds per concurrency level (default 2, --quick 1)")
    parser.add_argument("--quick", action="store_true", help="one round per concurrency level")
    parser.add_argument("--json", metavar="PATH", help="also write the ratios as JSON (for run_all.py)")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 2)
    torch.set_num_threads(args.torch_threads)
    model = load_model(resolve_model("tiny", default_cache_dir()), "float32")
    rates = uvloop.run(measure(model, args.rounds))
    json_rows = []
    print(f"tiny model float32, torch threads {torch.get_num_threads()}, prompt {PROMPT_TOKENS} tokens; "
          f"engine CPU per token is robust to other load on the machine, tokens/s is not")
    for name, by_concurrency in rates.items():
        baseline = by_concurrency[CONCURRENCY_LEVELS[0]][0]
        figures = "   ".join(f"{n:>2} clients {rate:6.0f} tokens/s x{rate / baseline:5.2f} ({cpu_us:4.0f} us CPU/token)"
                               for n, (rate, cpu_us) in by_concurrency.items())
        print(f"{name:<28} {figures}")
        json_rows += [(f"{name}, {n} clients", f"{rate:.0f} tokens/s, {cpu_us:.0f} us CPU/token",
                       f"1 client {baseline:.0f} tokens/s", rate / baseline, "")
                      for n, (rate, cpu_us) in by_concurrency.items() if n != CONCURRENCY_LEVELS[0]]
    write_json(args.json, "engine_bench", json_rows)


if __name__ == "__main__":
    main()
