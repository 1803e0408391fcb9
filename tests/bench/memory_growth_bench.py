"""Resident memory over a run, actor and learner: does it stay flat as the run goes on?

Not a test: it prints figures and asserts nothing. Each configuration runs in a fresh process with
SmolLM2-135M, the model of ``configs/smollm2_babyai_goto.yaml``, and reads its resident memory
after every round (actor) or step (learner):

(a) actor: the ``CpuEngine`` (bf16) plays rounds of 8 concurrent BabyAI episodes (one task a round,
    as a lease's group; 3-turn cap, 64 new tokens a turn at temperature 0.7, the env in process:
    ``actor_bench.InProcessEnvClient``) and is staged new weights after each round, as the learner
    sends them. As shipped the engine hands the heap's freed memory back to the OS at most every
    30 s (``common/heap.py``); the baseline never does (``heap_trim_interval_s=None``).
(b) learner: ``ShardedPolicy.train`` (one rank, that config's learner settings: bf16 compute over
    float32 masters, 2,048-token micro-batches) on batches of two episodes of 300-1,800 tokens,
    lengths drawn anew every step. As shipped it trims the heap after every step; the baseline is
    the same with ``learner.policy.trim_heap`` made a no-op.

(c) why forward widths are rounded (``learner.width_multiple``, the engine's ``prefill_width``): one
    bf16 ``linear`` (576 -> 1,536, a SmolLM2 MLP's) over 1,200 inputs of 300-1,800 rows, a new row
    count nearly every call, against the same 1,200 calls all of one row count, and against the same
    row counts rounded up to ``learner.width_multiple`` (64), as the learner pads them; resident memory grown, and the
    time of each.

Rows of (a) and (b): each configuration's growth (the most resident memory read in the run's second half
over the most of its first half, once buffers, caches and optimizer state have their size: a peak,
as memory moves by ~10 % from one reading to the next; goal <= 1.1 as shipped), and the time per
round or step as shipped over the baseline's (what trimming costs).

    .venv/bin/python -m tests.bench.memory_growth_bench [--quick] [--rounds 8] [--json PATH]

``--quick``: 4 rounds and steps (about 8 minutes in all); the default 8 (about 15).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.learner_memory_bench import _memory_kib
from tests.bench.run_all import BENCH_ENV, REPO, write_json

MODEL = "smollm2-135m"
CONFIG = REPO / "configs" / "smollm2_babyai_goto.yaml"
ENV_ID = "babyai-v0"
EPISODES_PER_ROUND = 8
TURN_CAP = 3
NEW_TOKENS = 64
EPISODE_TOKENS = (300, 1800)
"""The learner's episodes: lengths drawn from this range, two a batch."""
SHIPPED, BASELINE = "as shipped", "heap never trimmed"
GOAL = "<= 1.1"


def resident_mb() -> float:
    return _memory_kib("VmRSS") / 1024


# ----------------------------------------------------------------------------- (a) actor


