"""Horizon schedules: where stages change, how bad schedules fail, and that resuming never moves a stage."""

import json
from pathlib import Path

import pytest

from common.config import ConfigError, load_config
from common.config.learner import HorizonConfig
from learner.horizon import (
    AdaptiveHorizon,
    FixedHorizon,
    HorizonConfigError,
    StepwiseHorizon,
    build_horizon,
    resolve_boundaries,
)

REPO = Path(__file__).resolve().parents[1]


def adaptive(**overrides) -> AdaptiveHorizon:
    params = dict(turn_caps=[2, 4, 8], truncation_threshold=0.3, plateau_window=4, plateau_tolerance=0.05,
                  min_stage_steps=6)
    return AdaptiveHorizon(**{**params, **overrides})


def feed(horizon, steps, truncated, success) -> list[int]:
    """Run the learner loop's order at each step: observe(s), then the cap for leases after s."""
    caps = []
    for step in steps:
        horizon.observe(step, truncated(step), success(step))
        caps.append(horizon.cap_at(step))
    return caps


def resumed_caps(make, resume_step: int, last_step: int, truncated, success, make_resumed=None) -> list[int]:
    """Caps at steps 1..last_step with a checkpoint (JSON, as in loop.json) and restart after ``resume_step``;
    ``make_resumed`` builds the restarted schedule (default ``make``: the same settings)."""
    first = make()
    caps = feed(first, range(1, resume_step + 1), truncated, success)
    state = json.loads(json.dumps(first.state_dict()))
    second = (make_resumed or make)()
    second.load_state_dict(state)
    return caps + feed(second, range(resume_step + 1, last_step + 1), truncated, success)


# --------------------------------------------------------------------------- fixed and stepwise


def test_fixed_cap_never_changes_and_ignores_observations():
    horizon = build_horizon(HorizonConfig(kind="fixed", turn_caps=[7], boundaries=[]), max_steps=50)
    assert isinstance(horizon, FixedHorizon)
    horizon.observe(3, truncated_at_cap_frac=1.0, success=0.0)
    assert {horizon.cap_at(step) for step in range(0, 200)} == {7}
    assert {horizon.stage_at(step) for step in range(0, 200)} == {0}


def test_stage_changes_at_the_boundary_step():
    horizon = StepwiseHorizon(turn_caps=[4, 6, 8], boundaries=[10, 20])
    stages = {step: horizon.stage_at(step) for step in (0, 9, 10, 11, 19, 20, 10_000)}
    assert stages == {0: 0, 9: 0, 10: 1, 11: 1, 19: 1, 20: 2, 10_000: 2}
    assert [horizon.cap_at(step) for step in (9, 10, 20)] == [4, 6, 8]


def test_cap_depends_only_on_the_step_not_on_query_history():
    horizon = StepwiseHorizon([2, 3, 5], [1, 4])
    out_of_order = {step: horizon.cap_at(step) for step in (6, 0, 4, 3, 1, 7, 2, 5)}
    assert [out_of_order[step] for step in range(8)] == [2, 3, 3, 3, 5, 5, 5, 5]


def test_default_config_and_from_config_keep_working():
    assert StepwiseHorizon([7], []).cap_at(123) == 7
    from_config = StepwiseHorizon.from_config(HorizonConfig())
    assert (from_config.turn_caps, from_config.boundaries) == ([4, 6, 8], [10, 20])
    assert build_horizon(HorizonConfig(), max_steps=5).boundaries == [10, 20]  # step boundaries ignore max_steps


def test_fraction_boundaries_scale_with_the_run_length_and_round_half_up():
    config = HorizonConfig(turn_caps=[2, 4, 6], boundaries=[], boundary_fractions=[0.25, 0.5])
    assert resolve_boundaries(config, 20) == [5, 10]
    assert resolve_boundaries(config, 100) == [25, 50]
    assert resolve_boundaries(config, 10) == [3, 5]  # 2.5 rounds up to 3
    horizon = build_horizon(config, max_steps=10)
    assert [horizon.cap_at(step) for step in range(7)] == [2, 2, 2, 4, 4, 6, 6]
    # 0.7 * 10 is 7.000000000000001 in floating point; it still means step 7
    assert resolve_boundaries(HorizonConfig(turn_caps=[1, 2], boundaries=[], boundary_fractions=[0.7]), 10) == [7]


