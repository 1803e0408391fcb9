"""The run configuration: frozen dataclasses, sparse YAML files, one override grammar.

``load_config("configs/smoke.yaml", ["--learner.lr", "1e-4"])`` merges, in order: the dataclass
defaults, the YAML file, then ``--section.key value`` overrides (values parsed as YAML, so
``3``, ``1e-4``, ``true`` and ``[2, 4]`` mean what they look like). Unknown keys are rejected
with the valid ones listed; every value is checked against its field's type (``common/typed_build.py``,
the validator the wire protocol uses too), a closed choice (a ``Literal``) against its values.
Each field's documentation is the string literal under it (see ``field_docs``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from common import typed_build
from common.config.actors import ActorsConfig
from common.config.envhub import EnvhubConfig
from common.config.learner import ESTIMATOR_SETTINGS, LearnerConfig


class ConfigError(ValueError):
    """A configuration file or override that does not fit the schema."""


RunMode = Literal["async", "sync"]
ModelDtype = Literal["float32", "bfloat16"]
WarmStart = Literal["", "keydoor"]


@dataclass(frozen=True)
class RunSection:
    output_dir: str = "runs"
    """Folder that holds one sub-folder per run."""
    run_name: str = ""
    """Name of the run folder; empty picks ``run-<timestamp>``."""
    max_steps: int = 20
    """Learner optimizer steps before the run stops."""
    max_wall_s: float = 0.0
    """Also stop once the learner has trained this many seconds (0: no time limit); the run
    ends as at ``max_steps``: final validation (``learner.eval_at_end``), checkpoint, summary."""
    seed: int = 0
    """Seed for task sampling, sampling on the actors and model init."""
    progress_interval_s: float = 2.0
    """How often the launcher prints the progress line."""
    resume: bool = False
    """Continue this run folder from its latest checkpoint that has a ``COMPLETE`` marker."""
    deterministic: bool = False
    """Deterministic torch kernels in the learner (same data -> same parameters, resume included)."""
    replay: str = ""
    """A recorded ``trajectories/`` folder to train on instead of live actors (no envhub, no actors)."""
    mode: RunMode = "async"
    """``async`` (generation, env steps and training overlap, within ``learner.max_policy_lag``) or
    ``sync``: the reference systems' loop on the same actors, learner and envs (lease one batch,
    wait for its slowest episode, train, broadcast, then lease the next; ``max_policy_lag`` is 0)."""

    def __post_init__(self) -> None:
        if self.mode not in typing.get_args(RunMode):
            raise ValueError(f"run.mode must be async or sync, got {self.mode!r}")


@dataclass(frozen=True)
class ModelSection:
    name: str = "tiny"
    """``tiny`` (random 1M-parameter Qwen2), ``smollm2-135m``, or a local HF model folder."""
    cache_dir: str = ""
    """Where built or converted models are cached; empty: $LONGHORIZON_CACHE, else ~/.cache/longhorizon."""
    dtype: ModelDtype = "float32"
    """Parameter dtype of the actors' engines and of the weights they receive: float32 or bfloat16.
    The learner keeps float32 master weights and optimizer state whatever it is; bfloat16 makes it
    compute in bfloat16, as ``learner.mixed_precision`` (``learner.model.computes_in_bfloat16``)."""
    warm_start: WarmStart = ""
    """``keydoor``: before the run the launcher trains from a warm start of the tiny model (a short
    supervised pass on random *admissible* keydoor actions, ``launcher/warm_start.py``: the format,
    no policy), made once per keydoor options and prompt and cached in ``cache_dir``; empty: none."""

    def __post_init__(self) -> None:
        if self.warm_start not in typing.get_args(WarmStart):
            raise ValueError(f"model.warm_start must be '' or keydoor, got {self.warm_start!r}")
        if self.warm_start and self.name != "tiny":
            raise ValueError(f"model.warm_start keydoor starts from the tiny model, not {self.name!r}")


@dataclass(frozen=True)
class RolloutSection:
    envs: list[str] = field(default_factory=lambda: ["keydoor-v0"])
    """Environment ids to train on; tasks are drawn round-robin across them."""
    split: str = "train"
    """Task split used for training."""
    group_size: int = 4
    """Episodes per task lease (the GRPO group)."""
    temperature: float = 1.0
    """Sampling temperature; the learner uses the same one for its logprobs."""
    eval_greedy: bool = False
    """Held-out episodes (``learner.eval_*``) take the most likely token instead of sampling at
    ``temperature``: one deterministic score per task (use ``learner.eval_samples`` 1)."""
    max_new_tokens: int = 24
    """Token cap of one assistant turn."""
    max_episode_tokens: int = 1024
    """Token budget of a whole episode (prompt, observations and actions)."""
    system_prompt: str = "You are an agent. Reply with one action."
    """System message at the start of every episode; empty for none."""
    conversation_start: bool = True
    """Open each episode as AgentGym's clients do: the env's instruction as a user turn, the
    assistant's acknowledgement, then worked example exchanges, then the first observation (all
    context, never trained on). False: the instruction is prepended to the first observation and
    no example is shown."""
    num_examples: int = -1
    """Worked example exchanges before the first observation; -1: each env's own default (the
    number that helps a small model write its action format)."""
    conversation_per_env: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per-env overrides of ``conversation_start`` and ``num_examples``, e.g.
    ``{search-v0: {num_examples: 0}}``."""

    def __post_init__(self) -> None:
        for env_id, overrides in {"rollout": {"conversation_start": self.conversation_start,
                                              "num_examples": self.num_examples},
                                  **self.conversation_per_env}.items():
            unknown = set(overrides) - {"conversation_start", "num_examples"}
            if unknown:
                raise ValueError(f"conversation_per_env.{env_id}: unknown keys {sorted(unknown)}; "
                                 "valid: conversation_start, num_examples")
            if not isinstance(overrides.get("conversation_start", True), bool):
                raise ValueError(f"{env_id}: conversation_start must be true or false")
            examples = overrides.get("num_examples", -1)
            if isinstance(examples, bool) or not isinstance(examples, int) or examples < -1:
                raise ValueError(f"{env_id}: num_examples must be an int >= -1 (-1: the env's default), "
                                 f"got {examples!r}")

    def conversation_for(self, env_id: str) -> tuple[bool, int | None]:
        """(conversation start on?, examples to show or None for the env's default) for ``env_id``."""
        overrides = self.conversation_per_env.get(env_id, {})
        examples = overrides.get("num_examples", self.num_examples)
        return overrides.get("conversation_start", self.conversation_start), None if examples < 0 else examples


