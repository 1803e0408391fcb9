"""Peak memory of one learner train step against episode length and vocabulary: chunked logprobs
(``learner/logprobs.py``) against full logits.

Not a test: it prints a table and the fitted growth, each figure against a baseline measured in
the same run, and asserts nothing.

For every point (tokens of one episode x vocabulary size) and each logprob path, a fresh
subprocess (so no point inherits another's heap):
1. loads a Qwen2 with that vocabulary, hidden size 64 and one decoder layer (float32, tied
   embeddings), sharded with FSDP2 over a one-rank gloo group, as ``learner.train_step.Trainer``
   with the default algorithm (GRPO, decoupled PPO-clip; entropy only as a metric);
2. warms up with one step on a short batch, so AdamW's state exists;
3. resets the peak resident set size (``/proc/self/clear_refs``), runs one step on a group of two
   episodes, one of ``tokens`` tokens and one of 256 (multi-turn layout, about 38% assistant
   tokens; ``micro_batch_tokens`` = ``tokens``, so the long episode runs alone), and reports the
   peak minus the resident size before the step.
Before: ``learner.logprob_chunk_tokens: 0``, the [B, T, V] logits and their float32 log-softmax
(and entropy) copies. After: the LM head on loss positions only, in chunks of the default 1024
tokens (``--quick``: 64, so that its short episodes span several chunks too).
A "before" point whose estimated peak exceeds 70% of the available memory (shared by the
``--jobs`` points measured at once) is left out.
Fit: least squares ``peak = a + b * tokens`` per path and vocabulary; ``b`` in bytes per token,
and how ``b`` grows with the vocabulary (bytes per token per vocabulary entry). "After" is fitted
on the points whose loss tokens fill at least one chunk: below that its logits memory still grows
with the tokens, up to one chunk's, and then stays.

    .venv/bin/python -m tests.bench.learner_memory_bench [--quick] [--jobs 2] [--json PATH]

``--quick``: 256 and 512 tokens (well under a minute on 2 cores). ``--json PATH`` also writes the
ratios for tests/bench/run_all.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

VOCABS = (32_000, 152_064)
"""A Llama-2-sized and a Qwen2-sized vocabulary."""
FULL_TOKENS = (2048, 4096, 8192, 16384)
QUICK_TOKENS = (256, 512)
CHUNK_TOKENS = 1024
"""``learner.logprob_chunk_tokens`` of the "after" path: the default."""
QUICK_CHUNK_TOKENS = 64
"""``--quick``'s: small enough that its short episodes still span several chunks."""
SHORT_TOKENS = 256
"""The other episode of the group, and the warm-up batch."""
PROMPT_TOKENS, ASSISTANT_TOKENS, OBSERVATION_TOKENS = 48, 24, 40
"""Layout of an episode, as tests/bench/learner_bench.py: prompt, then assistant turns and env
observations taking turns."""
FULL_LOGITS_COPIES = 4.5
"""Float32 [T, V] tensors the full-logits path holds at its peak, for the skip estimate (measured:
16 bytes per token per vocabulary entry, i.e. 4, plus a margin)."""
REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- one point (subprocess)


def _memory_kib(field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+)", Path("/proc/self/status").read_text(), re.MULTILINE).group(1))


def _batch(lengths: tuple[int, ...], vocab: int, seed: int):
    import torch

    from learner.batching import Batch

    width = max(lengths)
    generator = torch.Generator().manual_seed(seed)
    positions = torch.arange(width)
    attention = (positions[None, :] < torch.tensor(lengths)[:, None]).long()
    turn_position = (positions - PROMPT_TOKENS) % (ASSISTANT_TOKENS + OBSERVATION_TOKENS)
    assistant = (positions >= PROMPT_TOKENS) & (turn_position < ASSISTANT_TOKENS)
    loss_mask = (assistant[None, :] & attention.bool()).float()
    token_ids = torch.randint(0, vocab, (len(lengths), width), generator=generator) * attention
    behavior = -torch.rand(len(lengths), width, generator=generator).mul(2.5).add(0.5) * loss_mask
    return Batch(token_ids=token_ids, attention_mask=attention, loss_mask=loss_mask, behavior_logprobs=behavior,
                 token_versions=torch.where(loss_mask.bool(), 0, -1), rewards=torch.tensor([1.0, 0.0]),
                 group_index=torch.zeros(len(lengths), dtype=torch.long), episodes=[])


