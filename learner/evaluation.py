"""Validation during training: held-out tasks every ``learner.eval_every`` learner steps.

1. At learner step s with ``s % eval_every == 0`` (step 0 included: the untrained policy; never
   at ``run.max_steps``, when nothing would collect it), the learner schedules a *round* on the
   head: one eval group per held-out task, ``eval_samples`` episodes each. The held-out tasks are
   ``eval_tasks_per_env`` evenly spaced tasks of each env's ``eval_split`` split, the same every
   round and every run (independent of ``run.seed``), each with one fixed env seed, so the
   curves compare round to round.
2. The head issues those leases (``purpose="eval"``) ahead of new training leases and outside the
   staleness admission (``learner/sampler.py``), at the current policy version and turn cap.
3. Completed eval groups arrive on the head's ``eval_groups`` queue, never on the training one.
4. With ``learner.eval_at_end``, one more round on the final policy at ``run.max_steps``: the
   learner waits for it (up to ``eval_end_timeout_s``) before it stops. With ``eval_at_start``, the
   round of step 0 is waited for before the first update, so it measures the untrained policy only.
5. After every learner step the learner drains that queue without waiting; once every group of
   the round is in, it logs ``eval/<env>/{tasks,success,pass@n,agentgym_avg@n,agentgym_pass@n,reward,
   num_turns,truncated_frac,error_frac,episode_tokens}`` and ``eval/round_s`` at step s.

One round at a time: a round that falls due while the previous one is still incomplete is
skipped (``eval/rounds_skipped``), not queued, so validation never holds more than one round's
share of the actors and each point is logged at the step whose policy started it. A round still
incomplete when the run stops is not logged; rounds are not checkpointed.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from common.config import Config
from common.protocol import Trajectory
from learner.group import Group
from learner.rollout_metrics import episode_summary
from learner.task_lists import TaskListRefused

log = logging.getLogger(__name__)


class EvalLeaseIssuer(Protocol):
    """What a round needs from the head (``HeadServer.schedule_eval``)."""

    def schedule_eval(self, tasks: list[tuple[str, str]], group_size: int) -> list[str]: ...


def eval_task_subset(tasks: list[str], count: int) -> list[str]:
    """``count`` evenly spaced tasks of ``tasks`` (all of them if fewer), in their order.

    Evenly spaced rather than random: splits are ordered by family (BabyAI levels, TextCraft
    depths), so spacing covers every family, and the subset does not depend on any seed.
    """
    if count >= len(tasks):
        return list(tasks)
    return [tasks[i * len(tasks) // count] for i in range(count)]


def held_out_tasks(env_tasks: dict[str, list[str]], per_env: int) -> dict[str, list[str]]:
    """The fixed eval subset of every env, from each env's eval split."""
    return {env_id: eval_task_subset(tasks, per_env) for env_id, tasks in env_tasks.items()}


def pass_at_n(groups: list[list[Trajectory]]) -> float:
    """Fraction of tasks (one episode list each) with at least one successful episode."""
    return float(np.mean([any(e.success and e.status == "ok" for e in episodes) for episodes in groups]))


def agentgym_score(episode: Trajectory) -> float:
    """An episode's score as AgentGym-RL counts it: the last step's score (the reward where the env
    reports no score); 0 for an episode that failed (AgentGym-RL's rollout scores a failed step 0)."""
    if episode.status != "ok":
        return 0.0
    return episode.reward if episode.score is None else episode.score


def agentgym_avg_and_pass(groups: list[list[Trajectory]]) -> tuple[float, float]:
    """AgentGym-RL's evaluation (``verl/agent_trainer/main_eval.py``) over tasks of n episodes each:
    Avg is the mean over tasks of the mean score, Pass the mean over tasks of the best score (the
    pass rate where scores are 0 or 1)."""
    scores = [[agentgym_score(e) for e in episodes] for episodes in groups]
    return float(np.mean([np.mean(s) for s in scores])), float(np.mean([np.max(s) for s in scores]))


def eval_scalars(groups: list[Group]) -> dict[str, float]:
    """``eval/<env>/...`` of one complete round: episode means per env, pass@n over its tasks, and
    AgentGym-RL's Avg and Pass (``agentgym_avg@n``, ``agentgym_pass@n``) to set beside the paper."""
    by_env: dict[str, list[Group]] = defaultdict(list)
    for group in groups:
        by_env[group.lease.env_id].append(group)
    out = {}
    for env_id, env_groups in sorted(by_env.items()):
        out.update(episode_summary(f"eval/{env_id}", [e for g in env_groups for e in g.episodes]))
        out[f"eval/{env_id}/tasks"] = float(len(env_groups))
        out[f"eval/{env_id}/pass@n"] = pass_at_n([g.episodes for g in env_groups])
        avg, best = agentgym_avg_and_pass([g.episodes for g in env_groups])
        out[f"eval/{env_id}/agentgym_avg@n"], out[f"eval/{env_id}/agentgym_pass@n"] = avg, best
    return out


