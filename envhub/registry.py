"""Registry of environments by versioned id, modelled on Gymnasium's `EnvSpec`.

Adding an environment = one `Environment` subclass + one `register(...)` line in
envhub/envs/__init__.py. Entry points are strings, imported only when an env is made,
so listing environments never imports heavy environment code.
"""

from __future__ import annotations

import functools
import importlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from envhub.base import ConversationStart, Environment

_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*-v(0|[1-9][0-9]*)$")
_ENTRY_POINT_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

_specs: dict[str, EnvSpec] = {}
_builtins_loaded = False


class UnknownEnvError(KeyError):
    """No environment is registered under the requested id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


@dataclass(frozen=True)
class EnvSpec:
    """How to build one registered environment and which tasks it offers."""

    id: str
    """Versioned id, `name-vN` (e.g. `keydoor-v0`)."""

    entry_point: str
    """`module.path:ClassName` of the `Environment` subclass, imported lazily."""

    max_turns: int
    """Default turn cap for this env (the horizon schedule may lower it)."""

    splits: dict[str, range] | None
    """Task ids per split (a task id is the decimal string of an int in the range), or None when
    the tasks depend on the env's options: then the class's ``task_splits(**options)`` says."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments passed to the environment class on every `make`."""

    def __post_init__(self) -> None:
        if not _ID_PATTERN.match(self.id):
            raise ValueError(f"env id {self.id!r} must look like 'name-vN', e.g. 'keydoor-v0'")
        if not _ENTRY_POINT_PATTERN.match(self.entry_point):
            raise ValueError(f"entry_point {self.entry_point!r} must look like 'module.path:ClassName'")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.splits is not None and not _valid_splits(self.splits):
            raise ValueError(f"splits must be a non-empty dict of name -> range or list of ints, got {self.splits!r}")

    def has_task(self, task_id: str, splits: dict[str, range | list[int]] | None = None, **options: Any) -> bool:
        """True when `task_id` is the canonical decimal string of a task in some split: of `splits`
        when the caller has listed them already (listing may load a dataset), else of the env's under `options`."""
        try:
            number = int(task_id)
        except (TypeError, ValueError):
            return False
        if str(number) != task_id:  # reject "007", " 7", "7_0": one task, one spelling
            return False
        splits = task_splits(self.id, **options) if splits is None else splits
        return any(number in task_range for task_range in splits.values())


def register(id: str, entry_point: str, max_turns: int, splits: dict[str, range] | None = None,
             **kwargs: Any) -> EnvSpec:
    """Register an environment; registering an id twice with a different spec is an error."""
    splits = None if splits is None else dict(splits)
    new_spec = EnvSpec(id=id, entry_point=entry_point, max_turns=max_turns, splits=splits, kwargs=kwargs)
    if id in _specs:
        if _specs[id] == new_spec:
            return new_spec  # the same line run again: a module re-imported after a failed import
        raise ValueError(f"env id {id!r} is already registered with a different spec")
    _specs[id] = new_spec
    return new_spec


def unregister(id: str) -> None:
    """Forget env ``id`` and what was cached from it (an env registered for a while, as by a test);
    ``UnknownEnvError`` if it is not registered."""
    spec(id)
    del _specs[id]
    _dynamic_splits.cache_clear()
    _conversation_start.cache_clear()


def spec(id: str) -> EnvSpec:
    """The spec registered under `id`; raises `UnknownEnvError` naming the registered ids."""
    _ensure_builtins()
    try:
        return _specs[id]
    except KeyError:
        known = ", ".join(sorted(_specs)) or "(none)"
        raise UnknownEnvError(f"unknown env id {id!r}; registered envs: {known}") from None


def list_specs() -> list[EnvSpec]:
    """Every registered spec, sorted by id."""
    _ensure_builtins()
    return [_specs[env_id] for env_id in sorted(_specs)]


def task_splits(id: str, **options: Any) -> dict[str, range | list[int]]:
    """Task numbers per split of env `id` under `options` (the env's constructor keywords)."""
    env_spec = spec(id)
    if env_spec.splits is not None:
        return env_spec.splits
    merged = {**env_spec.kwargs, **options}
    return _dynamic_splits(id, json.dumps(merged, sort_keys=True, default=str))


@functools.lru_cache(maxsize=64)
def _dynamic_splits(id: str, options_json: str) -> dict[str, range | list[int]]:
    # Cached: loading an env's task list (recipes, levels, question sets) can take seconds.
    splits = load_env_class(id).task_splits(**json.loads(options_json))
    if not _valid_splits(splits):
        raise TypeError(f"{id}: task_splits() must return a non-empty dict of name -> range or list of ints")
    return dict(splits)


def _valid_splits(splits: Any) -> bool:
    """Splits map names to task numbers: a ``range``, or a list of ints for interleaved splits."""
    def valid(numbers: Any) -> bool:
        return isinstance(numbers, range) or (isinstance(numbers, (list, tuple)) and all(
            isinstance(n, int) and not isinstance(n, bool) for n in numbers))
    return isinstance(splits, dict) and bool(splits) and all(valid(v) for v in splits.values())


def task_ids(id: str, split: str, **options: Any) -> list[str]:
    """Task ids of one split of env `id`, as strings."""
    splits = task_splits(id, **options)
    if split not in splits:
        raise KeyError(f"env {id!r} has no split {split!r}; splits: {', '.join(sorted(splits))}")
    return [str(number) for number in splits[split]]


def conversation_start(id: str, **options: Any) -> ConversationStart:
    """What env `id` shows before its first observation under `options` (its constructor keywords)."""
    merged = {**spec(id).kwargs, **options}
    return _conversation_start(id, json.dumps(merged, sort_keys=True, default=str))


@functools.lru_cache(maxsize=64)
def _conversation_start(id: str, options_json: str) -> ConversationStart:
    start = load_env_class(id).conversation_start(**json.loads(options_json))
    if not isinstance(start, ConversationStart):
        raise TypeError(f"{id}: conversation_start() must return a ConversationStart, got {type(start).__name__}")
    return start


def load_env_class(id: str) -> type[Environment]:
    """Import and return the environment class of `id` (checks it subclasses `Environment`)."""
    entry_point = spec(id).entry_point
    module_name, class_name = entry_point.split(":")
    env_class = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(env_class, type) and issubclass(env_class, Environment)):
        raise TypeError(f"entry point {entry_point!r} of {id!r} is not an envhub Environment subclass")
    return env_class


def make(id: str, **kwargs: Any) -> Environment:
    """A fresh environment instance of `id`; `kwargs` override the registered ones."""
    return load_env_class(id)(**{**spec(id).kwargs, **kwargs})


def _ensure_builtins() -> None:
    # Imported here, not at module top: envhub.envs imports this module to call register().
    global _builtins_loaded
    if not _builtins_loaded:
        importlib.import_module("envhub.envs")
        _builtins_loaded = True  # only after success: a failed import raises again, visibly