@pytest.mark.parametrize(
    ("fractions", "max_steps", "message"),
    [
        ([0.3, 0.34], 10, "strictly increasing"),  # both round to step 3
        ([0.01], 10, ">= 1"),  # rounds to step 0
        ([0.0], 10, "strictly between 0 and 1"),
        ([1.0], 10, "strictly between 0 and 1"),
        ([0.6, 0.3], 100, "strictly increasing"),
    ],
)
def test_fractions_that_do_not_give_increasing_steps_are_refused_when_the_config_loads(fractions, max_steps, message):
    caps = [2, 4, 6][: len(fractions) + 1]
    with pytest.raises(ConfigError, match=message) as error:
        load_config(None, ["--learner.horizon.turn_caps", str(caps), "--learner.horizon.boundaries", "[]",
                           "--learner.horizon.boundary_fractions", str(fractions), "--run.max_steps", str(max_steps)])
    assert str(error.value).startswith("learner.horizon") or str(error.value).startswith("config: boundary")


def test_fractions_need_a_positive_run_length():
    config = HorizonConfig(turn_caps=[2, 4], boundaries=[], boundary_fractions=[0.5])
    with pytest.raises(HorizonConfigError, match="positive run.max_steps"):
        build_horizon(config, 0)


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


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kind": "linear"}, r"learner.horizon.kind: 'linear' is not one of \['fixed', 'stepwise', 'adaptive'\]"),
        ({"boundary_fractions": [0.5, 0.8]}, "not both"),  # default boundaries still set
        ({"turn_caps": [4, 6], "boundaries": []}, "need 1 boundaries"),
        ({"turn_caps": [4, 6, 8], "boundaries": [], "boundary_fractions": [0.5]}, "need 2 boundary_fractions"),
        ({"kind": "fixed", "turn_caps": [4, 6], "boundaries": []}, "exactly one turn cap"),
        ({"kind": "fixed", "turn_caps": [4]}, "takes no boundaries"),
        ({"kind": "adaptive", "turn_caps": [4, 8]}, "takes no boundaries"),
        ({"kind": "adaptive", "turn_caps": [4], "boundaries": []}, "at least two turn_caps"),
        ({"kind": "adaptive", "turn_caps": [4, 8], "boundaries": [], "plateau_window": 1},
         "learner.horizon.plateau_window must be >= 2, got 1"),
        ({"kind": "adaptive", "turn_caps": [4, 8], "boundaries": [], "truncation_threshold": 1.5},
         "learner.horizon.truncation_threshold must be <= 1"),
        ({"kind": "adaptive", "turn_caps": [4, 8], "boundaries": [], "min_stage_steps": -1}, "min_stage_steps"),
        ({"turn_caps": [4, 0, 8]}, r"learner.horizon.turn_caps\[1\] must be >= 1, got 0"),
        ({"turn_caps": [8, 6, 4]}, "must not decrease"),
    ],
)
def test_config_sections_that_cannot_be_followed_are_refused_when_the_config_loads(overrides, message):
    args = [item for key, value in overrides.items() for item in (f"--learner.horizon.{key}", str(value))]
    with pytest.raises(ConfigError, match=message):
        load_config(None, args)


def test_bad_steps_and_observations_are_rejected():
    horizon = StepwiseHorizon([4, 6], [3])
    with pytest.raises(ValueError, match="non-negative"):
        horizon.stage_at(-1)
    with pytest.raises(ValueError, match="truncated_at_cap_frac"):
        horizon.observe(1, truncated_at_cap_frac=1.5, success=0.0)
    with pytest.raises(ValueError, match="finite"):
        adaptive().observe(1, truncated_at_cap_frac=0.5, success=float("nan"))


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_file_has_a_followable_horizon(path):
    cfg = load_config(path)
    assert build_horizon(cfg.learner.horizon, cfg.run.max_steps).cap_at(0) >= 1


def test_kinds_and_fractions_can_be_chosen_from_the_command_line():
    cfg = load_config(None, ["--learner.horizon.kind", "adaptive", "--learner.horizon.boundaries", "[]",
                             "--learner.horizon.plateau_window", "3", "--run.max_steps", "40"])
    assert isinstance(build_horizon(cfg.learner.horizon, cfg.run.max_steps), AdaptiveHorizon)
    cfg = load_config(None, ["--learner.horizon.boundaries", "[]", "--learner.horizon.boundary_fractions",
                             "[0.25, 0.5]", "--run.max_steps", "40"])
    assert build_horizon(cfg.learner.horizon, cfg.run.max_steps).boundaries == [10, 20]


