"""The wire's one decoder: msgspec structs made from the message dataclasses.

A frame is ``{"type", "schema", "body"}``. msgspec decodes the envelope (the body left as raw
bytes), then the body with the struct of its type, parsing and type-checking it in one C pass;
every array's bytes stay in the frame as a read-only view (``common/wire_payloads.py`` aligns them).
A frame that fails says why in a ``DecodeError``: where (``Trajectory.status``), what is wrong,
and a reason to count rejections by (``not_msgpack``, ``bad_envelope``, ``schema_version``,
``unknown_type``, ``bad_field``, ``bad_array``, ``out_of_range``). An error never repeats a value
the peer sent (a hostile one may be megabytes), only its type and the names this side declares.

What a message must mean, beyond its types, is ``common/wire_checks.py``'s.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from common.wire_checks import MAX_DIMENSION_LENGTH, cut_short

MAX_ARRAY_DIMS = 2
"""Every array on the wire is 1-D or 2-D (``turn_spans``)."""
_FINITE_FLOAT = Annotated[float, msgspec.Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
"""A finite float: NaN and the infinities fail one of the bounds."""
_DIMENSIONS = Annotated[list[Annotated[int, msgspec.Meta(ge=0, le=MAX_DIMENSION_LENGTH)]],
                        msgspec.Meta(min_length=1, max_length=MAX_ARRAY_DIMS)]
_SIMPLE = (str, int, bool)
"""Hints msgspec checks exactly as meant (it takes no bool for an int)."""
_PLAIN_VALUES = frozenset({str, int, float, bool, type(None), bytes})
"""What a ``dict[str, Any]`` field (``env_info``) may hold, besides lists and string-keyed maps of these."""


class DecodeError(ValueError):
    """A frame that is not a message of a declared type; ``reason`` names the kind of fault."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@functools.cache
def wire_array(dtype_name: str) -> type[msgspec.Struct]:
    """The struct of an array of ``dtype_name`` on the wire: msgspec checks its dtype and shape, and
    its bytes stay where the frame holds them. Not tracked by the cycle collector (no decoded
    struct can be part of a cycle): cheaper to make, never scanned."""
    return msgspec.defstruct(f"WireArray{dtype_name}", [("dtype", Literal[dtype_name]), ("shape", _DIMENSIONS),
                                                        ("data", memoryview)], forbid_unknown_fields=True, gc=False)


