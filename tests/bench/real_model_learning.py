"""A real model learning real environments on the CPU: SmolLM2-135M-Instruct on TextCraft depth-1
goals and on BabyAI GoTo levels, 30 minutes of training each (``run.max_wall_s``).

Not a test: it runs ``launch.py`` once per config and prints, from each run's tensorboard, the
held-out success before training (the validation round at step 0) and after it (the final round,
``learner.eval_at_end``), the training success of the first and last steps, and the steps done.
The curves stay in ``<output_dir>/<run>/tb`` (``rollout/success``, ``eval/<env>/success``, and the
best and worst episodes as text under ``samples/<env>``).

    .venv/bin/python -m tests.bench.real_model_learning [--minutes 30] [--only textcraft|babyai]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[2]
RUNS = {"textcraft": ("configs/smollm2_textcraft_depth1.yaml", "textcraft-v0"),
        "babyai": ("configs/smollm2_babyai_goto.yaml", "babyai-v0")}


def run(name: str, output_dir: Path, minutes: float) -> dict:
    config, env_id = RUNS[name]
    started_s = time.time()
    command = [sys.executable, "launch.py", "--config", config, "--output-dir", str(output_dir), "--run-name", name,
               "--run.max_wall_s", str(60 * minutes)]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    acc = EventAccumulator(str(output_dir / name / "tb"))
    acc.Reload()
    evals = {e.step: e.value for e in acc.Scalars(f"eval/{env_id}/success")}
    train = [e.value for e in acc.Scalars("rollout/success")]
    return {"run": name, "env": env_id, "steps": len(train), "wall_s": round(time.time() - started_s),
            "eval_success_before": evals.get(0), "eval_success_after": evals.get(max(evals)) if len(evals) > 1 else None,
            "train_success_first3": statistics.mean(train[:3]) if train else None,
            "train_success_last3": statistics.mean(train[-3:]) if train else None,
            "train_success_per_step": [round(v, 3) for v in train], "tb": str(output_dir / name / "tb")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="training time per run")
    parser.add_argument("--only", choices=sorted(RUNS), action="append", help="run only these")
    parser.add_argument("--output-dir", type=Path, default=REPO / "runs" / "real_model_learning")
    args = parser.parse_args()
    for name in args.only or sorted(RUNS):
        result = run(name, args.output_dir, args.minutes)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