def measure_point(model_dir: str, tokens: int, vocab: int, chunk_tokens: int) -> dict:
    """Peak memory (bytes) and wall time of one train step; runs in its own process."""
    import torch
    import torch.distributed as dist
    from transformers.utils import logging as transformers_logging

    from common.config.learner import LearnerConfig
    from common.net import free_port
    from learner.model import init_process_group
    from learner.train_step import Trainer

    torch.set_num_threads(1)
    transformers_logging.disable_progress_bar()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    init_process_group(0, 1, "127.0.0.1", free_port())
    cfg = LearnerConfig(micro_batch_tokens=tokens, logprob_chunk_tokens=chunk_tokens)
    trainer = Trainer.build(model_dir, "float32", cfg, temperature=1.0)
    trainer.step(_batch((SHORT_TOKENS, SHORT_TOKENS), vocab, seed=1))
    batch = _batch((tokens, SHORT_TOKENS), vocab, seed=0)
    gc.collect()
    before_kib = _memory_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    started = time.perf_counter()
    trainer.step(batch)
    step_s = time.perf_counter() - started
    peak_kib = _memory_kib("VmHWM")
    dist.destroy_process_group()
    return {"tokens": tokens, "vocab": vocab, "chunk_tokens": chunk_tokens,
            "loss_tokens": int(batch.loss_mask[0].sum()), "peak_bytes": (peak_kib - before_kib) * 1024,
            "step_s": step_s}


# ----------------------------------------------------------------------------- the sweep


def build_model(vocab: int, max_tokens: int, out_dir: Path) -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=vocab, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=128, max_position_embeddings=max_tokens,
                         tie_word_embeddings=True, dtype="float32")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Qwen2ForCausalLM(config).save_pretrained(out_dir)
    return str(out_dir)