# --------------------------------------------------------------------------- adaptive


def always(value):
    return lambda step: value


def test_adaptive_raises_when_truncation_stays_high_and_success_plateaus():
    horizon = adaptive(min_stage_steps=6)
    caps = feed(horizon, range(1, 21), truncated=always(0.6), success=always(0.4))
    # stage 0 is old enough at step 6 (window full since step 4); the window restarts at the
    # raise, so stage 1 is judged from step 7 on and is old enough at step 12
    assert caps == [2] * 5 + [4] * 6 + [8] * 9
    assert horizon.stage_starts() == [6, 12]
    assert horizon.stage_at(5) == 0 and horizon.stage_at(6) == 1  # the history stays queryable


def test_adaptive_judges_each_stage_only_on_its_own_steps():
    # without a minimum stage length a stage still lasts a full window: observations made
    # under the previous cap do not count towards the next raise
    caps = feed(adaptive(min_stage_steps=0), range(1, 13), truncated=always(0.6), success=always(0.4))
    assert caps == [2] * 3 + [4] * 4 + [8] * 5


def test_adaptive_waits_for_the_minimum_stage_length():
    caps = feed(adaptive(min_stage_steps=15), range(1, 21), truncated=always(0.9), success=always(0.0))
    assert caps.index(4) + 1 == 15


def test_adaptive_holds_while_success_still_improves():
    improving = lambda step: 0.03 * step  # +0.06 between window halves, above the 0.05 tolerance
    caps = feed(adaptive(), range(1, 31), truncated=always(0.9), success=improving)
    assert set(caps) == {2}
    # the same run whose success flattens at step 16 is raised once the window sees the plateau
    flattening = lambda step: 0.03 * min(step, 16)
    caps = feed(adaptive(), range(1, 31), truncated=always(0.9), success=flattening)
    assert caps.index(4) + 1 == 17  # window 14..17: +0.045 between halves


def test_adaptive_holds_when_few_episodes_hit_the_cap():
    caps = feed(adaptive(), range(1, 31), truncated=always(0.1), success=always(0.2))
    assert set(caps) == {2}


def test_adaptive_observations_must_move_forward():
    horizon = adaptive()
    horizon.observe(3, 0.5, 0.5)
    with pytest.raises(ValueError, match="increasing step order"):
        horizon.observe(3, 0.5, 0.5)


def test_adaptive_state_round_trip_restores_stage_history_and_window():
    horizon = adaptive()
    feed(horizon, range(1, 9), truncated=always(0.6), success=always(0.4))
    restored = adaptive()
    restored.load_state_dict(json.loads(json.dumps(horizon.state_dict())))
    assert restored.state_dict() == horizon.state_dict()
    assert [restored.cap_at(s) for s in range(12)] == [horizon.cap_at(s) for s in range(12)]


def test_state_from_another_kind_or_schedule_is_rejected():
    with pytest.raises(HorizonConfigError, match="'stepwise' schedule"):
        adaptive().load_state_dict(StepwiseHorizon([2, 4], [5]).state_dict())
    with pytest.raises(HorizonConfigError, match="only 2 stages"):
        adaptive(turn_caps=[2, 4]).load_state_dict({"kind": "adaptive", "stage_starts": [6, 12], "window": []})
    with pytest.raises(HorizonConfigError, match="out of order"):
        adaptive().load_state_dict({"kind": "adaptive", "stage_starts": [6], "window": [[5, 0.5, 0.5]]})


# --------------------------------------------------------------------------- resume


# AgentGym-RL's StepRoundsScheduler counts steps itself: on resume its counter is set to N,
# the trainer then moves to step N + 1 without it, so every later boundary comes one step
# late, and a resume from a checkpoint exactly at a boundary advances a second time after the
# first resumed step. Here the cap is recomputed from the step (and recorded events), so a
# restart just before, at or just after a boundary must give the uninterrupted caps.


@pytest.mark.parametrize("resume_step", [4, 5, 6, 9, 10, 11, 1, 0])
@pytest.mark.parametrize(
    "config",
    [HorizonConfig(turn_caps=[2, 4, 8], boundaries=[5, 10]),
     HorizonConfig(turn_caps=[2, 4, 8], boundaries=[], boundary_fractions=[0.25, 0.5])],
    ids=["steps", "fractions"],
)
def test_stepwise_resume_never_moves_a_boundary(config, resume_step):
    make = lambda: build_horizon(config, max_steps=20)
    uninterrupted = feed(make(), range(1, 21), always(0.5), always(0.5))
    assert uninterrupted == [2] * 4 + [4] * 5 + [8] * 11
    assert resumed_caps(make, resume_step, 20, always(0.5), always(0.5)) == uninterrupted