@dataclass(frozen=True)
class Config:
    run: RunSection = field(default_factory=RunSection)
    """Run-level settings."""
    model: ModelSection = field(default_factory=ModelSection)
    """Which policy model to train."""
    rollout: RolloutSection = field(default_factory=RolloutSection)
    """What an episode is; shared by actors and learner."""
    envhub: EnvhubConfig = field(default_factory=EnvhubConfig)
    """Environment server."""
    actors: ActorsConfig = field(default_factory=ActorsConfig)
    """Rollout processes."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """Training process(es)."""

    def __post_init__(self) -> None:
        if self.model.warm_start == "keydoor" and self.rollout.envs != ["keydoor-v0"]:
            raise ValueError(f"model.warm_start keydoor is a warm start for keydoor-v0 runs; rollout.envs is "
                             f"{self.rollout.envs}")
        horizon = self.learner.horizon
        lag = 0 if self.run.mode == "sync" else self.learner.max_policy_lag
        if horizon.kind == "adaptive" and horizon.min_stage_steps < horizon.plateau_window + lag:
            raise ValueError(
                f"learner.horizon.min_stage_steps ({horizon.min_stage_steps}) must be at least plateau_window + "
                f"max_policy_lag = {horizon.plateau_window + lag}: episodes leased before a raise still run under "
                f"the old cap and arrive up to max_policy_lag steps later; a shorter stage would let them fill the "
                f"next window and trigger a second raise at once")


# --------------------------------------------------------------------------- documentation


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Map each dataclass field to the string literal written under it."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, following in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
                docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


# --------------------------------------------------------------------------- loading


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults, then the YAML file, then ``--section.key value`` overrides."""
    tree: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: top level must be a mapping of sections")
        tree = loaded
    for dotted, value in parse_overrides(overrides):
        _set_dotted(tree, dotted.split("."), value)
    return _build(Config, tree, "")


