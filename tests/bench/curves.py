"""A finished run's learning curves, read from its tensorboard, and a PNG of several runs side by side.

The learning benches call ``read_run`` per run and ``plot_runs`` once: held-out success against
learner steps and against the learner's wall time, and the share of replies holding a parsable
action (with training success) against learner steps. Wall time is the learner loop's clock (the
sum of ``time/step_s``), so process start-up is not counted; a held-out round is placed at the
learner time of the step it started at.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import accumulate
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


@dataclass
class RunCurves:
    steps: list[int] = field(default_factory=list)
    """Learner step of each training point (1-based: the step that trained on those episodes)."""
    learner_s: list[float] = field(default_factory=list)
    """Learner-loop seconds elapsed at the end of each step."""
    train_success: list[float] = field(default_factory=list)
    valid_action_frac: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_success: list[float] = field(default_factory=list)
    eval_agentgym_avg: list[float] = field(default_factory=list)

    def eval_learner_s(self) -> list[float]:
        """Learner seconds at each held-out round's start step (0 for step 0)."""
        at = dict(zip(self.steps, self.learner_s))
        return [at.get(step, 0.0) for step in self.eval_steps]

    def to_json(self) -> dict:
        return asdict(self)


def read_run(tb_dir: Path, env_id: str) -> RunCurves:
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    tags = set(acc.Tags()["scalars"])

    def series(tag: str) -> list:
        return list(acc.Scalars(tag)) if tag in tags else []

    train = series("rollout/success")
    evals = sorted(series(f"eval/{env_id}/success"), key=lambda e: e.step)
    return RunCurves(
        steps=[e.step for e in train],
        learner_s=list(accumulate(e.value for e in series("time/step_s"))),
        train_success=[e.value for e in train],
        valid_action_frac=[e.value for e in series("rollout/valid_action_frac")],
        eval_steps=[e.step for e in evals],
        eval_success=[e.value for e in evals],
        eval_agentgym_avg=[e.value for e in sorted(series(f"eval/{env_id}/agentgym_avg@n"), key=lambda e: e.step)],
    )


def plot_runs(runs: dict[str, RunCurves], path: Path, title: str) -> Path:
    """Three panels, one line per run; written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: benches run headless
    import matplotlib.pyplot as plt

    fig, (by_step, by_time, valid) = plt.subplots(1, 3, figsize=(15, 4.2))
    for name, run in runs.items():
        line = by_step.plot(run.eval_steps, run.eval_success, marker="o", label=name)[0]
        by_time.plot([s / 60 for s in run.eval_learner_s()], run.eval_success, marker="o", color=line.get_color())
        if run.valid_action_frac:
            valid.plot(run.steps[:len(run.valid_action_frac)], run.valid_action_frac, color=line.get_color(),
                       label=f"{name}: valid actions")
        valid.plot(run.steps, run.train_success, color=line.get_color(), linestyle=":", label=f"{name}: train success")
    by_step.set(xlabel="learner step", ylabel="held-out success", ylim=(-0.02, 1.02), title="held-out success")
    by_time.set(xlabel="learner wall time (min)", ylabel="held-out success", ylim=(-0.02, 1.02),
                title="held-out success against time")
    valid.set(xlabel="learner step", ylabel="share", ylim=(-0.02, 1.02), title="training episodes")
    by_step.legend(fontsize=8)
    valid.legend(fontsize=7)
    for axes in (by_step, by_time, valid):
        axes.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
