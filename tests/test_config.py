"""Config: YAML files, overrides, unknown keys, types, documentation, resolved output."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from common.config import Config, ConfigError, field_docs, load_config, write_resolved

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
    with pytest.raises(ConfigError, match="learner.algorithm.grpo_std_norm"):
        load_config(None, ["--learner.algorithm.grpo_std_norm", "3"])


def test_override_without_value_is_an_error():
    with pytest.raises(ConfigError, match="no value"):
        load_config(None, ["--run.max_steps"])


def _all_dataclasses(cls):
    yield cls
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type) or (isinstance(f.type, str) and dataclasses.is_dataclass(getattr(cls, f.name, None))):
            yield from _all_dataclasses(f.type)
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            yield from _all_dataclasses(type(default))


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
