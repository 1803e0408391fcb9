"""The decoder's fast path: msgspec decodes a well-formed frame straight into a message's fields.

``protocol._build`` checks a body field by field, each value against its type hint, naming the
field in every error, after msgpack-python has made a Python object of every value: about 30 us
for a 1k-token ``Trajectory`` (60 us at 30k tokens, where each array is copied out of the frame),
and the learner head decodes one per episode. msgspec, given the same fields as typed structs,
parses and type-checks a frame in one C pass (about 2 us, either size) and leaves every array's
bytes in the frame as a read-only view.

A ``FastDecoder`` accepts a frame only when every value is one the field-by-field check would
return unchanged, so it changes no decision and no error, only how fast the common case passes;
on any doubt it returns None and the caller unpacks and checks the frame as before, which accepts
or says exactly what is wrong. Where msgspec would accept more than that check, the struct types
are narrower (finite floats, each array's dtype) or the value is left to msgpack itself (a
``dict[str, Any]`` that holds more than plain values: msgpack-python, unlike msgspec, refuses
nested maps with keys other than strings);
``tests/test_wire_fuzz.py`` checks that both paths decide mutated frames alike.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgpack
import msgspec
import numpy as np

from common.wire_checks import MAX_DIMENSION_LENGTH

_FINITE_FLOAT = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
"""A float the field-by-field check keeps: NaN and the infinities fail one of the bounds."""
_SIMPLE = (str, int, bool)
"""Hints msgspec checks exactly as the field-by-field check does (neither takes a bool for an int)."""


_DIMENSIONS = list[Annotated[int, msgspec.Meta(ge=0, le=MAX_DIMENSION_LENGTH)]]


@functools.cache
def wire_array(dtype_name: str) -> type[msgspec.Struct]:
    """The struct of an array of ``dtype_name`` on the wire (``protocol._to_wire``): msgspec checks
    its dtype, and its bytes stay where the frame holds them. Not tracked by the cycle collector
    (no decoded struct can be part of a cycle): cheaper to make, never scanned."""
    return msgspec.defstruct(f"WireArray{dtype_name}", [("dtype", Literal[dtype_name]), ("shape", _DIMENSIONS),
                                                        ("data", memoryview)], forbid_unknown_fields=True, gc=False)


@dataclass(frozen=True)
class _MessagePlan:
    """How to make a message of ``cls`` from its decoded body struct."""

    cls: type
    arrays: tuple[tuple[str, np.dtype, int], ...]
    """Each array field's name, dtype and item size."""
    loose_maps: tuple[str, ...]
    """``dict[str, Any]`` fields: raw msgpack in the struct, unpacked by ``_string_keyed_map_or_none``."""

    def build(self, body: msgspec.Struct) -> Any | None:
        fields = msgspec.structs.asdict(body)
        # Inline, not a call per array: this runs for every array of every episode the head takes.
        for name, dtype, itemsize in self.arrays:
            shape, data = fields[name].shape, fields[name].data
            # Python ints: a huge shape cannot wrap around to the data's size.
            if len(shape) == 1 and shape[0] * itemsize == len(data):
                fields[name] = np.frombuffer(data, dtype)
            elif len(shape) == 2 and shape[0] * shape[1] * itemsize == len(data):
                fields[name] = np.frombuffer(data, dtype).reshape(shape)
            else:  # the field-by-field check names what is wrong
                return None
        for name in self.loose_maps:
            fields[name] = _string_keyed_map_or_none(fields[name])
            if fields[name] is None:
                return None
        # Not ``cls(**fields)``: its generated __init__ sets each field through object.__setattr__
        # (the class is frozen), 4 us for a Trajectory. ``_plan_for`` makes sure there is nothing
        # else __init__ would do.
        message = object.__new__(self.cls)
        message.__dict__.update(fields)
        return message


class FastDecoder:
    """Decodes frames of the given message classes, each ``{"type", "schema", "body"}``."""

    def __init__(self, classes: Iterable[type], schema: int):
        self._schema = schema
        self._plans: dict[type, _MessagePlan] = {}
        envelopes = []
        for cls in classes:
            planned = _plan_for(cls)
            if planned is not None:  # a type it has no plan for is always left to the caller
                envelope, body, self._plans[body] = planned
                envelopes.append(envelope)
        self._decoder = msgspec.msgpack.Decoder(typing.Union[tuple(envelopes)], ext_hook=_refuse_ext)

    def decode(self, frame: bytes | memoryview) -> Any | None:
        """The message in ``frame``, or None when only the field-by-field check can tell."""
        try:
            envelope = self._decoder.decode(frame)
        except Exception:  # msgspec's errors, or an extension: the caller's check says what is wrong
            return None
        if envelope.schema != self._schema:
            return None
        return self._plans[type(envelope.body)].build(envelope.body)


