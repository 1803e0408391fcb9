"""An actor's resident memory over a run: does it stay flat, as the run goes on?

Not a test: it prints figures and asserts nothing. Each configuration runs in a fresh process: the
``CpuEngine`` with SmolLM2-135M in bf16 (as ``configs/smollm2_babyai_goto.yaml`` serves it) plays
rounds of 8 concurrent BabyAI episodes (one task a round, 3-turn cap, 64 new tokens a turn at
temperature 0.7, the env in process: ``actor_bench.InProcessEnvClient``) and is staged new weights
after each round, as the learner sends them; the process's resident memory is read after every round.

- as shipped: the engine hands the heap's freed memory back to the OS at most every 30 s
  (``common/heap.py``);
- the baseline: the same, with the heap never trimmed (``heap_trim_interval_s=None``).

Rows: each one's growth (the most resident memory read after a round of the run's second half over
the most of its first half, when the engine's buffers and prefix cache have reached their size: a
peak, as memory moves by ~10 % from round to round; goal <= 1.1 as shipped), and the round time as
shipped over the baseline's (what trimming costs).

    .venv/bin/python -m tests.bench.actor_memory_bench [--quick] [--rounds 8] [--json PATH]

``--quick``: 4 rounds (about 6 minutes in all); the default 8 (about 10).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.run_all import BENCH_ENV, REPO, write_json

ENV_ID = "babyai-v0"
EPISODES_PER_ROUND = 8
TURN_CAP = 3
NEW_TOKENS = 64
CONFIGS = {"as shipped": 30.0, "heap never trimmed": None}
"""Configuration -> the engine's ``heap_trim_interval_s``."""
GOAL = "<= 1.1"


def resident_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


async def measure(trim_interval_s: float | None, rounds: int, cache_dir: str | None) -> dict:
    """This process's resident memory and wall time per round (the ``--point`` run)."""
    import torch

    from actors.conversation import ConversationStarts
    from actors.cpu_engine import CpuEngine
    from actors.engine_api import SamplingParams
    from actors.episode import EpisodeDeps, run_episode
    from common.models import load_model, load_tokenizer, resolve_model
    from common.protocol import TaskLease
    from tests.bench.actor_bench import InProcessEnvClient

    torch.set_num_threads(2)
    path = resolve_model("smollm2-135m", cache_dir or "")
    tokenizer, model = load_tokenizer(path), load_model(path, "bfloat16")
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    engine = CpuEngine(model, max_batch_size=EPISODES_PER_ROUND, heap_trim_interval_s=trim_interval_s)
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
    return {"resident_mb": resident, "round_s": seconds, "trims": engine.heap.trims}


def run_point(name: str, rounds: int, cache_dir: str | None) -> dict:
    command = [sys.executable, "-m", "tests.bench.actor_memory_bench", "--point", name, "--rounds", str(rounds)]
    if cache_dir:
        command += ["--cache-dir", cache_dir]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, **BENCH_ENV},
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{name}: exit {done.returncode}: {done.stderr.strip().splitlines()[-3:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows_of(results: dict[str, dict]) -> list[tuple]:
    shipped, never = results["as shipped"], results["heap never trimmed"]
    rounds = len(shipped["resident_mb"])

    middle = rounds // 2

    def growth(r: dict) -> float:
        return max(r["resident_mb"][middle:]) / max(r["resident_mb"][:middle])

    def memory(r: dict) -> str:
        return (f"at most {max(r['resident_mb'][middle:]):.0f} MB after rounds {middle + 1}-{rounds}, "
                f"{max(r['resident_mb'][:middle]):.0f} after rounds 1-{middle}")

    shipped_s, never_s = (sum(r["round_s"]) / rounds for r in (shipped, never))
    return [
        (f"SmolLM2 engine, {rounds} rounds of {EPISODES_PER_ROUND} BabyAI episodes, new weights after each: "
         f"resident memory as shipped ({shipped['trims']} heap trims)", memory(shipped), "x the first half's",
         growth(shipped), GOAL),
        ("the same, heap never trimmed", memory(never), "x the first half's", growth(never), ""),
        ("round time as shipped", f"{shipped_s:.1f} s", f"heap never trimmed {never_s:.1f} s", shipped_s / never_s, ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--cache-dir")
    parser.add_argument("--json")
    parser.add_argument("--point", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    rounds = args.rounds or (4 if args.quick else 8)
    if rounds < 2:
        parser.error("--rounds must be at least 2 (growth is measured over the second half)")
    if args.point:
        print(json.dumps(asyncio.run(measure(CONFIGS[args.point], rounds, args.cache_dir))))
        return
    results = {name: run_point(name, rounds, args.cache_dir) for name in CONFIGS}
    rows = rows_of(results)
    for figure, value, baseline, ratio, goal in rows:
        print(f"{figure}: {value} | {baseline} | {ratio:.2f} {goal}")
    for name, result in results.items():
        print(f"  {name}: resident MB per round {[round(x) for x in result['resident_mb']]}")
    write_json(args.json, "actor_memory_bench", rows)


if __name__ == "__main__":
    main()
