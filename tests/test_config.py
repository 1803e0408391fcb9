"""Config: YAML files, overrides, unknown keys, types, documentation, resolved output."""

import dataclasses
import typing
from pathlib import Path

import pytest
import yaml

from common.config import Config, ConfigError, field_docs, load_config, write_resolved
from common.config.actors import ENGINE_ONLY_KNOBS
from common.config.learner import ESTIMATOR_SETTINGS, AlgorithmConfig, GaeSettings

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
    with pytest.raises(ConfigError, match="learner.algorithm.grpo.std_norm"):
        load_config(None, ["--learner.algorithm.grpo.std_norm", "3"])


def test_override_without_value_is_an_error():
    with pytest.raises(ConfigError, match="no value"):
        load_config(None, ["--run.max_steps"])


def _all_dataclasses(cls):
    """``cls`` and every dataclass its fields may hold (a section, or a section that may be unset)."""
    yield cls
    for hint in typing.get_type_hints(cls).values():
        for option in (hint, *typing.get_args(hint)):
            if dataclasses.is_dataclass(option):
                yield from _all_dataclasses(option)


def _choice_fields(cls, where=""):
    """(dotted key, allowed values) of every ``Literal`` field under ``cls``."""
    for name, hint in typing.get_type_hints(cls).items():
        key = f"{where}.{name}" if where else name
        if typing.get_origin(hint) is typing.Literal:
            yield key, typing.get_args(hint)
        elif dataclasses.is_dataclass(hint):
            yield from _choice_fields(hint, key)


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


@pytest.mark.parametrize("key, allowed", sorted(_choice_fields(Config)))
def test_a_value_outside_a_choice_names_the_key_and_the_choices(key, allowed):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"--{key}", "no-such-choice"])
    message = str(info.value)
    assert key in message and all(repr(choice) in message for choice in allowed), message


@pytest.mark.parametrize("estimator", sorted(ESTIMATOR_SETTINGS))
def test_an_estimator_section_applies_only_to_its_estimator(estimator):
    other = "rloo"  # has no section: every section is foreign to it
    field = dataclasses.fields(ESTIMATOR_SETTINGS[estimator])[0]
    override = [f"--learner.algorithm.{estimator}.{field.name}", "0.5" if field.type == "float" else "false"]
    with pytest.raises(ConfigError, match=f"learner.algorithm.{estimator} is set, but it applies only to advantage "
                                          f"{estimator}; advantage is {other}"):
        load_config(None, ["--learner.algorithm.advantage", other, *override])
    with pytest.raises(ConfigError, match=f"applies only to advantage {estimator}"):  # in a YAML file too
        load_config(None, [f"--learner.algorithm.{estimator}", "{}", "--learner.algorithm.advantage", other])
    chosen = load_config(None, ["--learner.algorithm.advantage", estimator, *override]).learner.algorithm
    assert getattr(chosen.settings, field.name) == yaml.safe_load(override[1])


def test_the_old_flat_estimator_knobs_are_unknown_keys_that_say_where_they_went():
    homes = {"lam": "gae.lam", "value_clip": "gae.value_clip", "critic_lr": "gae.critic_lr",
             "step_advantage_weight": "gigpo.step_advantage_weight",
             "grpo_std_norm": "grpo.std_norm or learner.algorithm.gigpo.std_norm",
             "gamma": "reinforce_pp.gamma or learner.algorithm.gae.gamma or learner.algorithm.gigpo.gamma"}
    for knob, home in homes.items():
        with pytest.raises(ConfigError, match=f"unknown config key 'learner.algorithm.{knob}'") as error:
            load_config(None, ["--learner.algorithm.advantage", "gae", f"--learner.algorithm.{knob}", "0.5"])
        assert str(error.value).endswith(f"it is now a setting of its estimator: learner.algorithm.{home}")


def test_unset_estimator_settings_are_the_defaults_and_estimators_can_be_swapped():
    assert AlgorithmConfig().settings == ESTIMATOR_SETTINGS["grpo"]()
    assert AlgorithmConfig(advantage="rloo").settings is None
    # A section that holds only defaults reads as unset, however the config was written.
    assert AlgorithmConfig(advantage="gae", gae=GaeSettings()) == AlgorithmConfig(advantage="gae")
    assert dataclasses.replace(AlgorithmConfig(), advantage="gae").settings == GaeSettings()
    with pytest.raises(ValueError, match="applies only to advantage gae"):
        dataclasses.replace(AlgorithmConfig(advantage="gae", gae=GaeSettings(lam=0.9)), advantage="grpo")


def test_the_resolved_config_writes_out_the_chosen_estimators_settings(tmp_path):
    cfg = load_config(REPO / "configs" / "default.yaml", ["--learner.algorithm.gigpo.step_advantage_weight", "0.5"])
    write_resolved(cfg, tmp_path / "config.yaml")
    algorithm = yaml.safe_load((tmp_path / "config.yaml").read_text())["learner"]["algorithm"]
    assert algorithm["gigpo"] == {"gamma": 0.8, "step_advantage_weight": 0.5, "std_norm": True}
    assert algorithm["gae"] is None and algorithm["grpo"] is None
    assert load_config(tmp_path / "config.yaml") == cfg
    grpo = load_config(None, ["--run.seed", "1"])  # defaults only: written out all the same
    write_resolved(grpo, tmp_path / "grpo.yaml")
    assert yaml.safe_load((tmp_path / "grpo.yaml").read_text())["learner"]["algorithm"]["grpo"] == {"std_norm": True}
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