def _plan_for(cls: type) -> tuple[type, type, _MessagePlan] | None:
    """The envelope and body structs of ``cls`` and how to build it from the body, or None when a
    field (a list, a nested message) or the class itself needs the field-by-field path."""
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or hasattr(cls, "__slots__") or not all(f.init for f in fields):
        return None
    hints = typing.get_type_hints(cls)
    struct_fields, arrays, loose_maps = [], [], []
    for f in fields:
        dtype = f.metadata.get("dtype")
        if dtype is not None:
            wire_type: Any = wire_array(dtype.str)
            arrays.append((f.name, dtype, dtype.itemsize))
        elif hints[f.name] == dict[str, Any]:
            wire_type = msgspec.Raw
            loose_maps.append(f.name)
        else:
            wire_type = _wire_type(hints[f.name])
            if wire_type is None:
                return None
        default = _wire_default(f, wire_type)
        struct_fields.append((f.name, wire_type) if default is dataclasses.MISSING else (f.name, wire_type, default))
    # Untracked too: a body refers to no struct but its arrays, an envelope to its body only.
    body = msgspec.defstruct(f"{cls.__name__}Body", struct_fields, forbid_unknown_fields=True, gc=False)
    envelope = msgspec.defstruct(f"{cls.__name__}Envelope", [("schema", int), ("body", body)], tag_field="type",
                                 tag=cls.__name__, forbid_unknown_fields=True, gc=False)
    return envelope, body, _MessagePlan(cls, tuple(arrays), tuple(loose_maps))


def _wire_type(hint: Any) -> Any | None:
    """The msgspec type that accepts exactly the values ``typed_build.checker(hint, ...)`` returns
    unchanged or converts as msgspec does (an int for a float), or None for a hint it has none for."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SIMPLE:
        return hint
    if hint is float:
        return _FINITE_FLOAT
    if origin is Literal and all(type(a) is str for a in args):
        return hint
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = _wire_type(next(a for a in args if a is not type(None)))
        return None if inner is None else inner | None
    if origin is dict and args[0] is str and args[1] in (int, float):
        return dict[str, _wire_type(args[1])]
    return None


def _wire_default(f: dataclasses.Field, wire_type: Any) -> Any:
    """What the body struct holds for ``f`` when a frame leaves it out: the wire form of what the
    dataclass gives it then (an empty array, an empty map), so that ``build`` treats it as any
    value; ``dataclasses.MISSING`` for a required field, or one whose default has no wire form here
    (a frame without it then takes the field-by-field path)."""
    if f.metadata.get("dtype") is not None:
        if f.default_factory is dataclasses.MISSING:
            return dataclasses.MISSING
        # ``array_field``'s factory: an empty array of its dtype
        return msgspec.field(default_factory=lambda: wire_type(f.metadata["dtype"].str, [0], memoryview(b"")))
    if wire_type is msgspec.Raw:
        empty_map = msgpack.packb({})
        return msgspec.field(default_factory=lambda: msgspec.Raw(empty_map)) if f.default_factory is dict \
            else dataclasses.MISSING
    if f.default_factory is not dataclasses.MISSING:
        return msgspec.field(default_factory=f.default_factory)
    return f.default


def _string_keyed_map_or_none(raw: msgspec.Raw) -> dict[str, Any] | None:
    """The map ``unpack`` makes of ``raw``, if it is one with string keys, else None."""
    # The common map holds only plain values, which msgspec decodes as msgpack-python does, in a
    # third of the time; a nested map or list may hold keys msgspec takes and msgpack refuses.
    try:
        value = _STRING_KEYED_MAP.decode(raw)
        if _PLAIN_VALUES.issuperset(map(type, value.values())):
            return value
    except Exception:
        pass
    try:
        value = unpack(raw)
    except Exception:
        return None
    return value if type(value) is dict and all(type(key) is str for key in value) else None


_PLAIN_VALUES = frozenset({str, int, float, bool, type(None), bytes})


def unpack(data: bytes | memoryview | msgspec.Raw) -> Any:
    """The values of msgpack bytes, as the field-by-field path takes them: strings decoded, map
    keys only strings or bytes, no extension (no message carries one)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=_refuse_ext)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code}: no message carries one")


_STRING_KEYED_MAP = msgspec.msgpack.Decoder(dict[str, Any], ext_hook=_refuse_ext)
