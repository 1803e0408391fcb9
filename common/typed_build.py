"""Plain data into frozen dataclasses, checked against their type hints: the run config's validator
(``common/config/``; the wire has its own decoder, ``common/wire_decoder.py``).

``build(cls, data, where, dialect)`` rejects unknown and missing keys, checks every value against
its field's hint (``str``, ``int``, ``float``, ``bool``, ``Any``, ``Literal[...]``, ``list[X]``,
``dict[str, X]``, unions, nested dataclasses) and constructs ``cls``. Errors name where the value
sits (``learner.algorithm.loss_agg``). The ``Dialect`` says how errors are raised and worded, how a
bad value is shown and how a scalar is taken (the config reads ``1e-3`` written as a string as a float).

Checks are compiled once per (hint, dialect) and a dataclass's fields once per (class, dialect):
``typing``'s introspection costs more than the checks themselves.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Check = Callable[[Any, str], Any]
"""``check(value, where) -> value`` (possibly converted), or raises the dialect's error."""


@dataclass(frozen=True, eq=False)
class Dialect:
    """How one caller raises and words what the shared checks find (hashed by identity: a cache key)."""

    error: Callable[[str, str], Exception]
    """``(message, reason) -> exception``; reason ``bad_field`` for every type error raised here."""
    shown: Callable[[Any], str]
    """How a bad value appears after ``got``."""
    mapping: str
    """The caller's word for a dict: ``mapping`` (YAML) or ``map`` (msgpack)."""
    scalar: Check
    """Check (or convert) a value against a plain class hint (``int``, ``float``, ``str``, None's type)."""
    unknown_keys: Callable[[str, list[str], list[str]], str]
    """``(where, unknown keys in order, valid keys sorted) -> message``."""
    no_match: Callable[[str, Any, Any, list[Exception]], Exception]
    """``(where, value, union hint, each option's error) -> exception`` when no option of a union fits."""
    top: str = "config"
    """What ``where`` is called when empty (the root of the tree)."""


def build(cls: type, data: Any, where: str, dialect: Dialect) -> Any:
    """``cls(**data)`` with every key known, every required field given and every value checked."""
    if not isinstance(data, dict):
        raise dialect.error(f"{where or dialect.top}: expected a {dialect.mapping}, got {dialect.shown(data)}",
                            "bad_field")
    schema = _schema(cls, dialect)
    unknown = [key for key in data if key not in schema.checks]
    if unknown:
        raise dialect.error(dialect.unknown_keys(where, unknown, sorted(schema.checks)), "bad_field")
    # A field with a default may be absent (an older sender, a sparse YAML file).
    missing = schema.required - data.keys()
    if missing:
        raise dialect.error(f"{where or dialect.top}: missing fields {sorted(missing)}", "bad_field")
    prefix, checks = f"{where}." if where else "", schema.checks
    values = {name: checks[name](value, prefix + name) for name, value in data.items()}
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:  # the class's own checks (__post_init__)
        said = str(exc)
        named = where and said.startswith(where)  # the check named the key itself
        raise dialect.error(said if named else f"{where or dialect.top}: {said}", "bad_field") from None


def joined(where: str, key: str) -> str:
    """The dotted name of ``key`` under ``where``."""
    return f"{where}.{key}" if where else key


@dataclass(frozen=True)
class _Schema:
    checks: dict[str, Check]
    """Field name -> the check of its value."""
    required: frozenset[str]


@functools.cache
def _schema(cls: type, dialect: Dialect) -> _Schema:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    checks = {f.name: checker(hints[f.name], dialect) for f in fields}
    required = frozenset(f.name for f in fields
                         if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    return _Schema(checks, required)


@functools.cache
def checker(hint: Any, dialect: Dialect) -> Check:
    """The check of a value against ``hint``, worked out once per hint."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return _union_check(hint, [checker(option, dialect) for option in args], dialect)
    if origin is Literal:
        return _literal_check(args, dialect)
    if origin is list:
        return _list_check(checker(args[0], dialect), dialect)
    if origin is dict:
        return _dict_check(checker(args[1], dialect), dialect)
    if dataclasses.is_dataclass(hint):
        return lambda value, where: build(hint, value, where, dialect)
    if hint is Any:
        return lambda value, where: value  # checked by whoever consumes it (an env's options, env info)
    if hint in (str, int, bool):  # the common case passes at once; the rest (a bool for an int) in full
        return lambda value, where: value if type(value) is hint else dialect.scalar(value, hint, where)
    return lambda value, where: dialect.scalar(value, hint, where)


def _union_check(hint: Any, options: list[Check], dialect: Dialect) -> Check:
    def check_union(value: Any, where: str) -> Any:
        errors = []
        for option in options:
            try:
                return option(value, where)
            except ValueError as exc:  # each dialect's error is one (ConfigError, ProtocolError)
                errors.append(exc)
        raise dialect.no_match(where, value, hint, errors)
    return check_union


def _literal_check(allowed: tuple[Any, ...], dialect: Dialect) -> Check:
    def check_literal(value: Any, where: str) -> Any:
        # type too: True == 1 would pass a Literal[1], and 1.0 a Literal[1]
        if not any(value == choice and type(value) is type(choice) for choice in allowed):
            raise dialect.error(f"{where}: {dialect.shown(value)} is not one of {list(allowed)}", "bad_field")
        return value
    return check_literal


def _list_check(item: Check, dialect: Dialect) -> Check:
    def check_list(value: Any, where: str) -> Any:
        if not isinstance(value, list):
            raise dialect.error(f"{where}: expected a list, got {dialect.shown(value)}", "bad_field")
        return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return check_list


def _dict_check(item: Check, dialect: Dialect) -> Check:
    def check_dict(value: Any, where: str) -> Any:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise dialect.error(f"{where}: expected a {dialect.mapping} with string keys, got "
                                f"{dialect.shown(value)}", "bad_field")
        return {k: item(v, f"{where}.{k}") for k, v in value.items()}
    return check_dict