async def actor_rounds(trimmed: bool, rounds: int, cache_dir: str) -> dict:
    import torch

    from actors.conversation import ConversationStarts
    from actors.cpu_engine import CpuEngine
    from actors.engine_api import SamplingParams
    from actors.episode import EpisodeDeps, run_episode
    from common.models import load_model, load_tokenizer, resolve_model
    from common.protocol import TaskLease
    from tests.bench.actor_bench import InProcessEnvClient

    torch.set_num_threads(2)
    path = resolve_model(MODEL, cache_dir)
    tokenizer, model = load_tokenizer(path), load_model(path, "bfloat16")
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    engine = CpuEngine(model, max_batch_size=EPISODES_PER_ROUND, heap_trim_interval_s=30.0 if trimmed else None)
    env = InProcessEnvClient()
    deps = EpisodeDeps(0, engine, env, tokenizer, SamplingParams(NEW_TOKENS, 0.7, (tokenizer.eos_token_id,)), None,
                       ConversationStarts(env, lambda env_id: (True, 1)))
    engine.start()
    resident, seconds = [], []
    try:
        for round_index in range(rounds):
            started_s = time.perf_counter()
            lease = TaskLease(lease_id=f"round-{round_index}", group_id=f"round-{round_index}", env_id=ENV_ID,
                              task_id=str(round_index), seed=round_index, group_size=EPISODES_PER_ROUND,
                              turn_cap=TURN_CAP, max_episode_tokens=8192, policy_version=round_index,
                              deadline_unix_s=time.time() + 3600)
            episodes = await asyncio.gather(*(run_episode(lease, i, deps) for i in range(EPISODES_PER_ROUND)))
            if failed := [e.error or e.status for e in episodes if e.status != "ok"]:
                raise RuntimeError(f"{len(failed)} episodes failed, e.g. {failed[0]}")
            # New weights (a small step away), as the learner's next version: the engine re-prefills.
            engine.stage_weights({n: w + 1e-4 * torch.randn_like(w) for n, w in weights.items()}, round_index + 1)
            seconds.append(time.perf_counter() - started_s)
            resident.append(resident_mb())
    finally:
        engine.stop()
    return {"resident_mb": resident, "seconds": seconds, "trims": engine.heap.trims}


# ----------------------------------------------------------------------------- (b) learner


def learner_steps(trimmed: bool, steps: int, cache_dir: str) -> dict:
    import torch

    import learner.policy
    from common.config import load_config
    from common.models import resolve_model
    from common.net import free_port
    from learner.model import init_process_group
    from learner.policy import ShardedPolicy
    from tests.bench.learner_memory_bench import _batch

    cfg = load_config(CONFIG)
    torch.set_num_threads(cfg.learner.torch_threads)
    trims, trim_heap = [], learner.policy.trim_heap

    def counted_trim() -> bool:  # the baseline's is a no-op
        trims.append(trimmed)
        return trimmed and trim_heap()

    learner.policy.trim_heap = counted_trim
    init_process_group(0, 1, "127.0.0.1", free_port())
    path = resolve_model(MODEL, cache_dir)
    policy = ShardedPolicy(cfg, str(path))
    vocab = policy.vocab_size
    lengths = random.Random(0)
    resident, seconds = [], []
    for step in range(steps):
        batch = _batch(tuple(lengths.randint(*EPISODE_TOKENS) for _ in range(2)), vocab, seed=step)
        started_s = time.perf_counter()
        policy.train(batch)
        seconds.append(time.perf_counter() - started_s)
        del batch
        resident.append(resident_mb())
    return {"resident_mb": resident, "seconds": seconds, "trims": sum(trims)}


# ----------------------------------------------------------------------------- (c) shapes


def bf16_linear_growth(calls: int = 1200) -> dict:
    """Resident MB grown and seconds over ``calls`` bf16 linears of one row count, of varying ones, and of
    those rounded up to a multiple of ``learner.width_multiple``'s default, as the learner pads them."""
    import torch

    from common.config.learner import LearnerConfig
    from learner.batching import round_up

    torch.set_num_threads(2)
    weight = torch.randn(1536, 576, dtype=torch.bfloat16)
    sizes = random.Random(0).choices(range(EPISODE_TOKENS[0], EPISODE_TOKENS[1] + 1), k=calls)
    result = {}
    multiple = LearnerConfig().width_multiple
    rounded = [round_up(m, multiple) for m in sizes]
    # Rounded before varying: the varying calls would have made many of the rounded counts already.
    for name, rows in (("one row count", [1000] * calls), ("rounded", rounded), ("varying row counts", sizes)):
        started_mb, started_s = resident_mb(), time.perf_counter()
        for m in rows:
            torch.nn.functional.linear(torch.randn(m, 576, dtype=torch.bfloat16), weight)
        result[name] = {"grown_mb": resident_mb() - started_mb, "seconds": time.perf_counter() - started_s,
                        "shapes": len(set(rows)), "multiple": multiple}
    return result


# ----------------------------------------------------------------------------- the two configurations


