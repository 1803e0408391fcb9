"""ScalingInter-RL horizon schedules: the turn cap grows in stages as training goes on.

Kinds (``learner.horizon.kind``):

- ``fixed``: one turn cap for the whole run.
- ``stepwise``: stage ``i + 1`` starts at a set step, given in steps (``boundaries``) or as
  fractions of ``run.max_steps`` (``boundary_fractions``, see ``resolve_boundaries``).
- ``adaptive``: the cap goes up one stage when, over the last ``plateau_window`` observed
  steps of the current stage, the mean share of episodes truncated at the cap is at least
  ``truncation_threshold`` and success rose by less than ``plateau_tolerance`` (mean of the
  newer half of the window minus mean of the older half); never before the stage is
  ``min_stage_steps`` old.

Step convention: ``step`` is the number of optimizer steps completed (the policy version).
Leases issued after step ``s`` carry ``cap_at(s)``. A stage starts AT its boundary: with
``boundaries=[10]`` steps 0..9 are stage 0 and step 10 is stage 1. The loop calls
``observe(s, ...)`` with the episodes trained on in step ``s`` before it asks ``cap_at(s)``,
so a raise decided there already applies to the leases issued after step ``s``.

Resume: the stage at a step depends only on the step and on recorded events (the configured
boundaries, or the steps at which the adaptive schedule advanced, kept in ``state_dict``).
No schedule counts steps by itself, so a resumed run cannot drift from an uninterrupted one,
unlike a scheduler with its own step counter that the resume code must re-sync. Stepwise
boundaries are resolved once: a checkpoint keeps the steps, so a resume with another
``run.max_steps`` (an extended run) keeps the stages that ``boundary_fractions`` gave the first
run. ``restore`` refuses a schedule whose stage or turn cap at the resumed step differs from
the one the checkpoint recorded.
"""

from __future__ import annotations

import bisect
import logging
import math
from abc import ABC, abstractmethod
from collections import deque
from typing import Any

from common.config.horizon import (
    HorizonConfig,
    HorizonConfigError,
    check_adaptive_params,
    check_boundaries,
    check_ints,
    check_turn_caps,
    is_int,
    resolve_boundaries,
)

log = logging.getLogger(__name__)


