"""Learning per wall-clock second on the toy env: the learning test's job, asynchronous and synchronous.

Not a test: it prints figures, each as a ratio against the synchronous run measured in the same
invocation, and asserts nothing.

The default job (``configs/default.yaml``: GiGPO, 32 episodes a step, from the warm model the launcher
makes once in a temporary model cache) twice, one run after the other:
``--run.mode sync`` (lease a batch, wait for its slowest episode, train, broadcast) and the
default asynchronous mode. A run's clock is its learner loop's (the sum of ``time/step_s``), so
process start-up is not counted. Figures, async over sync: the wall time until the 3-step mean of
``rollout/success`` first reaches ``--target``, and the learner steps it took (sync trains on
fresher samples, so it may need fewer).

``--latency`` adds long-tailed env latency (100 ms a step; 1 task in 4 takes 1 s a step), the
workload asynchrony is for.

    .venv/bin/python -m tests.bench.learning_bench [--max-steps N] [--target 0.8] [--latency] [--json PATH]
        [--plot PNG]

About 9 minutes on 2 cores; ``tests/bench/run_all.py`` runs it only without ``--quick``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from itertools import accumulate
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.bench.curves import plot_runs, read_run
from tests.bench.run_all import write_json

REPO = Path(__file__).resolve().parents[2]
LATENCY = ("--envhub.env_options", "{keydoor-v0: {room_pool: [kitchen, garden], rooms_per_task: 2, "
           "step_latency_s: 0.1, slow_task_fraction: 0.25, slow_step_latency_s: 1.0}}")
"""The learning config's keydoor options plus long-tailed latency (a CLI value replaces the map)."""


def run_curve(mode: str, out: Path, cache: Path, max_steps: int,
              extra: tuple[str, ...]) -> tuple[list[float], list[float]]:
    """One launch.py run; (success per step, learner-loop seconds elapsed at each step)."""
    command = [sys.executable, "launch.py", "--model.cache_dir", str(cache), "--run.mode", mode,
               "--max-steps", str(max_steps), "--output-dir", str(out), "--run-name", mode, *extra]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    acc = EventAccumulator(str(out / mode / "tb"))
    acc.Reload()
    success = [event.value for event in acc.Scalars("rollout/success")]
    elapsed = list(accumulate(event.value for event in acc.Scalars("time/step_s")))
    return success, elapsed


def first_reaching(success: list[float], target: float, window: int = 3) -> int | None:
    """Index of the first step whose ``window``-step mean (ending there) reaches ``target``."""
    for end in range(window, len(success) + 1):
        if sum(success[end - window:end]) / window >= target:
            return end - 1
    return None


def compare(max_steps: int, target: float, latency: bool, plot: Path | None = None) -> list[tuple]:
    with tempfile.TemporaryDirectory() as tmp:
        extra = LATENCY if latency else ()
        curves = {mode: run_curve(mode, Path(tmp), Path(tmp) / "cache", max_steps, extra) for mode in ("sync", "async")}
        if plot:
            plot_runs({mode: read_run(Path(tmp) / mode / "tb", "keydoor-v0") for mode in curves}, plot,
                      f"default job, sync vs async{' with long-tailed latency' if latency else ''}")
    reached = {mode: first_reaching(success, target) for mode, (success, _) in curves.items()}
    if None in reached.values():
        missed = [mode for mode, step in reached.items() if step is None]
        finals = {mode: round(sum(s[-5:]) / len(s[-5:]), 2) for mode, (s, _) in curves.items()}
        raise RuntimeError(f"{', '.join(missed)} never reached success {target} in {max_steps} steps "
                           f"(last-5 means {finals})")
    seconds = {mode: curves[mode][1][step] for mode, step in reached.items()}
    steps = {mode: step + 1 for mode, step in reached.items()}
    workload = " with long-tailed latency" if latency else ""
    return [
        (f"wall s to success {target} (3-step mean){workload}", f"{seconds['async']:.0f} s",
         f"sync {seconds['sync']:.0f} s", seconds["sync"] / seconds["async"], ">= 1"),
        (f"learner steps to success {target}{workload}", f"{steps['async']}", f"sync {steps['sync']}",
         steps["sync"] / steps["async"], ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="accepted for run_all; this bench has no small mode")
    parser.add_argument("--max-steps", type=int, default=30, help="learner steps per run")
    parser.add_argument("--target", type=float, default=0.8, help="success the runs race to")
    parser.add_argument("--latency", action="store_true", help="long-tailed env latency on every step")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON (for run_all.py)")
    parser.add_argument("--plot", metavar="PNG", type=Path,
                        help="draw both runs' curves (default: beside --json, as learning_bench.png)")
    args = parser.parse_args()
    plot = args.plot or (Path(args.json).with_name("learning_bench.png") if args.json else None)
    rows = compare(args.max_steps, args.target, args.latency, plot)
    for figure, value, baseline, ratio, goal in rows:
        print(f"{figure:<40} {value:>10}  {baseline:>12}  {ratio:5.2f}x  {goal}")
    write_json(args.json, "learning_bench", rows)


if __name__ == "__main__":
    main()
