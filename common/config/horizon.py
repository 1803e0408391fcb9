"""The ScalingInter-RL turn-cap schedule's section (``learner.horizon``) and the checks that a schedule
can be followed: run when the config loads, so a bad schedule never starts a run (the learner's
schedules, ``learner/horizon.py``, run the same checks on what they are built from).
"""

from __future__ import annotations

import math
from dataclasses import field
from typing import Annotated, Literal

from common.config.types import Count, Float, Ge, Int, NonNegative, NonNegativeInt, Share, section

HorizonKind = Literal["fixed", "stepwise", "adaptive"]


class HorizonConfigError(ValueError):
    """A turn-cap schedule that cannot be followed."""


@section
class HorizonConfig:
    """ScalingInter-RL turn-cap schedule; see ``learner/horizon.py`` for the step convention."""

    kind: HorizonKind = "stepwise"
    """``fixed`` (one cap), ``stepwise`` (stages start at set steps) or ``adaptive`` (raised on
    truncation at the cap plus a success plateau)."""
    turn_caps: list[Count] = field(default_factory=lambda: [4, 6, 8])
    """Turn cap of each stage, non-decreasing (ScalingInter-RL: small first, then longer
    horizons); exactly one for ``fixed``, at least two for ``adaptive``."""
    boundaries: list[Int] = field(default_factory=lambda: [10, 20])
    """``stepwise`` only: optimizer steps at which stage i+1 starts, one fewer than
    ``turn_caps``; set ``[]`` when using ``boundary_fractions`` or another kind."""
    boundary_fractions: list[Float] = field(default_factory=list)
    """``stepwise`` only, instead of ``boundaries``: stage starts as fractions of
    ``run.max_steps`` in (0, 1), rounded half up to steps."""
    truncation_threshold: Share = 0.3
    """``adaptive``: raise only if the mean share of episodes truncated at the cap over the
    window is at least this."""
    plateau_window: Annotated[Int, Ge(2)] = 5
    """``adaptive``: observed learner steps (of the current stage) that a decision looks at."""
    plateau_tolerance: NonNegative = 0.02
    """``adaptive``: success plateaued if its mean over the newer half of the window exceeds
    the older half's by less than this."""
    min_stage_steps: NonNegativeInt = 10
    """``adaptive``: never raise before the stage is this many steps old; at least
    ``plateau_window + learner.max_policy_lag`` (0 in sync mode), checked when the config loads, so
    stale episodes of the old cap do not decide."""

    def __post_init__(self) -> None:
        check_turn_caps(self.turn_caps)
        if self.kind == "stepwise":
            if self.boundaries and self.boundary_fractions:
                raise HorizonConfigError(
                    f"learner.horizon: give boundaries (steps) or boundary_fractions (of run.max_steps), not both; "
                    f"got boundaries={self.boundaries} boundary_fractions={self.boundary_fractions} "
                    f"(set the unused one to [])")
            if self.boundary_fractions:
                _check_fractions(self.turn_caps, self.boundary_fractions)
            else:
                check_boundaries(self.turn_caps, self.boundaries)
            return
        if self.boundaries or self.boundary_fractions:
            raise HorizonConfigError(
                f"learner.horizon: kind {self.kind!r} takes no boundaries; set boundaries: [] and "
                f"boundary_fractions: [] (got {self.boundaries} and {self.boundary_fractions})")
        if self.kind == "fixed" and len(self.turn_caps) != 1:
            raise HorizonConfigError(f"kind 'fixed' needs exactly one turn cap, got turn_caps={self.turn_caps}")
        if self.kind == "adaptive":
            check_adaptive_params(self.turn_caps, self.truncation_threshold, self.plateau_window,
                                  self.plateau_tolerance, self.min_stage_steps)


