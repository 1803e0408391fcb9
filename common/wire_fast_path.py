"""The decoder's fast path: a well-formed message checked a group of fields at a time.

``protocol._build`` checks a body field by field, each value against its type hint, naming the
field in every error: about 50 us for a ``Trajectory``, more than all its meaning checks, and the
learner head decodes one per episode. A ``FastPlan``, worked out once per message class from the
same dataclass fields and type hints, accepts a body only when every field is present with a
value the field-by-field check would return unchanged (arrays: decode exactly as it would). On
any doubt ``build`` returns None and the caller runs the field-by-field check, which accepts or
says exactly what is wrong. So the plan changes no decision and no error, only how fast the
common case passes; ``tests/test_wire_fuzz.py`` checks both paths agree on mutated frames.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

_EXACT_TYPES = (str, int, bool)
"""Hints whose values pass the field-by-field check unchanged exactly when their type is the hint's
(it refuses a bool for an int, and msgpack yields no subclasses)."""


@dataclass(frozen=True)
class _ExactGroup:
    """Fields of one exact type, fetched together and checked by one set of their types."""

    values: Callable[[dict], tuple]
    type_: type


@dataclass(frozen=True)
class _ArrayType:
    """An array field's dtype, with what checking a value needs of it at hand (``np.dtype.str``
    makes a new string on every call)."""

    dtype: np.dtype
    name: str
    itemsize: int


@dataclass(frozen=True)
class FastPlan:
    """How to take a body of ``cls`` in one pass when nothing in it is doubtful."""

    cls: type
    names: frozenset[str]
    exact: tuple[_ExactGroup, ...]
    tests: tuple[tuple[str, Callable[[Any], bool]], ...]
    """Other fields, each with a test that is true only when the field-by-field check returns the value as it is."""
    arrays: tuple[tuple[str, _ArrayType], ...]

    def build(self, body: Any) -> Any | None:
        """The message ``body`` describes, or None when only the field-by-field check can tell."""
        if type(body) is not dict or body.keys() != self.names:
            return None
        for group in self.exact:
            if set(map(type, group.values(body))) != {group.type_}:
                return None
        for name, passes in self.tests:
            if not passes(body[name]):
                return None
        fields = dict(body)
        for name, array_type in self.arrays:
            array = _array_or_none(body[name], array_type)
            if array is None:
                return None
            fields[name] = array
        # Not ``cls(**fields)``: its generated __init__ sets each field through object.__setattr__
        # (the class is frozen), 4 us for a Trajectory. ``plan_for`` makes sure there is nothing else
        # __init__ would do.
        message = object.__new__(self.cls)
        message.__dict__.update(fields)
        return message


def plan_for(cls: type) -> FastPlan | None:
    """The fast plan of a message class, or None when a field or the class needs the field-by-field path."""
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or hasattr(cls, "__slots__") or not all(f.init for f in fields):
        return None
    hints = typing.get_type_hints(cls)
    by_type: dict[type, list[str]] = {}
    tests, arrays = [], []
    for f in fields:
        hint = hints[f.name]
        if f.metadata.get("dtype") is not None:
            dtype = f.metadata["dtype"]
            arrays.append((f.name, _ArrayType(dtype, dtype.str, dtype.itemsize)))
        elif hint in _EXACT_TYPES:
            by_type.setdefault(hint, []).append(f.name)
        else:
            test = _unchanged_test(hint)
            if test is None:
                return None
            tests.append((f.name, test))
    exact = tuple(_ExactGroup(_tuple_getter(names), type_) for type_, names in by_type.items())
    return FastPlan(cls, frozenset(f.name for f in fields), exact, tuple(tests), tuple(arrays))


def _tuple_getter(names: list[str]) -> Callable[[dict], tuple]:
    if len(names) == 1:
        name = names[0]
        return lambda body: (body[name],)
    return operator.itemgetter(*names)


def _unchanged_test(hint: Any) -> Callable[[Any], bool] | None:
    """A test true only for values ``typed_build.checker(hint, ...)`` returns unchanged, or None for a
    hint that has none here (a list, a nested message: left to the field-by-field check)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is float:
        return _finite_float
    if hint in _EXACT_TYPES:
        return lambda value: type(value) is hint
    if origin is Literal and all(type(a) is str for a in args):
        allowed = frozenset(args)
        return lambda value: type(value) is str and value in allowed
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = _unchanged_test(next(a for a in args if a is not type(None)))
        return None if inner is None else (lambda value: value is None or inner(value))
    if origin is dict and args[0] is str and args[1] is Any:
        return lambda value: type(value) is dict and set(map(type, value)) <= {str}
    if origin is dict and args[0] is str and args[1] is float:
        return lambda value: type(value) is dict and set(map(type, value)) <= {str} and \
            set(map(type, value.values())) <= {float} and all(map(math.isfinite, value.values()))
    return None


def _finite_float(value: Any) -> bool:
    return type(value) is float and math.isfinite(value)


def _array_or_none(value: Any, array_type: _ArrayType) -> np.ndarray | None:
    """The array ``protocol._decode_array`` makes of a well-formed 1-D or 2-D array map, else None."""
    if type(value) is not dict or len(value) != 3:
        return None
    shape, data = value.get("shape"), value.get("data")
    # A memoryview: the bytes in place (``wire_payloads``); msgpack itself yields bytes.
    if value.get("dtype") != array_type.name or type(shape) is not list or type(data) not in (bytes, memoryview):
        return None
    if len(shape) == 1:
        # type, not isinstance: a bool is no size. A negative size gives a negative product, never len(data).
        if type(shape[0]) is int and shape[0] * array_type.itemsize == len(data):
            return np.frombuffer(data, array_type.dtype)
    elif len(shape) == 2:
        rows, columns = shape
        if type(rows) is int and type(columns) is int and rows >= 0 and columns >= 0 and \
                rows * columns * array_type.itemsize == len(data):
            return np.frombuffer(data, array_type.dtype).reshape(rows, columns)
    return None
