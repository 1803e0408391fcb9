"""Does ScalingInter-RL's staged turn cap matter? The same model trained three ways, same step budget.

Not a test: it runs ``launch.py`` three times, one after another, on the default job (the warm tiny
model, keydoor-v0, GiGPO; one warm model shared by all three) with only the turn-cap schedule
changed, and reports each arm's held-out success:

- ``short``: a fixed cap of 4 turns, the fewest that win (every slip loses the episode);
- ``long``: a fixed cap of 12 turns (the default job's);
- ``staged``: ScalingInter-RL, 4 turns, then 8 from step 10, then 12 from step 20.

Held-out rounds (``learner.eval_*``) run every 5 steps, at start and at the end, on the same
keydoor ``test`` tasks, two episodes a task sampled as in training, all at one horizon
(``learner.eval_turn_cap``, default 12), so the arms are compared on the same footing whatever cap
they trained at. Not greedy by default: the tiny model's most likely reply ignores the key's hint
early on, so a greedy round scores every task alike (a first run read 0.0 or 1.0, nothing between);
``--greedy`` asks for it anyway. Writes ``horizon_ablation.json`` and ``horizon_ablation.png`` (the curves) into
``--output-dir``.

    .venv/bin/python -m tests.bench.horizon_ablation [--max-steps 30] [--eval-tasks 48] [--greedy] [--seed 0]
        [--output-dir runs/horizon_ablation]

About 15 minutes on 2 cores (plus ~95 s for the warm model the first time).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.config import load_config
from launcher.warm_start import cached_warm_model
from tests.bench.curves import RunCurves, plot_runs, read_run

REPO = Path(__file__).resolve().parents[2]
ENV_ID = "keydoor-v0"
ARMS = {
    "short": ["--learner.horizon.kind", "fixed", "--learner.horizon.turn_caps", "[4]",
              "--learner.horizon.boundaries", "[]"],
    "long": ["--learner.horizon.kind", "fixed", "--learner.horizon.turn_caps", "[12]",
             "--learner.horizon.boundaries", "[]"],
    "staged": ["--learner.horizon.kind", "stepwise", "--learner.horizon.turn_caps", "[4, 8, 12]",
               "--learner.horizon.boundaries", "[10, 20]"],
}


def validation(tasks: int, turn_cap: int, greedy: bool) -> list[str]:
    return ["--learner.eval_every", "5", "--learner.eval_at_start", "true", "--learner.eval_at_end", "true",
            "--learner.eval_tasks_per_env", str(tasks), "--learner.eval_samples", "1" if greedy else "2",
            "--rollout.eval_greedy", str(greedy).lower(), "--learner.eval_turn_cap", str(turn_cap)]


def shared_warm_model() -> Path:
    """The default job's warm model (made once, then cached), so every arm starts from the same weights."""
    return cached_warm_model(load_config(REPO / "configs" / "default.yaml"))


def train(arm: str, model: Path, out: Path, max_steps: int, seed: int, extra: list[str]) -> float:
    started_s = time.time()
    command = [sys.executable, "launch.py", "--model.name", str(model), "--model.warm_start", "",
               "--max-steps", str(max_steps), "--run.seed", str(seed), "--output-dir", str(out),
               "--run-name", arm, *ARMS[arm], *extra]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"arm {arm} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.time() - started_s


def row(arm: str, curves: RunCurves, wall_s: float) -> dict:
    evals = dict(zip(curves.eval_steps, curves.eval_success))
    return {"arm": arm, "wall_s": round(wall_s), "steps": len(curves.steps),
            "held_out_success": {str(step): round(value, 3) for step, value in evals.items()},
            "held_out_first": curves.eval_success[0] if curves.eval_success else None,
            "held_out_last": curves.eval_success[-1] if curves.eval_success else None,
            "held_out_best": max(curves.eval_success, default=None),
            "train_success_last5": round(sum(curves.train_success[-5:]) / max(len(curves.train_success[-5:]), 1), 3),
            "learner_s": round(curves.learner_s[-1]) if curves.learner_s else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=30, help="learner steps of every arm")
    parser.add_argument("--eval-tasks", type=int, default=48, help="held-out keydoor test tasks per round")
    parser.add_argument("--eval-turn-cap", type=int, default=12, help="the one horizon every round plays at")
    parser.add_argument("--greedy", action="store_true", help="greedy held-out episodes, one a task")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=sorted(ARMS), action="append", help="run only these arms")
    parser.add_argument("--output-dir", type=Path, default=REPO / "runs" / "horizon_ablation")
    args = parser.parse_args()
    model = shared_warm_model()
    extra = validation(args.eval_tasks, args.eval_turn_cap, args.greedy)
    curves, rows = {}, []
    for arm in args.only or list(ARMS):
        wall_s = train(arm, model, args.output_dir, args.max_steps, args.seed, extra)
        curves[arm] = read_run(args.output_dir / arm / "tb", ENV_ID)
        rows.append(row(arm, curves[arm], wall_s))
        print(json.dumps(rows[-1]), flush=True)
    result = {"bench": "horizon_ablation", "env": ENV_ID, "max_steps": args.max_steps, "seed": args.seed,
              "greedy": args.greedy,
              "eval_tasks": args.eval_tasks, "eval_turn_cap": args.eval_turn_cap, "arms": rows,
              "curves": {arm: c.to_json() for arm, c in curves.items()}}
    (args.output_dir / "horizon_ablation.json").write_text(json.dumps(result, indent=1) + "\n")
    png = plot_runs(curves, args.output_dir / "horizon_ablation.png",
                    f"ScalingInter-RL ablation: {ENV_ID}, tiny warm model, {args.max_steps} learner steps, "
                    f"held-out at {args.eval_turn_cap} turns ({'greedy' if args.greedy else 'sampled, 2 a task'}, "
                    f"{args.eval_tasks} tasks)")
    print(f"curves: {png}")


if __name__ == "__main__":
    main()