def resolve_boundaries(config: HorizonConfig, max_steps: int) -> list[int]:
    """Stage boundaries in steps; fractions become ``floor(f * max_steps + 0.5)`` (half up).

    After rounding they must be >= 1 and strictly increasing, else the run is too short for
    that many stages and the schedule is rejected.
    """
    if not config.boundary_fractions:
        return list(config.boundaries)
    fractions = list(config.boundary_fractions)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps <= 0:
        raise HorizonConfigError(f"boundary_fractions need a positive run.max_steps, got {max_steps!r}")
    steps = [math.floor(f * max_steps + 0.5) for f in fractions]
    if steps[0] <= 0 or any(b <= a for a, b in zip(steps, steps[1:])):
        raise HorizonConfigError(
            f"boundary_fractions {fractions} of run.max_steps={max_steps} round to steps {steps}; they must be "
            f">= 1 and strictly increasing (run too short for that many stages?)")
    return steps


def _check_fractions(turn_caps: list[int], fractions: list[float]) -> None:
    if not all(isinstance(f, float) and 0.0 < f < 1.0 for f in fractions):
        raise HorizonConfigError(f"boundary_fractions must lie strictly between 0 and 1, got {fractions}")
    if len(fractions) != len(turn_caps) - 1:
        raise HorizonConfigError(f"{len(turn_caps)} turn_caps need {len(turn_caps) - 1} boundary_fractions, got "
                                 f"{len(fractions)}: turn_caps={turn_caps} boundary_fractions={fractions}")
    if any(later <= earlier for earlier, later in zip(fractions, fractions[1:])):
        raise HorizonConfigError(f"boundary_fractions must be strictly increasing, got {fractions}")


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_ints(name: str, values: list[int]) -> None:
    for value in values:
        if not is_int(value):
            raise HorizonConfigError(f"{name} must hold integers, got {value!r} in {values}")


def check_turn_caps(turn_caps: list[int]) -> None:
    check_ints("turn_caps", turn_caps)
    if not turn_caps:
        raise HorizonConfigError("turn_caps must name at least one stage")
    if any(cap <= 0 for cap in turn_caps):
        raise HorizonConfigError(f"turn_caps must be positive, got {turn_caps}")
    if any(later < earlier for earlier, later in zip(turn_caps, turn_caps[1:])):
        raise HorizonConfigError(f"turn_caps must not decrease from stage to stage, got {turn_caps}")


def check_boundaries(turn_caps: list[int], boundaries: list[int]) -> None:
    check_ints("boundaries", boundaries)
    if len(boundaries) != len(turn_caps) - 1:
        raise HorizonConfigError(
            f"{len(turn_caps)} turn_caps need {len(turn_caps) - 1} boundaries (the step each later "
            f"stage starts), got {len(boundaries)}: turn_caps={turn_caps} boundaries={boundaries}")
    if boundaries and boundaries[0] <= 0:
        raise HorizonConfigError(f"boundaries must be > 0 (stage 0 starts at step 0), got {boundaries}")
    if any(later <= earlier for earlier, later in zip(boundaries, boundaries[1:])):
        raise HorizonConfigError(f"boundaries must be strictly increasing, got {boundaries}")


def check_adaptive_params(turn_caps: list[int], truncation_threshold: float, plateau_window: int,
                          plateau_tolerance: float, min_stage_steps: int) -> None:
    if len(turn_caps) < 2:
        raise HorizonConfigError(f"kind 'adaptive' needs at least two turn_caps to raise to, got {turn_caps}")
    if not 0.0 <= truncation_threshold <= 1.0:
        raise HorizonConfigError(f"truncation_threshold must lie in [0, 1], got {truncation_threshold}")
    if not is_int(plateau_window) or plateau_window < 2:
        raise HorizonConfigError(f"plateau_window must be an integer >= 2 steps, got {plateau_window!r}")
    if not math.isfinite(plateau_tolerance) or plateau_tolerance < 0:
        raise HorizonConfigError(f"plateau_tolerance must be finite and >= 0, got {plateau_tolerance}")
    if not is_int(min_stage_steps) or min_stage_steps < 0:
        raise HorizonConfigError(f"min_stage_steps must be an integer >= 0, got {min_stage_steps!r}")
