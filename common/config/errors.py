"""What a user reads when a config does not fit: one line naming the dotted key, from pydantic's report.

pydantic finds every problem; a user needs the first, worded for a YAML file and a command line
(``learner.lr: expected float, got 'abc'``, ``unknown config key 'learner.learning_rate'; valid keys
here: ...``), not pydantic's multi-line report with its type names and documentation links.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from pydantic import Tag, ValidationError

from common.config.learner import ALGORITHMS


class ConfigError(ValueError):
    """A configuration file or override that does not fit the schema."""


_EXPECTED = {"int_type": "int", "float_type": "float", "bool_type": "bool", "string_type": "str", "list_type": "a list",
             "dict_type": "a mapping with string keys", "dataclass_type": "a mapping",
             "dataclass_args_type": "a mapping", "union_tag_not_found": "a mapping", "finite_number": "a finite number"}
"""pydantic's error type -> what the value should have been (the scalars are strict: no ``*_parsing`` errors)."""
_BOUNDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="), "less_than": ("lt", "<"),
           "less_than_equal": ("le", "<=")}
"""pydantic's error type -> (its context key, the comparison it failed)."""


def config_error(exc: ValidationError, root: type) -> ConfigError:
    """The first problem pydantic found in a tree validated as ``root``, as one line."""
    error = exc.errors(include_url=False)[0]
    kind, value = error["type"], error.get("input")
    hint, where = _resolve(root, tuple(error["loc"]))
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        parent, parent_where = _resolve(root, tuple(error["loc"][:-1]))
        return ConfigError(_unknown_key(parent_where, str(error["loc"][-1]), _fields(parent)))
    if kind in ("value_error", "assertion_error"):  # a section's own check (its __post_init__)
        said = str(error["ctx"]["error"])
        return ConfigError(said if where and said.startswith(where) else f"{where or 'config'}: {said}")
    if kind == "literal_error":
        return ConfigError(f"{where}: {value!r} is not one of {list(typing.get_args(hint))}")
    if kind == "union_tag_invalid":  # learner.algorithm's advantage picks its section
        return ConfigError(f"{where}.advantage: {error['ctx']['tag']!r} is not one of {list(ALGORITHMS)}")
    if kind in _BOUNDS:
        key, comparison = _BOUNDS[kind]
        return ConfigError(f"{where} must be {comparison} {error['ctx'][key]}, got {value!r}")
    if kind == "too_short":
        return ConfigError(f"{where} must hold at least {error['ctx']['min_length']} item(s), got {value!r}")
    if kind in _EXPECTED:
        return ConfigError(f"{where or 'config'}: expected {_EXPECTED[kind]}, got {value!r}")
    return ConfigError(f"{where or 'config'}: {error['msg']} (got {value!r})")


def _resolve(root: type, loc: tuple[Any, ...]) -> tuple[Any, str]:
    """(the type a value at pydantic's ``loc`` under ``root`` must have, its dotted key). A tagged
    union's tag in ``loc`` picks its option and is no key: pydantic's ``learner.algorithm.gae.lam``
    is ``learner.algorithm.lam``; an unset-able section is read as its section."""
    hint, where = _plain(root), ""
    for part in loc:
        tagged = _tagged_options(hint)
        if part in tagged:
            hint = tagged[part]
            continue
        if dataclasses.is_dataclass(hint):
            hint = typing.get_type_hints(hint, include_extras=True).get(part, Any)
        elif typing.get_origin(hint) in (list, dict):
            hint = typing.get_args(hint)[-1]
        where += f"[{part}]" if isinstance(part, int) else f".{part}" if where else str(part)
        hint = _plain(hint)
    return hint, where


def _plain(hint: Any) -> Any:
    """``hint`` without its annotations (constraints, tags), an optional one as what it holds."""
    while typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [option for option in typing.get_args(hint) if option is not type(None)]
        if len(options) == 1:
            return _plain(options[0])
    return hint


def _tagged_options(hint: Any) -> dict[str, Any]:
    """A discriminated union's options by tag; empty for any other type."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return {}
    tagged = {}
    for option in typing.get_args(hint):
        for tag in getattr(option, "__metadata__", ()):
            if isinstance(tag, Tag):
                tagged[tag.tag] = _plain(option)
    return tagged


def _unknown_key(where: str, key: str, valid: list[str]) -> str:
    message = f"unknown config key {f'{where}.{key}' if where else key!r}; valid keys here: {', '.join(sorted(valid))}"
    if where.endswith("algorithm"):
        message += _estimator_hint(where, key)
    return message


def _estimator_hint(where: str, key: str) -> str:
    """Where an estimator's setting lives: in the section of its own ``advantage``."""
    if key in ALGORITHMS:  # the layout before the union: learner.algorithm.gae.lam
        own = sorted(set(_fields(ALGORITHMS[key])) - set(_fields(ALGORITHMS["rloo"])))
        keys = f" ({', '.join(f'{where}.{name}' for name in own)})" if own else ""
        return f"; an estimator's settings are keys of {where} itself{keys}, with {where}.advantage {key}"
    bare = key.removeprefix("grpo_")  # grpo_std_norm, from before the estimators had settings of their own
    owners = [name for name, section in ALGORITHMS.items() if bare in _fields(section)]
    if not owners:
        return ""
    then = f"write {where}.{bare}" if bare != key else f"it applies only with {where}.advantage set to it"
    return f"; {bare} is a setting of advantage {' or '.join(owners)}: {then}"
def _fields(hint: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(hint)] if dataclasses.is_dataclass(hint) else []
