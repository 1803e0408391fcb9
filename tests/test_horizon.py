"""Stepwise horizon schedule: stage changes exactly at boundaries; bad schedules are rejected."""

import pytest

from learner.config import HorizonConfig
from learner.horizon import HorizonConfigError, StepwiseHorizon


def test_stage_changes_at_the_boundary_step():
    horizon = StepwiseHorizon(turn_caps=[4, 6, 8], boundaries=[10, 20])
    stages = {step: horizon.stage_at(step) for step in (0, 9, 10, 11, 19, 20, 10_000)}
    assert stages == {0: 0, 9: 0, 10: 1, 11: 1, 19: 1, 20: 2, 10_000: 2}
    assert [horizon.cap_at(step) for step in (9, 10, 20)] == [4, 6, 8]


def test_cap_depends_only_on_the_step_not_on_query_history():
    # a resumed run asks for step N first; it must see what an uninterrupted run sees at N
    horizon = StepwiseHorizon([2, 3, 5], [1, 4])
    out_of_order = {step: horizon.cap_at(step) for step in (6, 0, 4, 3, 1, 7, 2, 5)}
    assert [out_of_order[step] for step in range(8)] == [2, 3, 3, 3, 5, 5, 5, 5]


def test_single_stage_and_from_config():
    assert StepwiseHorizon([7], []).cap_at(123) == 7
    from_config = StepwiseHorizon.from_config(HorizonConfig())
    assert (from_config.turn_caps, from_config.boundaries) == ([4, 6, 8], [10, 20])
    assert from_config.cap_at(10) == 6


@pytest.mark.parametrize(
    ("turn_caps", "boundaries", "message"),
    [
        ([4, 6, 8], [10], "need 2 boundaries"),
        ([4, 6], [10, 20], "need 1 boundaries"),
        ([], [], "at least one stage"),
        ([4, 0], [5], "positive"),
        ([6, 4], [5], "must not decrease"),
        ([4, 6, 8], [10, 10], "strictly increasing"),
        ([4, 6, 8], [20, 10], "strictly increasing"),
        ([4, 6], [0], "> 0"),
        ([4, 6.5], [3], "integers"),
    ],
)
def test_bad_schedules_are_rejected_with_a_clear_error(turn_caps, boundaries, message):
    with pytest.raises(HorizonConfigError, match=message):
        StepwiseHorizon(turn_caps, boundaries)


def test_negative_step_is_rejected():
    with pytest.raises(ValueError, match="non-negative"):
        StepwiseHorizon([4, 6], [3]).stage_at(-1)