@dataclass
class _Round:
    step: int
    started_s: float
    waiting: set[str]
    """Group ids scheduled and not yet back."""
    groups: list[Group] = field(default_factory=list)


class EvalRounds:
    """Starts rounds when due and turns complete ones into scalars; rank 0 only, never blocks."""

    def __init__(self, tasks: dict[str, list[str]], samples: int, every_steps: int, max_steps: int,
                 clock: Callable[[], float] = time.monotonic):
        if every_steps < 0 or samples < 1 or not any(tasks.values()):
            raise ValueError("EvalRounds needs every_steps >= 0 (0: only rounds started by hand), samples >= 1 "
                             "and at least one task")
        self.tasks = [(env_id, task_id) for env_id, ids in tasks.items() for task_id in ids]
        self.samples, self.every_steps, self.max_steps, self.clock = samples, every_steps, max_steps, clock
        self.rounds_skipped = 0
        self.unmatched_groups = 0
        self._round: _Round | None = None

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0 and step < self.max_steps

    def maybe_start(self, step: int, head: EvalLeaseIssuer) -> bool:
        """Schedule a round at ``step`` if one is due and none is in flight; True if started."""
        if not self.due(step):
            return False
        if self._round is not None:
            self.rounds_skipped += 1
            log.warning("eval round due at step %d skipped: the round of step %d is still running (%d groups out)",
                        step, self._round.step, len(self._round.waiting))
            return False
        self.start(step, head)
        return True

    @property
    def in_flight(self) -> bool:
        return self._round is not None

    @property
    def in_flight_step(self) -> int | None:
        """The step of the round in flight, None when none is."""
        return None if self._round is None else self._round.step

    def start(self, step: int, head: EvalLeaseIssuer) -> None:
        """Schedule a round at ``step`` now (the final round: ``learner.eval_at_end``)."""
        assert self._round is None, "one round at a time"
        group_ids = head.schedule_eval(self.tasks, self.samples)
        self._round = _Round(step, self.clock(), set(group_ids))

    def collect(self, finished: queue.Queue[Group]) -> list[tuple[int, dict[str, float]]]:
        """Take the eval groups that came back; ``(step, scalars)`` of the round if it completed."""
        while True:
            try:
                group = finished.get_nowait()
            except queue.Empty:
                break
            if self._round is None or group.lease.group_id not in self._round.waiting:
                self.unmatched_groups += 1  # cannot happen while the sampler rejects late leases
                log.warning("eval group %s belongs to no running round; dropped", group.lease.group_id)
                continue
            self._round.waiting.discard(group.lease.group_id)
            self._round.groups.append(group)
        if self._round is None or self._round.waiting:
            return []
        done, self._round = self._round, None
        scalars = {**eval_scalars(done.groups), "eval/round_s": self.clock() - done.started_s,
                   "eval/rounds_skipped": float(self.rounds_skipped)}
        return [(done.step, scalars)]


def build_eval_rounds(cfg: Config, tasks_of_split: Callable[[str], dict[str, list[str]]]) -> EvalRounds | None:
    """The run's validation, or None when ``learner.eval_every`` is 0. ``tasks_of_split(split)`` lists
    the tasks of that split of every env of ``rollout.envs`` (envhub's lists: ``learner/task_lists.py``)."""
    lc = cfg.learner
    if not lc.eval_every and not lc.eval_at_end and not lc.eval_at_start:
        return None
    if lc.eval_samples > cfg.actors.max_concurrent_episodes:
        raise ValueError(f"learner.eval_samples ({lc.eval_samples}) must not exceed "
                         f"actors.max_concurrent_episodes ({cfg.actors.max_concurrent_episodes})")
    try:
        split_tasks = tasks_of_split(lc.eval_split)
    except TaskListRefused as exc:
        raise ValueError(f"learner.eval_every > 0 needs split {lc.eval_split!r} in every env of rollout.envs; "
                         f"{exc} (set learner.eval_split)") from None
    tasks = held_out_tasks(split_tasks, lc.eval_tasks_per_env)
    return EvalRounds(tasks, lc.eval_samples, lc.eval_every, cfg.run.max_steps)  # every 0: the final round only
