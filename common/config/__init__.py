"""The run configuration: frozen dataclasses, sparse YAML files, one override grammar.

``load_config("configs/smoke.yaml", ["--learner.lr", "1e-4"])`` merges, in order: the dataclass
defaults, the YAML file, then ``--section.key value`` overrides (values parsed as YAML, so
``3``, ``1e-4``, ``true`` and ``[2, 4]`` mean what they look like). Sections are pydantic
dataclasses (``common/config/types.py``): unknown keys are rejected with the valid ones listed, every
value is checked against its field's type and constraint, a closed choice (a ``Literal``) against its
values, and a section's own checks (``__post_init__``) run as it is made; the first problem is
reported as one line naming its dotted key (``common/config/errors.py``). Each field's documentation
is the string literal under it (see ``field_docs``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import TypeAdapter, ValidationError

from common.config.actors import ActorsConfig
from common.config.envhub import EnvhubConfig
from common.config.errors import ConfigError, config_error
from common.config.horizon import resolve_boundaries
from common.config.learner import LearnerConfig
from common.config.types import Bool, Count, Ge, Int, MinLen, NonNegative, NonNegativeInt, Positive, Str, section

__all__ = ["Config", "ConfigError", "field_docs", "load_config", "parse_overrides", "to_dict", "write_resolved"]

RunMode = Literal["async", "sync"]
ModelDtype = Literal["float32", "bfloat16"]
WarmStart = Literal["", "keydoor"]


@section
class RunSection:
    output_dir: Str = "runs"
    """Folder that holds one sub-folder per run."""
    run_name: Str = ""
    """Name of the run folder; empty picks ``run-<timestamp>``."""
    max_steps: NonNegativeInt = 20
    """Learner optimizer steps before the run stops."""
    max_wall_s: NonNegative = 0.0
    """Also stop once the learner has trained this many seconds (0: no time limit); the run
    ends as at ``max_steps``: final validation (``learner.eval_at_end``), checkpoint, summary."""
    seed: Int = 0
    """Seed for task sampling, sampling on the actors and model init."""
    progress_interval_s: Positive = 2.0
    """How often the launcher prints the progress line."""
    resume: Bool = False
    """Continue this run folder from its latest checkpoint that has a ``COMPLETE`` marker."""
    deterministic: Bool = False
    """Deterministic torch kernels in the learner (same data -> same parameters, resume included)."""
    replay: Str = ""
    """A recorded ``trajectories/`` folder to train on instead of live actors (no envhub, no actors)."""
    mode: RunMode = "async"
    """``async`` (generation, env steps and training overlap, within ``learner.max_policy_lag``) or
    ``sync``: the reference systems' loop on the same actors, learner and envs (lease one batch,
    wait for its slowest episode, train, broadcast, then lease the next; ``max_policy_lag`` is 0)."""


@section
class ModelSection:
    name: Str = "tiny"
    """``tiny`` (random 1M-parameter Qwen2), ``smollm2-135m``, or a local HF model folder."""
    cache_dir: Str = ""
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
        if self.warm_start and self.name != "tiny":
            raise ValueError(f"model.warm_start keydoor starts from the tiny model, not {self.name!r}")


@section
class ConversationOverrides:
    """One env's entry of ``rollout.conversation_per_env``: what it sets differently from ``rollout``."""

    conversation_start: Bool | None = None
    """This env's ``conversation_start``; unset: ``rollout.conversation_start``."""
    num_examples: Annotated[Int, Ge(-1)] | None = None
    """This env's ``num_examples``; unset: ``rollout.num_examples``."""


@section
class RolloutSection:
    envs: Annotated[list[Str], MinLen(1)] = field(default_factory=lambda: ["keydoor-v0"])
    """Environment ids to train on; tasks are drawn round-robin across them."""
    split: Str = "train"
    """Task split used for training."""
    group_size: Count = 4
    """Episodes per task lease (the GRPO group)."""
    temperature: Positive = 1.0
    """Sampling temperature; the learner uses the same one for its logprobs."""
    eval_greedy: Bool = False
    """Held-out episodes (``learner.eval_*``) take the most likely token instead of sampling at
    ``temperature``: one deterministic score per task (use ``learner.eval_samples`` 1)."""
    max_new_tokens: Count = 24
    """Token cap of one assistant turn."""
    max_episode_tokens: Count = 1024
    """Token budget of a whole episode (prompt, observations and actions)."""
    system_prompt: Str = "You are an agent. Reply with one action."
    """System message at the start of every episode; empty for none."""
    conversation_start: Bool = True
    """Open each episode as AgentGym's clients do: the env's instruction as a user turn, the
    assistant's acknowledgement, then worked example exchanges, then the first observation (all
    context, never trained on). False: the instruction is prepended to the first observation and
    no example is shown."""
    num_examples: Annotated[Int, Ge(-1)] = -1
    """Worked example exchanges before the first observation; -1: each env's own default (the
    number that helps a small model write its action format)."""
    conversation_per_env: dict[str, ConversationOverrides] = field(default_factory=dict)
    """Per-env overrides of ``conversation_start`` and ``num_examples``, e.g.
    ``{search-v0: {num_examples: 0}}``."""

    def conversation_for(self, env_id: str) -> tuple[bool, int | None]:
        """(conversation start on?, examples to show or None for the env's default) for ``env_id``."""
        overrides = self.conversation_per_env.get(env_id, ConversationOverrides())
        start = self.conversation_start if overrides.conversation_start is None else overrides.conversation_start
        examples = self.num_examples if overrides.num_examples is None else overrides.num_examples
        return start, None if examples < 0 else examples


@section
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
        if self.run.max_steps > 0:  # boundary_fractions round to steps of this run (an evaluation has none)
            resolve_boundaries(horizon, self.run.max_steps)


# --------------------------------------------------------------------------- documentation


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Map each dataclass field to the string literal written under it (in ``cls`` or the section it
    extends: ``learner.algorithm``'s sections share their base's knobs)."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
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
    return _build(tree)


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


@functools.cache
def _validator() -> TypeAdapter:
    return TypeAdapter(Config)


def _build(tree: dict[str, Any]) -> Config:
    try:
        return _validator().validate_python(tree)
    except ValidationError as exc:
        raise config_error(exc, Config) from None


# --------------------------------------------------------------------------- writing


def to_dict(cfg: Config) -> dict[str, Any]:
    """The config as plain data, every key written out (defaults included)."""
    return dataclasses.asdict(cfg)


def write_resolved(cfg: Config, path: Path) -> None:
    """Write the fully resolved config (every key, defaults included) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
