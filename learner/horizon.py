"""ScalingInter-RL horizon schedule: the turn cap grows in stages as training goes on.

The stage is a pure function of the global learner step, so a run resumed from a checkpoint
at step N is in exactly the stage an uninterrupted run would be in at step N; the schedule
has no state of its own to save.

Step convention: ``step`` is the number of optimizer steps completed so far (the policy
version). Stage ``i + 1`` starts AT ``step == boundaries[i]``: with ``boundaries=[10]`` steps
0..9 are stage 0 and step 10 is stage 1, so the leases issued after the 10th optimizer step
already carry the larger cap.
"""

from __future__ import annotations

import bisect

from learner.config import HorizonConfig


class HorizonConfigError(ValueError):
    """A turn-cap schedule that cannot be followed."""


def _check_ints(name: str, values: list[int]) -> None:
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise HorizonConfigError(f"{name} must hold integers, got {value!r} in {values}")


def _validate(turn_caps: list[int], boundaries: list[int]) -> None:
    _check_ints("turn_caps", turn_caps)
    _check_ints("boundaries", boundaries)
    if not turn_caps:
        raise HorizonConfigError("turn_caps must name at least one stage")
    if len(boundaries) != len(turn_caps) - 1:
        raise HorizonConfigError(
            f"{len(turn_caps)} turn_caps need {len(turn_caps) - 1} boundaries (the step each later "
            f"stage starts), got {len(boundaries)}: turn_caps={turn_caps} boundaries={boundaries}"
        )
    if any(cap <= 0 for cap in turn_caps):
        raise HorizonConfigError(f"turn_caps must be positive, got {turn_caps}")
    if any(later < earlier for earlier, later in zip(turn_caps, turn_caps[1:])):
        raise HorizonConfigError(f"turn_caps must not decrease from stage to stage, got {turn_caps}")
    if boundaries and boundaries[0] <= 0:
        raise HorizonConfigError(f"boundaries must be > 0 (stage 0 starts at step 0), got {boundaries}")
    if any(later <= earlier for earlier, later in zip(boundaries, boundaries[1:])):
        raise HorizonConfigError(f"boundaries must be strictly increasing, got {boundaries}")


class StepwiseHorizon:
    """Turn cap ``turn_caps[i]`` from step ``boundaries[i - 1]`` (inclusive) to ``boundaries[i]``."""

    def __init__(self, turn_caps: list[int], boundaries: list[int]) -> None:
        _validate(list(turn_caps), list(boundaries))
        self.turn_caps = list(turn_caps)
        self.boundaries = list(boundaries)

    @classmethod
    def from_config(cls, config: HorizonConfig) -> StepwiseHorizon:
        """Build the schedule of the ``learner.horizon`` config section."""
        return cls(config.turn_caps, config.boundaries)

    @property
    def num_stages(self) -> int:
        return len(self.turn_caps)

    def stage_at(self, step: int) -> int:
        """Index of the stage in force after ``step`` completed optimizer steps."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        # bisect_right: a step equal to a boundary already belongs to the next stage.
        return bisect.bisect_right(self.boundaries, step)

    def cap_at(self, step: int) -> int:
        """Turn cap in force after ``step`` completed optimizer steps."""
        return self.turn_caps[self.stage_at(step)]
