"""What the learner reports each step: tensorboard scalars, sample texts, and the launcher's progress.

The collaborators each give their own scalars (rollout, source, weight publisher, envhub); this
module adds the loop's timing (``time/``, ``perf/``), writes them, and keeps the progress line
and the success trend the launcher prints and ``summary.json`` holds.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml

from common.config import Config, to_dict
from common.metrics import MetricsWriter
from common.models import load_tokenizer
from common.protocol import Trajectory
from learner.sample_text import samples_markdown

TREND_STEPS = 3
"""Steps averaged at the start and at the end of the success trend in the progress line."""


def timing_scalars(episodes: list[Trajectory], wait_s: float, train_s: float, broadcast_s: float) -> dict[str, float]:
    """``time/`` and ``perf/`` of one step: waiting for groups, training, publishing the weights."""
    step_s = wait_s + train_s + broadcast_s
    return {"time/step_s": step_s, "time/wait_s": wait_s, "time/train_s": train_s, "time/broadcast_s": broadcast_s,
            "perf/samples_per_s": len(episodes) / max(step_s, 1e-9),
            "perf/tokens_per_s": sum(len(e.token_ids) for e in episodes) / max(step_s, 1e-9)}


class StepMetrics:
    """Owns the run's ``MetricsWriter``; ``record`` logs one step and updates the progress."""

    def __init__(self, cfg: Config, run_dir: Path, model_path: str):
        self.max_steps, self.sample_text_every = cfg.run.max_steps, cfg.learner.sample_text_every
        self.model_path = model_path
        self.writer = MetricsWriter(run_dir / "tb", cfg.learner.tb_flush_s)
        self.writer.text("config", "```yaml\n" + yaml.safe_dump(to_dict(cfg), sort_keys=False) + "\n```")
        self.progress: dict = {"step": 0}
        self._success_curve: list[float] = []
        self._tokenizer = None  # loaded for the first sample text

    def record(self, step: int, version: int, scalars: dict[str, float], episodes: list[Trajectory],
               turn_cap: int) -> None:
        self.writer.scalars(scalars, step)
        self._log_samples(step, episodes)
        self._update_progress(step, version, scalars, turn_cap)

    def close(self) -> None:
        self.writer.close()

    def _log_samples(self, step: int, episodes: list[Trajectory]) -> None:
        every = self.sample_text_every
        if not every or not episodes or step % every:
            return
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.model_path)
        for tag, markdown in samples_markdown(episodes, self._tokenizer).items():
            self.writer.text(tag, markdown, step)

    def _update_progress(self, step: int, version: int, scalars: dict[str, float], turn_cap: int) -> None:
        success = scalars.get("rollout/success", 0.0)
        self._success_curve.append(round(success, 4))
        self.progress = {
            "step": step, "max_steps": self.max_steps, "version": version,
            "reward": scalars.get("rollout/reward", 0.0), "success": success,
            # One step's success is noisy; the start and the recent mean show whether it learns.
            "success_first_steps": statistics.mean(self._success_curve[:TREND_STEPS]),
            "success_last_steps": statistics.mean(self._success_curve[-TREND_STEPS:]),
            "success_curve": list(self._success_curve),
            "valid_action_frac": scalars.get("rollout/valid_action_frac"),
            "turn_cap": turn_cap, "samples_per_s": scalars["perf/samples_per_s"],
            "policy_lag": scalars.get("async/policy_lag_mean", 0.0),
        }
