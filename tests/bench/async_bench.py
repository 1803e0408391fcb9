"""Asynchrony against the synchronous loop: the same job, actors, learner and envs, in both modes.

Not a test: it prints one table of figures, each as a ratio against the synchronous run measured
in the same invocation, and asserts nothing.

The workload (``configs/longtail.yaml``): the tiny model on the toy env with long-tailed env
latency (100 ms a step; 1 task in 4 takes 3 s a step), ``groups_per_step`` 8, 2 actors.
- sync (``--run.mode sync``): lease a batch, wait for its slowest episode, train, broadcast,
  lease the next (the reference systems' loop);
- async (the default): leases flow within ``max_policy_lag`` 4, so slow episodes finish while
  the next batches are generated and trained.
Figures: the learner's wall time to reach the same number of steps, and trained samples/s
(episodes consumed by the learner per second of its loop), async over sync.

    .venv/bin/python -m tests.bench.async_bench [--quick] [--max-steps N] [--json PATH]

``--json PATH`` also writes the rows as JSON for tests/bench/run_all.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.run_all import write_json

REPO = Path(__file__).resolve().parents[2]
CONFIG = "configs/longtail.yaml"


def run_mode(mode: str, out: Path, max_steps: int, extra: list[str]) -> dict:
    """One launch.py run; its summary.json."""
    command = [sys.executable, "launch.py", "--config", CONFIG, "--mode", mode, "--max-steps", str(max_steps),
               "--output-dir", str(out), "--run-name", mode, *extra]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return json.loads((out / mode / "summary.json").read_text())


def figures(summary: dict, group_size: int) -> dict[str, float]:
    samples = summary["ledger"]["consumed"] * group_size
    return {"steps": summary["step"], "wall_s": summary["wall_s"], "samples_per_s": samples / summary["wall_s"]}


def compare(max_steps: int, extra: list[str], group_size: int = 4) -> list[tuple]:
    with tempfile.TemporaryDirectory() as tmp:
        sync = figures(run_mode("sync", Path(tmp), max_steps, extra), group_size)
        asyn = figures(run_mode("async", Path(tmp), max_steps, extra), group_size)
    return [
        ("wall time to the same learner steps", f"{asyn['wall_s']:.1f} s ({asyn['steps']} steps)",
         f"sync {sync['wall_s']:.1f} s ({sync['steps']} steps)", sync["wall_s"] / asyn["wall_s"], ">= 2"),
        ("trained samples/s", f"{asyn['samples_per_s']:.2f}", f"sync {sync['samples_per_s']:.2f}",
         asyn["samples_per_s"] / sync["samples_per_s"], ">= 2"),
    ]


def print_table(rows: list[tuple]) -> None:
    header = ("figure (async over sync)", "async", "baseline", "ratio", "goal")
    cells = [header] + [(row[0], row[1], row[2], f"{row[3]:.2f}", row[4]) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    for line in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer learner steps (about 2 minutes)")
    parser.add_argument("--max-steps", type=int, help="learner steps per run (default 12, --quick 3)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON (for run_all.py)")
    args, extra = parser.parse_known_args()
    max_steps = args.max_steps or (3 if args.quick else 12)
    print(f"workload {CONFIG}, {max_steps} learner steps per mode; extra overrides {extra or 'none'}")
    rows = compare(max_steps, extra)
    print_table(rows)
    write_json(args.json, "async_bench", rows)


if __name__ == "__main__":
    main()