def run_point(part: str, config: str, count: int, cache_dir: str) -> dict:
    command = [sys.executable, "-m", "tests.bench.memory_growth_bench", "--point", part, config,
               "--rounds", str(count), "--cache-dir", cache_dir]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, **BENCH_ENV}, capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise RuntimeError(f"{part}, {config}: exit {done.returncode}: {done.stderr.strip().splitlines()[-3:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows_of(part: str, what: str, unit: str, results: dict[str, dict]) -> list[tuple]:
    shipped, baseline = results[SHIPPED], results[BASELINE]
    count = len(shipped["resident_mb"])
    middle = count // 2

    def growth(r: dict) -> float:
        return max(r["resident_mb"][middle:]) / max(r["resident_mb"][:middle])

    def memory(r: dict) -> str:
        return (f"at most {max(r['resident_mb'][middle:]):.0f} MB after {unit}s {middle + 1}-{count}, "
                f"{max(r['resident_mb'][:middle]):.0f} after {unit}s 1-{middle}")

    shipped_s, baseline_s = (sum(r["seconds"]) / count for r in (shipped, baseline))
    return [
        (f"({part}) {what}: resident memory as shipped ({shipped['trims']} heap trims)", memory(shipped),
         "x the first half's", growth(shipped), GOAL),
        (f"({part}) the same, {BASELINE}", memory(baseline), "x the first half's", growth(baseline), ""),
        (f"({part}) time per {unit} as shipped", f"{shipped_s:.1f} s", f"{BASELINE} {baseline_s:.1f} s",
         shipped_s / baseline_s, ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, help="actor rounds and learner steps (default 8, --quick 4)")
    parser.add_argument("--cache-dir", default="", help="model cache (default: the project's)")
    parser.add_argument("--json")
    parser.add_argument("--point", nargs=2, metavar=("PART", "CONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    count = args.rounds or (4 if args.quick else 8)
    if count < 2:
        parser.error("--rounds must be at least 2 (growth is measured over the second half)")
    if args.point:
        part, config = args.point
        trimmed = config == SHIPPED
        result = (asyncio.run(actor_rounds(trimmed, count, args.cache_dir)) if part == "a"
                  else learner_steps(trimmed, count, args.cache_dir) if part == "b" else bf16_linear_growth())
        print(json.dumps(result))
        return
    rows = []
    for part, what, unit in (("a", f"actor engine, {EPISODES_PER_ROUND} BabyAI episodes a round, new weights after "
                                   "each", "round"),
                             ("b", "learner, a batch of 2 episodes a step", "step")):
        results = {config: run_point(part, config, count, args.cache_dir) for config in (SHIPPED, BASELINE)}
        rows += rows_of(part, what, unit, results)
        for config, result in results.items():
            print(f"  ({part}) {config}: resident MB per {unit} {[round(x) for x in result['resident_mb']]}, "
                  f"s per {unit} {[round(x, 1) for x in result['seconds']]}", flush=True)
    shapes = run_point("c", SHIPPED, count, args.cache_dir)
    one, varying = shapes["one row count"], shapes["varying row counts"]
    rows.append((f"(c) bf16 linear 576 -> 1536, {varying['shapes']} row counts in 1,200 calls: resident memory grown",
                 f"{varying['grown_mb']:.0f} MB in {varying['seconds']:.1f} s",
                 f"one row count {one['grown_mb']:.0f} MB in {one['seconds']:.1f} s",
                 varying["grown_mb"] / max(one["grown_mb"], 1.0), ""))
    rounded = shapes["rounded"]
    rows.append((f"(c) the same rounded up to a multiple of {rounded['multiple']} ({rounded['shapes']} row counts), "
                 "as the learner pads them", f"{rounded['grown_mb']:.0f} MB in {rounded['seconds']:.1f} s",
                 f"one row count {one['grown_mb']:.0f} MB", rounded["grown_mb"] / max(one["grown_mb"], 1.0), ""))
    for figure, value, baseline, ratio, goal in rows:
        print(f"{figure}: {value} | {baseline} | {ratio:.2f} {goal}")
    write_json(args.json, "memory_growth_bench", rows)


if __name__ == "__main__":
    main()
