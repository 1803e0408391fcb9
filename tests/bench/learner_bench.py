"""The learner's train step against a plain PyTorch training loop: tokens/s, same model, same batch.

Not a test: it prints one table of figures, each as a ratio against a baseline measured in the
same run, and asserts nothing.

For each model (tiny; SmolLM2-135M unless ``--quick``), on one synthetic multi-turn batch:
- ours: ``learner.policy.ShardedPolicy.train`` with the default ``learner`` config: FSDP2 over a
  one-rank gloo group, GRPO advantages, decoupled PPO-clip with the truncated importance weight,
  entropy and clip statistics, gradient clipping, AdamW;
- plain: ``AutoModelForCausalLM`` without FSDP: forward, token logprobs by log_softmax + gather,
  advantage-weighted mean over the loss mask, backward, gradient clipping, AdamW step.

The batch is what actors send: each row a prompt, then assistant turns (loss mask 1) and env
observations (loss mask 0) taking turns, right-padded to ragged lengths, rows in GRPO groups of 4
with mixed rewards. Steps of the two alternate, so machine load hits both alike; after one warm-up
step each, the median step time counts. Tokens/s counts the real (unpadded) tokens. The ratio is
also given in process CPU time, which other processes competing for the cores disturb less.

    .venv/bin/python -m tests.bench.learner_bench [--quick] [--torch-threads 2] [--json PATH]

``--json PATH`` also writes the ratios (wall and CPU time) as JSON for tests/bench/run_all.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.utils import logging as transformers_logging

from common.config import load_config
from common.models import resolve_model
from common.net import free_port
from common.paths import default_cache_dir
from learner.batching import Batch
from learner.model import init_process_group
from learner.policy import ShardedPolicy
from tests.bench.run_all import write_json

PROMPT_TOKENS = 48
"""System prompt and first observation of every row (loss mask 0)."""
ASSISTANT_TOKENS = 24
"""One assistant turn (loss mask 1); the smoke config's max_new_tokens is 12, the default's 24."""
OBSERVATION_TOKENS = 40
"""One env observation between assistant turns (loss mask 0)."""
GROUP_SIZE = 4


@dataclass(frozen=True)
class Case:
    """One model and the batch shape it is timed on."""

    model: str
    rows: int
    width: int
    timed_steps: int


QUICK = [Case("tiny", 8, 256, 3)]
FULL = [Case("tiny", 16, 512, 3), Case("smollm2-135m", 4, 128, 2)]


def synthetic_batch(rows: int, width: int, vocab_size: int, seed: int = 0) -> Batch:
    """A right-padded multi-turn batch: ragged lengths, loss mask on assistant turns only."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([width - (row % GROUP_SIZE) * width // 8 for row in range(rows)])
    positions = torch.arange(width)
    attention = (positions[None, :] < lengths[:, None]).long()
    turn_position = (positions - PROMPT_TOKENS) % (ASSISTANT_TOKENS + OBSERVATION_TOKENS)
    assistant = (positions >= PROMPT_TOKENS) & (turn_position < ASSISTANT_TOKENS)
    loss_mask = (assistant[None, :] & attention.bool()).float()
    token_ids = torch.randint(0, vocab_size, (rows, width), generator=generator) * attention
    behavior = -torch.rand(rows, width, generator=generator).mul(2.5).add(0.5) * loss_mask
    rewards = torch.tensor([float(row % 3 == 0) for row in range(rows)])
    return Batch(token_ids=token_ids, attention_mask=attention, loss_mask=loss_mask, behavior_logprobs=behavior,
                 token_versions=torch.where(loss_mask.bool(), 0, -1), rewards=rewards,
                 group_index=torch.arange(rows) // GROUP_SIZE, episodes=[])


class PlainLoop:
    """The baseline: one model, one AdamW, one REINFORCE-style logprob loss; no FSDP."""

    def __init__(self, model_path: str, lr: float, max_grad_norm: float, temperature: float):
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.max_grad_norm, self.temperature = max_grad_norm, temperature

    def step(self, batch: Batch) -> None:
        self.model.train()
        group_rewards = batch.rewards.view(-1, GROUP_SIZE)
        advantages = ((group_rewards - group_rewards.mean(1, keepdim=True))
                      / (group_rewards.std(1, keepdim=True) + 1e-6)).flatten()
        logits = self.model(input_ids=batch.token_ids, attention_mask=batch.attention_mask).logits
        log_probs = F.log_softmax(logits[:, :-1].float() / self.temperature, dim=-1)
        picked = log_probs.gather(-1, batch.token_ids[:, 1:, None]).squeeze(-1)
        mask = batch.loss_mask[:, 1:]
        loss = -(picked * advantages[:, None] * mask).sum() / mask.sum()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()


def time_case(case: Case) -> dict:
    """Median wall and CPU seconds per step of ours and plain on the case's batch, steps alternating."""
    model_path = str(resolve_model(case.model, default_cache_dir()))
    cfg = load_config(None, ["--model.name", model_path, "--model.dtype", "float32"])
    ours = ShardedPolicy(cfg, model_path)
    plain = PlainLoop(model_path, cfg.learner.lr, cfg.learner.max_grad_norm, cfg.rollout.temperature)
    batch = synthetic_batch(case.rows, case.width, plain.model.config.vocab_size)
    timings: dict[str, list[tuple[float, float]]] = {"ours": [], "plain": []}
    for _ in range(case.timed_steps + 1):  # the first step of each warms up
        for name, step in (("ours", ours.train), ("plain", plain.step)):
            wall, cpu = time.perf_counter(), time.process_time()
            step(batch)
            timings[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    medians = {name: [statistics.median(column) for column in zip(*values[1:])] for name, values in timings.items()}
    return {
        "params": sum(p.numel() for p in plain.model.parameters()),
        "tokens": int(batch.attention_mask.sum()), "assistant_tokens": int(batch.loss_mask.sum()),
        **{name: wall for name, (wall, _) in medians.items()},
        **{f"{name}_cpu": cpu for name, (_, cpu) in medians.items()},
    }


def print_table(rows: list[tuple]) -> None:
    lines = [tuple(str(cell) for cell in row) for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny model only (well under a minute)")
    parser.add_argument("--torch-threads", type=int, default=2, help="torch intra-op threads for both loops")
    parser.add_argument("--json", metavar="PATH", help="also write the ratios as JSON (for run_all.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(0)
    transformers_logging.disable_progress_bar()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    init_process_group(0, 1, "127.0.0.1", free_port())
    table = [("model", "params", "batch (rows x width)", "real tokens", "assistant tokens",
              "ours tok/s", "plain tok/s", "ours / plain", "ours / plain (CPU time)", "ours step s",
              "plain step s")]
    json_rows = []
    try:
        for case in QUICK if args.quick else FULL:
            result = time_case(case)
            table.append((case.model, f"{result['params'] / 1e6:.1f}M", f"{case.rows} x {case.width}",
                          result["tokens"], result["assistant_tokens"], f"{result['tokens'] / result['ours']:.0f}",
                          f"{result['tokens'] / result['plain']:.0f}", f"{result['plain'] / result['ours']:.2f}",
                          f"{result['plain_cpu'] / result['ours_cpu']:.2f}", f"{result['ours']:.3f}",
                          f"{result['plain']:.3f}"))
            json_rows += json_rows_of(case, result)
    finally:
        dist.destroy_process_group()
    print(f"torch {torch.__version__}, {args.torch_threads} thread(s), float32, CPU, "
          f"median of the timed steps after one warm-up step each")
    print_table(table)
    write_json(args.json, "learner_bench", json_rows)


def json_rows_of(case: Case, result: dict) -> list[tuple]:
    """Ours against plain in wall time and in CPU time: (figure, value, baseline, ratio, goal)."""
    setting = f"train step tokens/s, {case.model} {case.rows} x {case.width}"
    return [(setting, f"{result['tokens'] / result['ours']:.0f} tokens/s ({result['ours']:.3f} s/step)",
             f"plain loop {result['tokens'] / result['plain']:.0f} tokens/s", result["plain"] / result["ours"], ""),
            (f"{setting} (CPU time)", f"{result['ours_cpu']:.3f} CPU s/step",
             f"plain loop {result['plain_cpu']:.3f} CPU s/step", result["plain_cpu"] / result["ours_cpu"], "")]


if __name__ == "__main__":
    main()
