"""A real model learning real environments on the CPU: SmolLM2-135M-Instruct on BabyAI GoTo levels
and on TextCraft depth-1 goals, in AgentGym's dialect, each beside its learning-rate-0 control.

Not a test: it runs ``launch.py`` per run, one after another. Each run trains with a validation
round on the untrained policy (``learner.eval_at_start``, waited for before the first update), and
its final checkpoint is then scored by ``launch.py --evaluate`` on the same held-out tasks (the
command a user scores any checkpoint with). It prints the held-out success and AgentGym's Avg/Pass
before and after, the training success and the share of replies holding a parsable action
(``rollout/valid_action_frac``) and of those the env carried out (``rollout/accepted_action_frac``)
at the first and last steps and per step, and the wall times. The control is the same run at
``--learner.lr 0`` (before and after measure the same weights: their difference is the evaluation's
own noise), kept short, since its training steps change nothing. Curves stay in
``<output_dir>/<run>/tb``; each env's pair is also drawn to ``<output_dir>/<env>.png`` beside
``<output_dir>/<env>.json``.

    .venv/bin/python -m tests.bench.real_model_learning [--minutes 50] [--only babyai|textcraft]
        [--control-minutes 8] [--output-dir DIR] [--section.key value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.bench.curves import RunCurves, plot_runs, read_run

REPO = Path(__file__).resolve().parents[2]
RUNS = {"babyai": ("configs/smollm2_babyai_goto.yaml", "babyai-v0"),
        "textcraft": ("configs/smollm2_textcraft_depth1.yaml", "textcraft-v0")}


def launch(name: str, config: str, output_dir: Path, minutes: float, extra: tuple[str, ...] = ()) -> float:
    """One run; its wall time from the launch to the end of its final validation round."""
    started_s = time.time()
    command = [sys.executable, "launch.py", "--config", config, "--output-dir", str(output_dir), "--run-name", name,
               "--run.max_wall_s", str(60 * minutes), *extra]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.time() - started_s


def evaluate(name: str, config: str, output_dir: Path, overrides: list[str]) -> tuple[float, dict] | None:
    """``launch.py --evaluate`` on run ``name``'s final checkpoint: (wall time, its held-out round);
    None for a run that saved none (its time ran out in its first validation round)."""
    started_s = time.time()
    summary = json.loads((output_dir / name / "summary.json").read_text())
    if "checkpoint" not in summary:
        print(f"{name} saved no checkpoint ({summary['step']} steps in {summary['wall_s']:.0f} s): only its "
              "validation round on the untrained policy is reported", flush=True)
        return None
    model = Path(summary["checkpoint"]) / "hf"
    command = [sys.executable, "launch.py", "--config", config, "--output-dir", str(output_dir),
               "--run-name", f"{name}-evaluate", "--evaluate", str(model)]
    proc = subprocess.run([*command, *overrides], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} --evaluate failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    [held_out] = json.loads((output_dir / f"{name}-evaluate" / "summary.json").read_text())["eval"]
    return time.time() - started_s, held_out


def with_final_round(run: RunCurves, after: dict) -> RunCurves:
    """``run``'s curves with the ``--evaluate`` round of its final checkpoint at its last step."""
    run.eval_steps.append(run.steps[-1] if run.steps else 0)
    run.eval_success.append(after["success"])
    run.eval_agentgym_avg.append(after.get("agentgym_avg@n", float("nan")))
    return run


def curves(run_dir: Path, env_id: str) -> dict:
    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    scalars = acc.Tags()["scalars"]

    def per_step(tag: str) -> list[float]:  # none for a run that took no step
        return [round(e.value, 3) for e in acc.Scalars(tag)] if tag in scalars else []

    evals = sorted((e.step, e.value) for e in acc.Scalars(f"eval/{env_id}/success"))
    train = per_step("rollout/success")

    valid, accepted = per_step("rollout/valid_action_frac"), per_step("rollout/accepted_action_frac")

    def ends(values: list[float]) -> tuple[float | None, float | None]:
        return (statistics.mean(values[:3]), statistics.mean(values[-3:])) if values else (None, None)

    return {"steps": len(train), "eval_success_before": evals[0][1] if evals else None,
            "eval_success_after": evals[-1][1] if len(evals) > 1 else None,
            "train_success_first3_last3": ends(train), "valid_action_frac_first3_last3": ends(valid),
            "train_success_per_step": train, "valid_action_frac_per_step": valid,
            "accepted_action_frac_per_step": accepted, "tb": str(run_dir / "tb")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=50.0, help="training time of each learning run")
    # The control's time includes its validation round on the untrained policy (about 4 minutes for BabyAI's 60
    # tasks): at 3 minutes it took no step and saved nothing to score.
    parser.add_argument("--control-minutes", type=float, default=8.0, help="wall time of each lr-0 control")
    parser.add_argument("--only", choices=sorted(RUNS), action="append", help="run only these")
    parser.add_argument("--output-dir", type=Path, default=REPO / "runs" / "real_model_learning")
    args, overrides = parser.parse_known_args()  # --section.key value: passed to every run of the config
    for name in args.only or sorted(RUNS):
        config, env_id = RUNS[name]
        results, drawn = [], {}
        for run_name, minutes, extra in ((name, args.minutes, ()),
                                         (f"{name}-lr0", args.control_minutes, ("--learner.lr", "0"))):
            wall_s = launch(run_name, config, args.output_dir, minutes,
                            (*overrides, *extra, "--learner.eval_at_end", "false"))
            evaluated = evaluate(run_name, config, args.output_dir, overrides)
            eval_wall_s, held_out = evaluated if evaluated is not None else (0.0, {})
            after = {k.rsplit("/", 1)[1]: round(v, 4) for k, v in held_out.items() if k.startswith(f"eval/{env_id}/")}
            results.append({"run": run_name, "env": env_id, "wall_s": round(wall_s),
                            "evaluate_wall_s": round(eval_wall_s),
                            **curves(args.output_dir / run_name, env_id), "evaluate_after": after,
                            "eval_success_after": after.get("success")})
            run = read_run(args.output_dir / run_name / "tb", env_id)
            drawn[run_name] = with_final_round(run, after) if after else run
            print(json.dumps(results[-1]), flush=True)
            # Written after each run: a later one that fails leaves the earlier ones' figures.
            (args.output_dir / f"{name}.json").write_text(json.dumps(results, indent=1) + "\n")
            png = plot_runs(drawn, args.output_dir / f"{name}.png", f"SmolLM2-135M-Instruct on {env_id} ({config})")
        print(f"curves: {png}", flush=True)

if __name__ == "__main__":
    main()
