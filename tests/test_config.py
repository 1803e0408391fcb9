"""Config: YAML files, overrides, unknown keys, types, documentation, resolved output."""

import argparse
import dataclasses
import types
import typing
from pathlib import Path

import pytest
import yaml

from common.config import Config, ConfigError, field_docs, load_config, write_resolved
from common.config.actors import ENGINE_ONLY_KNOBS
from common.config.command_line import parse_command_line
from common.config.learner import ALGORITHMS, AlgorithmBase, GaeAlgorithm, algorithm_config, with_advantage

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_file_loads(path):
    assert isinstance(load_config(path), Config)


def test_overrides_take_precedence_and_parse_types(tmp_path):
    base = tmp_path / "c.yaml"
    base.write_text("learner:\n  lr: 0.5\nrun:\n  max_steps: 3\n")
    cfg = load_config(base, ["--learner.lr", "1e-3", "--learner.horizon.turn_caps", "[2, 4]",
                             "--learner.horizon.boundaries=[5]", "--rollout.envs", "[a-v0, b-v1]"])
    assert cfg.learner.lr == 1e-3 and cfg.run.max_steps == 3
    assert cfg.learner.horizon.turn_caps == [2, 4] and cfg.learner.horizon.boundaries == [5]
    assert cfg.rollout.envs == ["a-v0", "b-v1"]


def test_unknown_key_names_the_key_and_the_valid_ones():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["--learner.learning_rate", "1"])
    message = str(info.value)
    assert "learner.learning_rate" in message and "lr" in message and "groups_per_step" in message


def test_unknown_section_is_rejected():
    with pytest.raises(ConfigError, match="unknown config key 'trainer'"):
        load_config(None, ["--trainer.lr", "1"])


def test_wrong_type_is_rejected():
    with pytest.raises(ConfigError, match="run.max_steps"):
        load_config(None, ["--run.max_steps", "many"])
    with pytest.raises(ConfigError, match="learner.algorithm.std_norm: expected bool, got 3"):
        load_config(None, ["--learner.algorithm.std_norm", "3"])


def test_override_without_value_is_an_error():
    with pytest.raises(ConfigError, match="no value"):
        load_config(None, ["--run.max_steps"])


def _sections(hint):
    """The sections a field of type ``hint`` may hold: itself, an unset-able one's, each option of a union."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    return [option for option in options if dataclasses.is_dataclass(option)]


def _all_dataclasses(cls):
    """``cls`` and every dataclass its fields may hold (a section, or a section that may be unset)."""
    yield cls
    for hint in typing.get_type_hints(cls).values():
        for option in (hint, *typing.get_args(hint)):
            for section in _sections(option):
                yield from _all_dataclasses(section)


def _choice_fields(cls, where=""):
    """(dotted key, allowed values) of every ``Literal`` field under ``cls`` (a union's tag excepted:
    each option's is one value; ``learner.algorithm.advantage`` is the union's choice)."""
    for name, hint in typing.get_type_hints(cls).items():
        key = f"{where}.{name}" if where else name
        if typing.get_origin(hint) is typing.Literal and len(typing.get_args(hint)) > 1:
            yield key, typing.get_args(hint)
        sections = _sections(hint)
        if len(sections) > 1:  # a discriminated union: its tag is the choice
            yield f"{key}.advantage", tuple(typing.get_args(typing.get_type_hints(o)["advantage"])[0] for o in sections)
        for section in sections:
            yield from _choice_fields(section, key)


def test_every_field_has_a_docstring_and_configs_are_frozen():
    for cls in set(_all_dataclasses(Config)):
        docs = field_docs(cls)
        undocumented = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not undocumented, f"{cls.__name__}: fields without a docstring: {undocumented}"
        assert cls.__dataclass_params__.frozen, f"{cls.__name__} must be frozen"


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config(REPO / "configs" / "smoke.yaml", ["--run.seed", "5"])
    write_resolved(cfg, tmp_path / "config.yaml")
    tree = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert tree["run"]["seed"] == 5 and "envhub" in tree and "lr" in tree["learner"]
    assert load_config(tmp_path / "config.yaml") == cfg


def test_env_options_accept_a_mapping_per_env():
    cfg = load_config(None, ["--envhub.env_options", "{textcraft-v0: {recipes_dir: /r, distractors: 4}}"])
    assert cfg.envhub.env_options == {"textcraft-v0": {"recipes_dir": "/r", "distractors": 4}}
    with pytest.raises(ConfigError, match="envhub.env_options"):
        load_config(None, ["--envhub.env_options", "[1, 2]"])


def test_a_warm_start_is_for_the_tiny_model_on_keydoor_and_engine_dtypes_are_checked():
    assert load_config(REPO / "configs" / "default.yaml").model.warm_start == "keydoor"  # the default job
    with pytest.raises(ConfigError, match="starts from the tiny model"):
        load_config(None, ["--model.name", "smollm2-135m", "--model.warm_start", "keydoor"])
    with pytest.raises(ConfigError, match="warm start for keydoor-v0 runs"):
        load_config(None, ["--model.warm_start", "keydoor", "--rollout.envs", "[babyai-v0]"])
    with pytest.raises(ConfigError, match="engine_dtype"):
        load_config(None, ["--actors.engine_dtype", "float16"])


def test_the_closed_choices_are_typed_and_checked():
    choices = dict(_choice_fields(Config))
    for key in ("run.mode", "model.dtype", "actors.engine", "actors.env_transport", "learner.reduce_gradients",
                "learner.horizon.kind", "learner.algorithm.advantage", "learner.algorithm.loss_agg",
                "learner.algorithm.kl_estimator"):
        assert key in choices, f"{key} is not a Literal"


@pytest.mark.parametrize("key, allowed", sorted(dict(_choice_fields(Config)).items()))
def test_a_value_outside_a_choice_names_the_key_and_the_choices(key, allowed):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"--{key}", "no-such-choice"])
    message = str(info.value)
    assert key in message and all(repr(choice) in message for choice in allowed), message


def _own_settings(advantage):
    """The keys ``advantage``'s section adds to the knobs every estimator shares."""
    return sorted({f.name for f in dataclasses.fields(ALGORITHMS[advantage])} -
                  {f.name for f in dataclasses.fields(AlgorithmBase)})