def test_adaptive_resume_at_every_step_gives_the_uninterrupted_caps():
    # success climbs, plateaus, climbs again, plateaus; every third step no episode hits the cap,
    # so some windows fall under the truncation threshold
    success = lambda step: 0.04 * min(step, 8) + 0.04 * max(0, min(step, 24) - 12)
    truncated = lambda step: 0.0 if step % 3 == 0 else 0.5
    horizon = adaptive()
    uninterrupted = feed(horizon, range(1, 41), truncated, success)
    assert horizon.stage_starts() == [10, 26]  # real boundaries for the resumes to straddle
    for resume_step in range(0, 40):
        assert resumed_caps(adaptive, resume_step, 40, truncated, success) == uninterrupted, resume_step


@pytest.mark.parametrize("resume_step", [4, 5, 6, 9, 10, 11])
def test_a_resume_with_a_larger_max_steps_keeps_the_fraction_boundaries(resume_step):
    # Extending a run (--resume --max-steps 40 after a 20-step run) must not resolve the fractions
    # again: [0.25, 0.5] of 40 would move the stages from steps 5 and 10 to 10 and 20.
    config = HorizonConfig(turn_caps=[2, 4, 8], boundaries=[], boundary_fractions=[0.25, 0.5])
    uninterrupted = feed(build_horizon(config, max_steps=20), range(1, 41), always(0.5), always(0.5))
    assert uninterrupted == [2] * 4 + [4] * 5 + [8] * 31
    extended = resumed_caps(lambda: build_horizon(config, max_steps=20), resume_step, 40, always(0.5), always(0.5),
                            make_resumed=lambda: build_horizon(config, max_steps=40))
    assert extended == uninterrupted


def test_a_resume_refuses_a_schedule_that_moves_a_boundary():
    state = json.loads(json.dumps(StepwiseHorizon([2, 4, 8], [5, 10]).checkpoint_state(7)))
    with pytest.raises(HorizonConfigError, match="boundaries"):
        StepwiseHorizon([2, 4, 8], [6, 10]).restore(state, 7)
    fractions = build_horizon(HorizonConfig(turn_caps=[2, 4, 8], boundaries=[], boundary_fractions=[0.25, 0.5]), 20)
    with pytest.raises(HorizonConfigError, match="boundary_fractions"):
        build_horizon(HorizonConfig(turn_caps=[2, 4, 8], boundaries=[], boundary_fractions=[0.3, 0.5]), 20).restore(
            json.loads(json.dumps(fractions.checkpoint_state(7))), 7)


def test_a_resume_checks_the_recorded_stage_and_turn_cap():
    state = json.loads(json.dumps(FixedHorizon(5).checkpoint_state(3)))
    assert state["stage"] == 0 and state["turn_cap"] == 5
    FixedHorizon(5).restore(state, 3)
    with pytest.raises(HorizonConfigError, match="turn cap 5.*turn cap 7"):
        FixedHorizon(7).restore(state, 3)
    # a checkpoint written before the boundaries were saved: the stage check still guards it
    stepwise = {"kind": "stepwise", "stage": 1, "turn_cap": 4}
    StepwiseHorizon([2, 4, 8], [5, 10]).restore(stepwise, 7)
    with pytest.raises(HorizonConfigError, match="stage 1"):
        StepwiseHorizon([2, 4, 8], [8, 10]).restore(stepwise, 7)


def test_adaptive_min_stage_steps_must_outlast_the_window_and_the_staleness_bound():
    adaptive_args = ["--learner.horizon.kind", "adaptive", "--learner.horizon.boundaries", "[]",
                     "--learner.horizon.plateau_window", "5", "--learner.max_policy_lag", "2"]
    with pytest.raises(ConfigError, match=r"min_stage_steps \(6\).*plateau_window \+ max_policy_lag = 7"):
        load_config(None, [*adaptive_args, "--learner.horizon.min_stage_steps", "6"])
    assert load_config(None, [*adaptive_args, "--learner.horizon.min_stage_steps", "7"])
    # sync mode trains every batch at the version it was leased at: no stale episodes to wait out
    assert load_config(None, [*adaptive_args, "--learner.horizon.min_stage_steps", "5", "--run.mode", "sync"])