def run_point(model_dir: str, tokens: int, vocab: int, chunk_tokens: int) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    command = [sys.executable, "-m", "tests.bench.learner_memory_bench", "--point", model_dir, str(tokens),
               str(vocab), str(chunk_tokens)]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " / ".join(line for line in proc.stderr.strip().splitlines()[-2:])
        return {"tokens": tokens, "vocab": vocab, "chunk_tokens": chunk_tokens,
                "failed": f"exit code {proc.returncode}: {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def available_bytes() -> int:
    return int(re.search(r"^MemAvailable:\s+(\d+)", Path("/proc/meminfo").read_text(), re.MULTILINE).group(1)) * 1024


def fit(points: list[dict]) -> tuple[float, float]:
    """Least-squares (intercept bytes, bytes per token) of peak against tokens."""
    xs, ys = [p["tokens"] for p in points], [p["peak_bytes"] for p in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread if spread else float("nan")
    return mean_y - slope * mean_x, slope


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--point":
        model_dir, tokens, vocab, chunk = sys.argv[2], *map(int, sys.argv[3:6])
        print(json.dumps(measure_point(model_dir, tokens, vocab, chunk)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="256 and 512 tokens only (well under a minute)")
    parser.add_argument("--jobs", type=int, default=2, help="points measured at once (each its own process)")
    parser.add_argument("--json", metavar="PATH", help="also write the ratios as JSON (for run_all.py)")
    args = parser.parse_args()
    lengths, chunk_tokens = (QUICK_TOKENS, QUICK_CHUNK_TOKENS) if args.quick else (FULL_TOKENS, CHUNK_TOKENS)
    budget = 0.7 * available_bytes() / max(1, args.jobs)
    with tempfile.TemporaryDirectory() as tmp:
        models = {vocab: build_model(vocab, max(lengths), Path(tmp) / f"v{vocab}") for vocab in VOCABS}
        todo, skipped = [], []
        for vocab in VOCABS:
            for tokens in lengths:
                todo.append((models[vocab], tokens, vocab, chunk_tokens))
                if FULL_LOGITS_COPIES * 4 * tokens * vocab < budget:
                    todo.append((models[vocab], tokens, vocab, 0))
                else:
                    skipped.append((tokens, vocab))
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            results = list(pool.map(lambda point: run_point(*point), todo))
    report(results, skipped, lengths, chunk_tokens, args.json)


def report(results: list[dict], skipped: list[tuple[int, int]], lengths: tuple[int, ...], chunk_tokens: int,
           json_path: str | None) -> None:
    from tests.bench.run_all import write_json

    by_key = {(r["tokens"], r["vocab"], r["chunk_tokens"] > 0): r for r in results}
    mib = lambda r: "skipped" if r is None else r.get("failed") or f"{r['peak_bytes'] / 2**20:.0f}"  # noqa: E731
    table = [("tokens", "vocab", "loss tokens", "before peak MiB", "after peak MiB", "after / before",
              "before step s", "after step s")]
    for vocab in VOCABS:
        for tokens in lengths:
            before, after = by_key.get((tokens, vocab, False)), by_key.get((tokens, vocab, True))
            ok = before and after and "failed" not in before and "failed" not in after
            table.append((tokens, vocab, after.get("loss_tokens", "") if after else "", mib(before), mib(after),
                          f"{after['peak_bytes'] / before['peak_bytes']:.3f}" if ok else "",
                          f"{before['step_s']:.2f}" if before and "step_s" in before else "",
                          f"{after['step_s']:.2f}" if after and "step_s" in after else ""))
    print(f"peak resident memory of one train step above the resident size before it (fresh process per point; "
          f"hidden 64, 1 layer, float32, CPU); after = chunks of {chunk_tokens} tokens")
    print_table(table)
    if skipped:
        print("before left out (estimated peak over 70% of available memory / jobs): "
              + ", ".join(f"{t} tokens x {v}" for t, v in skipped))
    print("\nfitted growth, peak = a + b * tokens:")
    slopes, rows = {}, []
    for vocab in VOCABS:
        for path in (False, True):
            points = [r for r in results if r["vocab"] == vocab and (r["chunk_tokens"] > 0) == path
                      and "failed" not in r and (not path or r["loss_tokens"] >= chunk_tokens)]
            if len(points) >= 2:
                intercept, slope = fit(points)
                slopes[vocab, path] = slope
                print(f"  vocab {vocab:>7} {'after ' if path else 'before'}: b = {slope:10.0f} bytes/token "
                      f"({slope / vocab:.2f} bytes/token per vocabulary entry), a = {intercept / 2**20:.0f} MiB, "
                      f"from {len(points)} points")
        if (vocab, False) in slopes and (vocab, True) in slopes:
            before, after = slopes[vocab, False], slopes[vocab, True]
            rows.append((f"train-step peak memory growth, vocab {vocab}", f"{after:.0f} bytes/token",
                         f"full logits {before:.0f} bytes/token", after / before, "<= 0.25"))
    small, large = VOCABS
    for path in (False, True):
        if (small, path) in slopes and (large, path) in slopes:
            per_entry = (slopes[large, path] - slopes[small, path]) / (large - small)
            print(f"  {'after ' if path else 'before'}: vocabulary {small} -> {large} multiplies b by "
                  f"{slopes[large, path] / slopes[small, path]:.2f} ({per_entry:.2f} bytes/token per added entry)")
    largest = [(t, v) for v in VOCABS for t in lengths if (t, v, False) in by_key and (t, v, True) in by_key
               and "failed" not in by_key[t, v, False] and "failed" not in by_key[t, v, True]]
    if largest:
        tokens, vocab = max(largest, key=lambda tv: tv[0] * tv[1])
        before, after = by_key[tokens, vocab, False], by_key[tokens, vocab, True]
        rows.append((f"train-step peak memory, {tokens} tokens x vocab {vocab}",
                     f"{after['peak_bytes'] / 2**20:.0f} MiB", f"full logits {before['peak_bytes'] / 2**20:.0f} MiB",
                     after["peak_bytes"] / before["peak_bytes"], "<= 0.25"))
    write_json(json_path, "learner_memory_bench", rows)


def print_table(rows: list[tuple]) -> None:
    lines = [tuple(str(cell) for cell in row) for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


if __name__ == "__main__":
    main()