@pytest.mark.parametrize("advantage", sorted(ALGORITHMS))
def test_the_advantage_picks_its_section_and_another_estimators_setting_is_an_unknown_key(advantage):
    cfg = load_config(None, ["--learner.algorithm.advantage", advantage, "--learner.algorithm.clip_eps", "0.3"])
    assert type(cfg.learner.algorithm) is ALGORITHMS[advantage] and cfg.learner.algorithm.clip_eps == 0.3
    for setting in _own_settings(advantage):
        others = [name for name in ALGORITHMS if setting not in _own_settings(name)]
        value = "false" if setting == "std_norm" else "0.5"
        override = [f"--learner.algorithm.{setting}", value]
        chosen = load_config(None, ["--learner.algorithm.advantage", advantage, *override])
        assert getattr(chosen.learner.algorithm, setting) == yaml.safe_load(value)
        for other in others:
            with pytest.raises(ConfigError, match=f"^unknown config key 'learner.algorithm.{setting}'; valid keys "
                                                  f"here: .*; {setting} is a setting of advantage .*{advantage}"):
                load_config(None, ["--learner.algorithm.advantage", other, *override])


def test_the_old_estimator_sections_are_unknown_keys_that_say_where_the_settings_went():
    with pytest.raises(ConfigError, match=r"unknown config key 'learner.algorithm.gae'.*an estimator's settings "
                                          r"are keys of learner.algorithm itself \(learner.algorithm.critic_lr, "
                                          r"learner.algorithm.gamma, learner.algorithm.lam, "
                                          r"learner.algorithm.value_clip\), with learner.algorithm.advantage gae$"):
        load_config(None, ["--learner.algorithm.advantage", "gae", "--learner.algorithm.gae.lam", "0.5"])
    with pytest.raises(ConfigError, match="std_norm is a setting of advantage grpo or gigpo: write "
                                          "learner.algorithm.std_norm$"):
        load_config(None, ["--learner.algorithm.grpo_std_norm", "false"])
    with pytest.raises(ConfigError, match=r"learner.algorithm.advantage: 'ppo' is not one of \['grpo', 'rloo'"):
        load_config(None, ["--learner.algorithm.advantage", "ppo"])


def test_an_algorithm_section_is_built_and_switched_as_a_config_is():
    assert algorithm_config() == ALGORITHMS["grpo"]() and algorithm_config("rloo").advantage == "rloo"
    gae = with_advantage(algorithm_config("gigpo", gamma=0.8, minibatches=4), "gae", lam=0.9)
    assert type(gae) is GaeAlgorithm and (gae.minibatches, gae.lam, gae.gamma) == (4, 0.9, 1.0)
    with pytest.raises(ValueError, match="advantage must be one of"):
        algorithm_config("ppo")
    with pytest.raises(ValueError, match="lam"):
        algorithm_config("grpo", lam=0.9)  # not grpo's: refused in code as in a config file


def test_the_resolved_config_writes_out_the_chosen_estimators_settings(tmp_path):
    cfg = load_config(REPO / "configs" / "default.yaml", ["--learner.algorithm.step_advantage_weight", "0.5"])
    write_resolved(cfg, tmp_path / "config.yaml")
    algorithm = yaml.safe_load((tmp_path / "config.yaml").read_text())["learner"]["algorithm"]
    assert algorithm["advantage"] == "gigpo"
    assert {key: algorithm[key] for key in _own_settings("gigpo")} == {"gamma": 0.8, "step_advantage_weight": 0.5,
                                                                       "std_norm": True}
    assert load_config(tmp_path / "config.yaml") == cfg
    grpo = load_config(None, ["--run.seed", "1"])  # defaults only: written out all the same
    write_resolved(grpo, tmp_path / "grpo.yaml")
    assert yaml.safe_load((tmp_path / "grpo.yaml").read_text())["learner"]["algorithm"]["std_norm"] is True
    assert load_config(tmp_path / "grpo.yaml") == grpo