def parse_overrides(args: list[str] | tuple[str, ...]) -> list[tuple[str, Any]]:
    """``["--a.b", "3", "--c.d=x"]`` -> ``[("a.b", 3), ("c.d", "x")]``."""
    pairs, i = [], 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(f"expected --section.key, got {arg!r}")
        if "=" in arg:
            key, raw = arg[2:].split("=", 1)
            i += 1
        elif i + 1 < len(args):
            key, raw = arg[2:], args[i + 1]
            i += 2
        else:
            raise ConfigError(f"override {arg} has no value")
        pairs.append((key, yaml.safe_load(raw) if raw != "" else ""))
    return pairs


def _set_dotted(tree: dict, keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        node = tree.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set {'.'.join(keys)}: {key} is not a section")
        tree = node
    tree[keys[-1]] = value


def _build(cls: type, values: Any, where: str) -> Any:
    return typed_build.build(cls, values, where, _YAML)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """A plain value read from YAML or an override, as the field's class ``hint`` wants it."""
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):
        return _parse_float(value, where)  # YAML 1.1 reads "1e-3" (no dot) as a string
    if hint is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # a run name like 42 is meant as text
    if hint is type(None):
        if value is not None:
            raise ConfigError(f"{where}: expected null, got {value!r}")
        return None
    if isinstance(value, bool) and hint is not bool:
        raise ConfigError(f"{where}: expected {hint.__name__}, got {value!r}")
    if not isinstance(value, hint):
        raise ConfigError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def _parse_float(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{where}: expected float, got {text!r}") from None


def _unknown_keys(where: str, unknown: list[str], valid: list[str]) -> str:
    message = f"unknown config key {typed_build.joined(where, unknown[0])!r}; valid keys here: {', '.join(valid)}"
    if where == "learner.algorithm":  # a knob that moved into its estimator's section (gamma, lam, ...)
        homes = [f"{where}.{name}.{unknown[0].removeprefix('grpo_')}" for name, settings in ESTIMATOR_SETTINGS.items()
                 if unknown[0].removeprefix("grpo_") in {f.name for f in dataclasses.fields(settings)}]
        if homes:
            message += f"; it is now a setting of its estimator: {' or '.join(homes)}"
    return message


def _no_match(where: str, value: Any, hint: Any, errors: list[Exception]) -> Exception:
    """A section that may be unset (``X | None``) says what is wrong inside it, not that it is not null."""
    return errors[0] if value is not None else ConfigError(f"{where}: {value!r} matches none of {hint}")


_YAML = typed_build.Dialect(
    error=lambda message, reason: ConfigError(message),
    shown=repr,
    mapping="mapping",
    scalar=_coerce,
    unknown_keys=_unknown_keys,
    no_match=_no_match,
)
"""How the config words and raises what the shared checks find: every error names the dotted key."""


# --------------------------------------------------------------------------- writing


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain data, the selected estimator's settings written out (defaults included)."""
    tree = dataclasses.asdict(cfg)
    algorithm = cfg.learner.algorithm
    if algorithm.settings is not None:
        tree["learner"]["algorithm"][algorithm.advantage] = dataclasses.asdict(algorithm.settings)
    return tree


def write_resolved(cfg: Config, path: Path) -> None:
    """Write the fully resolved config (every key, defaults included) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