class _Envelope(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    type: str
    schema: int
    body: msgspec.Raw


@dataclass(frozen=True)
class _MessagePlan:
    """How to make a message of ``cls`` from its decoded body struct."""

    cls: type
    body: type[msgspec.Struct]
    decoder: msgspec.msgpack.Decoder
    """Of a body alone, to say what is wrong with one."""
    arrays: tuple[tuple[str, np.dtype, int], ...]
    """Each array field's name, dtype and item size."""
    loose_maps: tuple[str, ...]
    """``dict[str, Any]`` fields: their values checked to be plain data after msgspec."""
    nested: tuple[tuple[str, type], ...]
    """``list[<dataclass>]`` fields: each item's struct made into that dataclass."""

    def build(self, body: msgspec.Struct) -> Any:
        fields = msgspec.structs.asdict(body)
        # Inline, not a call per array: this runs for every array of every episode the head takes.
        for field_name, dtype, itemsize in self.arrays:
            shape, data = fields[field_name].shape, fields[field_name].data
            # Python ints: a huge shape cannot wrap around to the data's size.
            expected_nbytes = shape[0] * itemsize if len(shape) == 1 else shape[0] * shape[1] * itemsize
            if expected_nbytes != len(data):
                raise DecodeError(f"{self.cls.__name__}.{field_name}: {len(data)} bytes of data for shape {shape} "
                                  f"({expected_nbytes} expected)", "bad_array")
            array = np.frombuffer(data, dtype)
            fields[field_name] = array if len(shape) == 1 else array.reshape(shape)
        for field_name in self.loose_maps:
            _check_plain_data(fields[field_name], self.cls.__name__, field_name)
        for field_name, item_cls in self.nested:
            fields[field_name] = [_as_dataclass(item_cls, msgspec.structs.asdict(item)) for item in fields[field_name]]
        return _as_dataclass(self.cls, fields)


def _as_dataclass(cls: type, fields: dict[str, Any]) -> Any:
    # Not ``cls(**fields)``: its generated __init__ sets each field through object.__setattr__ (the
    # class is frozen), 4 us for a Trajectory. ``_plan_for`` makes sure there is nothing else
    # __init__ would do.
    message = object.__new__(cls)
    message.__dict__.update(fields)
    return message


class Decoder:
    """Decodes frames of the given message classes, each ``{"type", "schema", "body"}``."""

    def __init__(self, classes: Iterable[type], schema: int):
        self._schema = schema
        self._plans = {cls.__name__: _plan_for(cls) for cls in classes}
        self._envelope = msgspec.msgpack.Decoder(_Envelope, ext_hook=_refuse_ext)
        # A valid frame is decoded in one pass, its envelope tagged by type; one that fails is
        # decoded again in two (envelope, then body) to say what is wrong in the right order.
        self._by_envelope = {_envelope_struct(name, plan.body): plan for name, plan in self._plans.items()}
        self._whole = msgspec.msgpack.Decoder(typing.Union[tuple(self._by_envelope)], ext_hook=_refuse_ext)

    def decode(self, frame: bytes | memoryview, expected: type | tuple[type, ...] | None = None) -> Any:
        """The message in ``frame``; ``DecodeError`` says what is wrong (a message of a type not
        ``expected`` here, before anything in its body)."""
        try:
            envelope = self._whole.decode(frame)
        except Exception:  # anything wrong: the two passes below say what
            envelope = None
        if envelope is not None and envelope.schema == self._schema:
            plan = self._by_envelope[type(envelope)]
            _admit(plan.cls, expected)
            return plan.build(envelope.body)
        cls, body = self.message_class(frame)
        _admit(cls, expected)
        return self.decode_body(cls, body)

    def message_class(self, frame: bytes | memoryview) -> tuple[type, msgspec.Raw]:
        """The class ``frame`` names and its body, undecoded; ``DecodeError`` for a bad envelope."""
        try:
            envelope = self._envelope.decode(frame)
        except msgspec.ValidationError as exc:
            text = str(exc)
            # An unknown key: at the top, where msgspec writes no path (a path in the text is the peer's).
            path = "$" if text.startswith("Object contains unknown field") else _split(text)[1]
            if path == "$.schema":
                raise DecodeError(f"schema version is no integer, this build speaks {self._schema}",
                                  "schema_version") from None
            if path == "$.type":
                raise DecodeError("message type is no string", "unknown_type") from None
            raise DecodeError("envelope must be a map with exactly type, schema, body", "bad_envelope") from None
        except Exception as exc:  # msgspec.DecodeError, or an extension type refused
            raise DecodeError(f"not valid msgpack: {exc}", "not_msgpack") from None
        if envelope.schema != self._schema:
            raise DecodeError(f"schema version {envelope.schema}, this build speaks {self._schema}", "schema_version")
        plan = self._plans.get(envelope.type)
        if plan is None:
            raise DecodeError(f"unknown message type {cut_short(envelope.type)!r}; known: {sorted(self._plans)}",
                              "unknown_type")
        return plan.cls, envelope.body

    def decode_body(self, cls: type, body: msgspec.Raw) -> Any:
        """The message of ``cls`` in ``body``; ``DecodeError`` says what is wrong."""
        plan = self._plans[cls.__name__]
        try:
            struct = plan.decoder.decode(body)
        except msgspec.ValidationError as exc:
            raise _validation_error(cls, str(exc), body) from None
        except Exception as exc:  # an extension type, or bytes msgspec cannot parse
            raise DecodeError(f"{cls.__name__}: not valid msgpack: {exc}", "not_msgpack") from None
        return plan.build(struct)


def _admit(cls: type, expected: type | tuple[type, ...] | None) -> None:
    if expected is not None and not issubclass(cls, expected):
        raise DecodeError(f"unexpected message type {cls.__name__} here", "unexpected_type")


def _envelope_struct(name: str, body: type[msgspec.Struct]) -> type[msgspec.Struct]:
    # Untracked, as the bodies: an envelope refers to its body only.
    return msgspec.defstruct(f"{name}Envelope", [("schema", int), ("body", body)], tag_field="type", tag=name,
                             forbid_unknown_fields=True, gc=False)


def _plan_for(cls: type) -> _MessagePlan:
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or hasattr(cls, "__slots__") or not all(f.init for f in fields):
        raise TypeError(f"{cls.__name__}: a message class is a plain frozen dataclass (its __init__ is not run)")
    body, arrays, loose_maps, nested = _body_struct(cls)
    decoder = msgspec.msgpack.Decoder(body, ext_hook=_refuse_ext)
    return _MessagePlan(cls, body, decoder, tuple(arrays), tuple(loose_maps), tuple(nested))


def _body_struct(cls: type) -> tuple[type, list, list, list]:
    """The struct msgspec decodes a body of ``cls`` into, with its array, loose-map and nested fields."""
    hints = typing.get_type_hints(cls)
    struct_fields, arrays, loose_maps, nested = [], [], [], []
    for f in dataclasses.fields(cls):
        dtype = f.metadata.get("dtype")
        if dtype is not None:
            wire_type: Any = wire_array(dtype.str)
            arrays.append((f.name, dtype, dtype.itemsize))
        elif hints[f.name] == dict[str, Any]:
            wire_type = dict[str, Any]
            loose_maps.append(f.name)
        elif typing.get_origin(hints[f.name]) is list and dataclasses.is_dataclass(typing.get_args(hints[f.name])[0]):
            item_cls = typing.get_args(hints[f.name])[0]
            item_body, *item_specials = _body_struct(item_cls)
            if any(item_specials):  # ``build`` makes a nested record of plain fields only
                raise TypeError(f"{cls.__name__}.{f.name}: a nested record's arrays, maps and lists have no wire form")
            wire_type = list[item_body]
            nested.append((f.name, item_cls))
        else:
            wire_type = _wire_type(hints[f.name], f"{cls.__name__}.{f.name}")
        default = _wire_default(f, wire_type)
        struct_fields.append((f.name, wire_type) if default is dataclasses.MISSING else (f.name, wire_type, default))
    # Untracked: a body refers to no struct but its arrays and nested items.
    body = msgspec.defstruct(f"{cls.__name__}Body", struct_fields, forbid_unknown_fields=True, gc=False)
    return body, arrays, loose_maps, nested


def _wire_type(hint: Any, where: str) -> Any:
    """The msgspec type that accepts exactly the values ``hint`` means (an int for a float, made a float)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SIMPLE:
        return hint
    if hint is float:
        return _FINITE_FLOAT
    if origin is Literal and all(type(a) is str for a in args):
        return hint
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        return _wire_type(next(a for a in args if a is not type(None)), where) | None
    if origin is list:
        return list[_wire_type(args[0], where)]
    if origin is dict and args[0] is str and args[1] in (int, float):
        return dict[str, _wire_type(args[1], where)]
    raise TypeError(f"{where}: no wire form for {hint}")


def _wire_default(f: dataclasses.Field, wire_type: Any) -> Any:
    """What the body struct holds for ``f`` when a frame leaves it out (a field added later, missing
    from older senders): the wire form of the dataclass's default; ``MISSING`` for a required field."""
    if f.metadata.get("dtype") is not None:
        if f.default_factory is dataclasses.MISSING:
            return dataclasses.MISSING
        # ``array_field``'s factory: an empty array of its dtype
        return msgspec.field(default_factory=lambda: wire_type(f.metadata["dtype"].str, [0], memoryview(b"")))
    if f.default_factory is not dataclasses.MISSING:
        return msgspec.field(default_factory=f.default_factory)
    return f.default


# ---------------------------------------------------------------------------------- errors

_AT = re.compile(r"^(.*?)(?: - at (?:`key` in )?`([^`]*)`)?$", re.DOTALL)
_PATH = re.compile(r"\$(?:\.\w+|\[\d+\]|\[\.\.\.\])*")
"""A path msgspec writes: declared names, indices, ``[...]`` for a map's key; never a peer's text."""


def _split(text: str) -> tuple[str, str]:
    """msgspec's error text as (what, where): ``Expected `int`, got `str` - at `$.x```. msgspec
    writes no path for an error at the top of what it decodes, so a path a peer wrote into an
    unknown key's name could look like one: only the last one counts, and only if this side could
    have written it."""
    what, where = _AT.match(text).groups()
    return (what, where) if where is not None and _PATH.fullmatch(where) else (text if where else what, "$")


def _validation_error(cls: type, text: str, body: msgspec.Raw) -> DecodeError:
    """msgspec's ``ValidationError`` on ``body``, a body of ``cls``, in the wire's words and reasons."""
    what, path = _split(text)
    # An unknown key at the top, where msgspec writes no path: whatever follows its name is the peer's.
    key = _unknown_top_level_key(cls, body) if text.startswith("Object contains unknown field") else None
    if key is not None:
        return DecodeError(f"{cls.__name__}: unknown fields [{cut_short(key)!r}]", "bad_field")
    where = cls.__name__ + path[1:]
    field_name = re.match(r"\$\.?(\w*)", path).group(1)
    hint = _hints(cls).get(field_name)
    in_array = field_name in _array_dtypes(cls)
    reason = "bad_array" if in_array else "bad_field"
    if what.startswith("Object missing required field"):
        return DecodeError(f"{where}: missing fields [{what.split('`')[1]!r}]", reason)
    if what.startswith("Object contains unknown field"):  # the name is the peer's: shown cut short
        return DecodeError(f"{where}: unknown fields [{cut_short(what.split('`', 1)[1][:-1])!r}]", reason)
    if in_array:
        part = path.rsplit(".", 1)[-1]
        if part.startswith("shape"):
            return DecodeError(f"{cls.__name__}.{field_name}: bad shape (1 or {MAX_ARRAY_DIMS} dimensions, each "
                               f"0 to {MAX_DIMENSION_LENGTH})", "bad_array")
        if part == "dtype":
            return DecodeError(f"{cls.__name__}.{field_name}: dtype is not {_array_dtypes(cls)[field_name].str!r}",
                               "bad_array")
        return DecodeError(f"{cls.__name__}.{field_name}: array must be a map of dtype, shape, data ({what})",
                           "bad_array")
    if what.startswith("Invalid enum value") and typing.get_origin(hint) is Literal:
        return DecodeError(f"{where}: not one of {list(typing.get_args(hint))}", "bad_field")
    if what.startswith("Invalid enum value"):
        return DecodeError(f"{where}: not one of its choices", "bad_field")
    if re.match(r"Expected `float` [<>]=", what):
        return DecodeError(f"{where}: not a finite number", "out_of_range")
    # What is left is msgspec's own words on types (``Expected `int`, got `str```): no peer's value.
    return DecodeError(f"{where}: {what[:200]}", "bad_field")


def _unknown_top_level_key(cls: type, body: msgspec.Raw) -> str | None:
    try:
        keys = msgspec.msgpack.decode(body, type=dict[str, msgspec.Raw])
    except Exception:
        return None
    declared = {f.name for f in dataclasses.fields(cls)}
    return next((key for key in keys if key not in declared), None)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _array_dtypes(cls: type) -> dict[str, np.dtype]:
    """Each array field of ``cls`` and its dtype."""
    return {f.name: f.metadata["dtype"] for f in dataclasses.fields(cls) if f.metadata.get("dtype") is not None}


# ---------------------------------------------------------------------------------- loose maps


def _check_plain_data(value: dict[str, Any], message: str, field_name: str) -> None:
    """A loose map holds plain values, lists and string-keyed maps of them: what every reader of a
    recording takes (msgpack-python refuses other keys; msgspec would make a timestamp a datetime)."""
    if _PLAIN_VALUES.issuperset(map(type, value.values())):  # the common, flat map
        return
    where = f"{message}.{field_name}"
    pending = [value]  # a loop, not recursion: a peer decides how deep it nests
    while pending:
        item = pending.pop()
        if type(item) is dict:
            if not all(type(key) is str for key in item):
                raise DecodeError(f"{where}: a map key that is no string", "bad_field")
            pending.extend(item.values())
        elif type(item) is list:
            pending.extend(item)
        elif type(item) not in _PLAIN_VALUES:
            raise DecodeError(f"{where}: holds a {type(item).__name__}, not plain data", "bad_field")


def _refuse_ext(code: int, data: memoryview) -> Any:
    raise ValueError(f"msgpack extension type {code}: no message carries one")