@pytest.mark.parametrize("knob", sorted(ENGINE_ONLY_KNOBS))
def test_an_engine_knob_set_under_the_other_engine_is_an_error(knob):
    engine = ENGINE_ONLY_KNOBS[knob]
    other = "cpu" if engine == "vllm" else "vllm"
    value, expected = ("0.5", 0.5) if "utilization" in knob else ("true", True) if "eager" in knob else ("7", 7.0)
    with pytest.raises(ConfigError, match=f"actors.{knob} applies only to engine {engine}; engine is {other}"):
        load_config(None, ["--actors.engine", other, f"--actors.{knob}", value])
    chosen = load_config(None, ["--actors.engine", engine, f"--actors.{knob}", value]).actors
    assert getattr(chosen, knob) == expected


def test_a_kl_estimator_without_a_kl_term_is_an_error():
    with pytest.raises(ConfigError, match="kl_estimator k2 applies only with kl_coef > 0"):
        load_config(None, ["--learner.algorithm.kl_estimator", "k2"])
    with_kl = ["--learner.algorithm.kl_coef", "0.1", "--learner.algorithm.kl_estimator", "k2"]
    assert load_config(None, with_kl).learner.algorithm.kl_estimator == "k2"


def _bounded_fields(cls, where=""):
    """(dotted key, a value just past its bound) of every scalar field under ``cls`` with a range."""
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        key = f"{where}.{name}" if where else name
        plain = typing.get_type_hints(cls)[name]
        if dataclasses.is_dataclass(plain):
            yield from _bounded_fields(plain, key)
            continue
        for bound in getattr(hint, "__metadata__", ()):
            step = 1 if plain is int else 0.0005
            past = {"ge": -step, "gt": 0, "le": step, "lt": 0}
            for attr, offset in past.items():
                if hasattr(bound, attr):
                    yield key, getattr(bound, attr) + offset


@pytest.mark.parametrize("key, value", sorted(_bounded_fields(Config)))
def test_a_value_past_a_fields_bound_is_refused_naming_the_key_and_the_bound(key, value):
    with pytest.raises(ConfigError, match=rf"^{key.replace('.', '[.]')} must be [<>]=? \S+, got {value!r}$"):
        load_config(None, [f"--{key}", repr(value)])


def test_the_ranges_hold_what_runs_use():
    assert len(list(_bounded_fields(Config))) > 40  # every count, timeout, share and coefficient
    for key, value in [("learner.lr", "0"), ("run.max_steps", "0"), ("rollout.num_examples", "-1"),
                       ("learner.algorithm.format_coef", "0.9"), ("envhub.port", "0")]:
        load_config(None, [f"--{key}", value])  # a learning-rate-0 control, an evaluation, the env's default


def test_a_run_needs_an_env():
    with pytest.raises(ConfigError, match=r"^rollout.envs must hold at least 1 item\(s\), got \[\]$"):
        load_config(None, ["--rollout.envs", "[]"])


@pytest.mark.parametrize("text", [".nan", ".inf", "-.inf"])
def test_nan_and_infinity_are_refused(text):
    with pytest.raises(ConfigError, match="learner.lr: expected a finite number"):
        load_config(None, ["--learner.lr", text])


def test_a_float_written_without_a_dot_and_a_numeric_name_read_as_meant(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("learner:\n  lr: 1e-3\nrun:\n  run_name: 42\n")  # YAML 1.1 reads 1e-3 as a string
    cfg = load_config(path)
    assert cfg.learner.lr == 1e-3 and cfg.run.run_name == "42"
    with pytest.raises(ConfigError, match=r"run.max_steps: expected int, got 2.5"):
        load_config(None, ["--run.max_steps", "2.5"])
    with pytest.raises(ConfigError, match=r"learner.mixed_precision: expected bool, got 1"):
        load_config(None, ["--learner.mixed_precision", "1"])


def test_the_reference_states_each_range():
    from common.config_reference import reference
    text = reference()
    for row in ("| `group_size` | `int >= 1` |", "| `format_coef` | `float in [0, 1)` |",
                "| `port` | `int in [0, 65535]` |", "| `kind` | `'fixed' \\| 'stepwise' \\| 'adaptive'` |"):
        assert row in text, row


def test_one_command_line_path_keeps_overrides_apart_and_reads_short_flags_as_the_section():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    args, overrides = parse_command_line(parser, ["--runs-dir=my-runs", "--config", "c.yaml", "--learner.lr", "-1",
                                                  "--step-timeout-s", "5"], short_section="envhub")
    assert args.config == "c.yaml"
    assert overrides == ["--envhub.runs_dir=my-runs", "--envhub.step_timeout_s", "5", "--learner.lr", "-1"]
    with pytest.raises(SystemExit):  # without a short section, an unknown flag is the parser's usage error
        parse_command_line(parser, ["--actor", "3"])