class HorizonSchedule(ABC):
    """Turn cap by learner step; stage ``i`` has cap ``turn_caps[i]``."""

    kind: str

    def __init__(self, turn_caps: list[int]) -> None:
        check_turn_caps(list(turn_caps))
        self.turn_caps = list(turn_caps)

    @property
    def num_stages(self) -> int:
        return len(self.turn_caps)

    @abstractmethod
    def stage_starts(self) -> list[int]:
        """Steps at which stages 1, 2, ... start (so far, for adaptive), strictly increasing."""

    def stage_at(self, step: int) -> int:
        """Index of the stage in force after ``step`` completed optimizer steps."""
        _check_step(step)
        # bisect_right: a step equal to a stage start already belongs to that stage.
        return bisect.bisect_right(self.stage_starts(), step)

    def cap_at(self, step: int) -> int:
        """Turn cap of the leases issued after ``step`` completed optimizer steps."""
        return self.turn_caps[self.stage_at(step)]

    def observe(self, step: int, truncated_at_cap_frac: float, success: float) -> None:
        """Statistics of the episodes trained on in optimizer step ``step``; only adaptive uses them."""
        _check_observation(step, truncated_at_cap_frac, success)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for ``loop.json``; fixed and stepwise derive everything from the step."""
        return {"kind": self.kind}

    def checkpoint_state(self, step: int) -> dict[str, Any]:
        """``state_dict()`` plus the stage and turn cap after ``step``, which ``restore`` checks."""
        return {**self.state_dict(), "stage": self.stage_at(step), "turn_cap": self.cap_at(step)}

    def restore(self, state: dict[str, Any], step: int) -> None:
        """Load ``checkpoint_state(step)`` output; the restored schedule must give the recorded stage
        and turn cap at ``step``, else this run's ``learner.horizon`` is not the one checkpointed."""
        self.load_state_dict(state)
        recorded = (state.get("stage", self.stage_at(step)), state.get("turn_cap", self.cap_at(step)))
        if recorded != (self.stage_at(step), self.cap_at(step)):
            raise HorizonConfigError(
                f"the checkpoint at step {step} recorded stage {recorded[0]} (turn cap {recorded[1]}) but this "
                f"run's learner.horizon gives stage {self.stage_at(step)} (turn cap {self.cap_at(step)}); resume "
                f"with the checkpointed schedule, or start a new run from the checkpoint's hf/ folder"
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()`` output from a checkpoint of the same kind of schedule."""
        if not isinstance(state, dict) or state.get("kind") != self.kind:
            found = state.get("kind") if isinstance(state, dict) else state
            raise HorizonConfigError(
                f"checkpoint horizon state is from a {found!r} schedule but this run's learner.horizon.kind "
                f"is {self.kind!r}; resuming with another kind would move the stage boundaries"
            )


class FixedHorizon(HorizonSchedule):
    """One turn cap for the whole run."""

    kind = "fixed"

    def __init__(self, turn_cap: int) -> None:
        super().__init__([turn_cap])

    def stage_starts(self) -> list[int]:
        return []


class StepwiseHorizon(HorizonSchedule):
    """Turn cap ``turn_caps[i]`` from step ``boundaries[i - 1]`` (inclusive) to ``boundaries[i]``."""

    kind = "stepwise"

    def __init__(self, turn_caps: list[int], boundaries: list[int], boundary_fractions: list[float] = ()) -> None:
        super().__init__(turn_caps)
        check_boundaries(self.turn_caps, list(boundaries))
        self.boundaries = list(boundaries)
        # What ``boundaries`` were resolved from (empty: given in steps); a resume keeps the steps.
        self.boundary_fractions = list(boundary_fractions)

    @classmethod
    def from_config(cls, config: HorizonConfig, max_steps: int | None = None) -> StepwiseHorizon:
        """Build a ``stepwise`` section; ``max_steps`` is needed only for ``boundary_fractions``."""
        if config.kind != "stepwise":
            raise HorizonConfigError(f"learner.horizon.kind is {config.kind!r}; build it with build_horizon")
        if config.boundary_fractions and max_steps is None:
            raise HorizonConfigError("boundary_fractions need run.max_steps: use build_horizon(config, max_steps)")
        return cls(config.turn_caps, resolve_boundaries(config, max_steps or 0), config.boundary_fractions)

    def stage_starts(self) -> list[int]:
        return self.boundaries

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "boundaries": list(self.boundaries),
                "boundary_fractions": list(self.boundary_fractions)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Keep the checkpoint's boundaries: fractions were resolved against the first run's
        ``run.max_steps``, and resolving them again against an extended run would move them."""
        super().load_state_dict(state)
        if "boundaries" not in state:
            return  # a checkpoint from before boundaries were saved: ``restore`` still checks the stage
        saved = list(state["boundaries"])
        check_boundaries(self.turn_caps, saved)
        saved_fractions = list(state.get("boundary_fractions", []))
        if saved_fractions != self.boundary_fractions or (not saved_fractions and saved != self.boundaries):
            raise HorizonConfigError(
                f"the checkpoint's stepwise schedule has boundaries {saved} (boundary_fractions {saved_fractions}) "
                f"but this run's learner.horizon gives boundaries {self.boundaries} (boundary_fractions "
                f"{self.boundary_fractions}); a resume never moves a boundary, so resume with the checkpointed "
                f"schedule or start a new run from the checkpoint's hf/ folder"
            )
        if saved != self.boundaries:
            log.info("horizon: keeping the checkpoint's boundaries %s (boundary_fractions %s of the first run's "
                     "run.max_steps); this run's max_steps would have given %s", saved, saved_fractions,
                     self.boundaries)
        self.boundaries = saved


class AdaptiveHorizon(HorizonSchedule):
    """Raises the cap one stage when episodes keep hitting it and success has plateaued.

    State is the list of steps at which it advanced plus the observation window of the current
    stage; replaying the same observations from a restored state gives the same decisions.
    The window restarts at each raise, so a stage lasts at least ``plateau_window`` observed
    steps. Episodes in flight at a raise still ran under the old cap: ``min_stage_steps`` of at
    least ``plateau_window + max_policy_lag`` keeps them out of the next decision (the run's
    config refuses less, ``common/config/``).
    """

    kind = "adaptive"

    def __init__(self, turn_caps: list[int], truncation_threshold: float, plateau_window: int,
                 plateau_tolerance: float, min_stage_steps: int) -> None:
        super().__init__(turn_caps)
        check_adaptive_params(self.turn_caps, truncation_threshold, plateau_window, plateau_tolerance,
                              min_stage_steps)
        self.truncation_threshold = truncation_threshold
        self.plateau_window = plateau_window
        self.plateau_tolerance = plateau_tolerance
        self.min_stage_steps = min_stage_steps
        self._stage_starts: list[int] = []
        self._window: deque[tuple[int, float, float]] = deque(maxlen=plateau_window)

    def stage_starts(self) -> list[int]:
        return list(self._stage_starts)

    def observe(self, step: int, truncated_at_cap_frac: float, success: float) -> None:
        """Record step ``step``'s episodes; may start the next stage at ``step`` (see ``cap_at``)."""
        _check_observation(step, truncated_at_cap_frac, success)
        last = self._last_observed_step()
        if last is not None and step <= last:
            raise ValueError(f"observations must come in increasing step order: got step {step} after {last}")
        self._window.append((step, float(truncated_at_cap_frac), float(success)))
        if self._should_raise(step):
            self._stage_starts.append(step)
            self._window.clear()  # what was seen under the old cap says nothing about the new one

    def _should_raise(self, step: int) -> bool:
        stage = len(self._stage_starts)
        stage_start = self._stage_starts[-1] if self._stage_starts else 0
        if stage + 1 >= self.num_stages or step - stage_start < self.min_stage_steps:
            return False
        if len(self._window) < self.plateau_window:
            return False
        truncated = [t for _, t, _ in self._window]
        if sum(truncated) / len(truncated) < self.truncation_threshold:
            return False
        return success_improvement([s for _, _, s in self._window]) < self.plateau_tolerance

    def _last_observed_step(self) -> int | None:
        if self._window:
            return self._window[-1][0]
        return self._stage_starts[-1] if self._stage_starts else None

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "stage_starts": list(self._stage_starts),
                "window": [list(entry) for entry in self._window]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        stage_starts = list(state.get("stage_starts", []))
        _check_recorded_starts(stage_starts, self.num_stages)
        window = [(int(s), float(t), float(x)) for s, t, x in state.get("window", [])]
        floor = stage_starts[-1] if stage_starts else -1
        steps = [floor] + [s for s, _, _ in window]
        if any(later <= earlier for earlier, later in zip(steps, steps[1:])):
            raise HorizonConfigError(f"checkpoint horizon window is out of order: {state}")
        self._stage_starts = stage_starts
        self._window = deque(window, maxlen=self.plateau_window)


def success_improvement(successes: list[float]) -> float:
    """Mean of the newer half minus mean of the older half (the middle value skipped if odd)."""
    half = len(successes) // 2
    if half == 0:
        raise ValueError("need at least two successes to measure an improvement")
    older, newer = successes[:half], successes[-half:]
    return sum(newer) / half - sum(older) / half


def build_horizon(config: HorizonConfig, max_steps: int) -> HorizonSchedule:
    """The schedule of the ``learner.horizon`` section (checked when it was made) for a run of
    ``max_steps`` optimizer steps."""
    if config.kind == "stepwise":
        return StepwiseHorizon(config.turn_caps, resolve_boundaries(config, max_steps), config.boundary_fractions)
    if config.kind == "fixed":
        return FixedHorizon(config.turn_caps[0])
    return AdaptiveHorizon(config.turn_caps, config.truncation_threshold, config.plateau_window,
                           config.plateau_tolerance, config.min_stage_steps)


# --------------------------------------------------------------------------- validation


def _check_recorded_starts(stage_starts: list[int], num_stages: int) -> None:
    check_ints("checkpoint stage_starts", stage_starts)
    if len(stage_starts) > num_stages - 1:
        raise HorizonConfigError(
            f"checkpoint records {len(stage_starts)} stage changes but turn_caps has only {num_stages} stages"
        )
    if any(s < 0 for s in stage_starts) or any(b <= a for a, b in zip(stage_starts, stage_starts[1:])):
        raise HorizonConfigError(f"checkpoint stage_starts must be >= 0 and increasing, got {stage_starts}")


def _check_step(step: int) -> None:
    if not is_int(step) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")


def _check_observation(step: int, truncated_at_cap_frac: float, success: float) -> None:
    _check_step(step)
    if not 0.0 <= truncated_at_cap_frac <= 1.0:
        raise ValueError(f"truncated_at_cap_frac must lie in [0, 1], got {truncated_at_cap_frac}")
    if not math.isfinite(success):
        raise ValueError(f"success must be a finite number, got {success}")
