"""Array payloads on the wire: packed aligned, unpacked in place, never copied on the way in.

msgpack-python copies every ``bin`` it unpacks into a new ``bytes``. For a 30k-token
``Trajectory`` that is 0.4 MB per episode into fresh memory (glibc hands freed pages back to the
kernel, so each copy also takes ~100 page faults): most of what decoding one cost.

``pack`` writes a message as ``msgpack.packb`` would, but for the array fields, whose maps it
writes itself so that each payload starts at a multiple of 8 bytes from the frame's start
(msgpack lets a string take a longer header than it needs; three of the map's take 1, 2 or 4
bytes more). Any msgpack reader decodes the same values, and arrays left in place are aligned:
numpy's aligned loops are twice as fast as its unaligned ones.

``unpack``
1. finds the bins that follow a ``"data"`` key (``pack`` writes an array as a map ending
   ``"data": <bin>``) with a byte search that skips each payload it finds;
2. unpacks the frame with each of them replaced by a placeholder: a msgpack extension holding a
   per-process secret and the payload's number (real messages carry no extension: ``decode``
   refuses them, and a peer cannot forge a secret it never sees);
3. keeps the result only if every placeholder came out as a whole object, once, as the ``data``
   of an array field of the message's body. Then unpacking the whole frame parses the same
   objects in the same order, the bins being where the placeholders are (a placeholder and a bin
   are each one complete object), so the result is exactly that of unpacking the whole frame, but
   for those bins, which are read-only views of the same bytes. Otherwise (a match inside a
   string, a payload elsewhere, a malformed frame) it returns None and the caller unpacks the
   whole frame as usual, which also says what is wrong.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from typing import Any

import msgpack

PLACEHOLDER_EXT = 0x55
"""The msgpack extension type of a placeholder."""
MIN_PAYLOAD_BYTES = 4096
"""Smaller bins are copied: a placeholder costs more than copying a few kB."""
_MAX_PAYLOADS = 256
"""Placeholders are numbered in one byte."""
_SECRET = os.urandom(7)
"""Makes a placeholder one no peer can send (a forged one would stand for a payload it is not)."""
_DATA_BIN = re.compile(rb"\xa4data([\xc5\xc6])")
"""The key ``"data"`` (fixstr 4), then a bin of 16- or 32-bit length (a bin 8 is too small to cut)."""
_LENGTH = {0xc5: struct.Struct(">H"), 0xc6: struct.Struct(">I")}
"""The length field of a bin 16 and of a bin 32, by their first byte."""

ALIGNMENT = 8
"""Payloads start at a multiple of this many bytes from the frame's start (ZeroMQ's buffers and
``bytes`` start at one), so every array dtype on the wire is aligned."""


def pack(type_name: str, schema: int, body: dict[str, Any], array_fields: frozenset[str]) -> bytes:
    """``msgpack.packb({"type": type_name, "schema": schema, "body": body})``, each of
    ``array_fields`` (``{dtype, shape, data}`` maps) written with an aligned payload."""
    parts = [b"\x83", msgpack.packb("type"), msgpack.packb(type_name), msgpack.packb("schema"),
             msgpack.packb(schema), msgpack.packb("body"), _map_header(len(body))]
    size = sum(map(len, parts))
    for key, value in body.items():
        parts.append(msgpack.packb(key))
        size += len(parts[-1])
        parts.append(_aligned_array(value, size) if key in array_fields else msgpack.packb(value))
        size += len(parts[-1])
    return b"".join(parts)


def _map_header(entries: int) -> bytes:
    if entries < 16:
        return bytes((0x80 | entries,))
    return b"\xde" + entries.to_bytes(2, "big") if entries < 1 << 16 else b"\xdf" + entries.to_bytes(4, "big")


def _aligned_array(array: dict[str, Any], offset: int) -> bytes:
    """The map ``{dtype, shape, data}`` as msgpack, written at ``offset`` of the frame, its payload aligned."""
    dtype, data = array["dtype"].encode(), array["data"]
    head = [b"\xa5dtype", msgpack.packb(array["dtype"]), b"\xa5shape", msgpack.packb(array["shape"]), b"\xa4data"]
    pad = -(offset + 1 + sum(map(len, head)) + 5) % ALIGNMENT  # 1: the map's header; 5: the bin's
    if pad & 1:
        head[0] = b"\xd9\x05dtype"  # str 8 instead of fixstr: 1 byte more
    if pad & 2:
        head[1] = b"\xda" + len(dtype).to_bytes(2, "big") + dtype  # str 16: 2 bytes more
    if pad & 4:
        head[2] = b"\xdb\x00\x00\x00\x05shape"  # str 32: 4 bytes more
    return b"\x83" + b"".join(head) + b"\xc6" + len(data).to_bytes(4, "big") + data  # bin 32


def unpack(frame: bytes | memoryview, array_fields: Callable[[str], frozenset[str]], **options: Any) -> Any | None:
    """What ``msgpack.unpackb(frame, **options)`` returns, the array payloads left in the frame, or
    None when there are none to leave there or the frame needs the plain unpacker.
    ``array_fields``: the array field names of a message type name (empty for an unknown name)."""
    view = memoryview(frame).cast("B").toreadonly()
    spans = _data_bins(view)
    if not spans or len(spans) > _MAX_PAYLOADS:
        return None
    pieces, done = [], 0
    for index, (header_start, start, end) in enumerate(spans):
        pieces += [view[done:header_start], b"\xd7" + bytes((PLACEHOLDER_EXT,)) + _SECRET + bytes((index,))]
        done = end
    pieces.append(view[done:])
    found: list[memoryview | None] = [None] * len(spans)

    def payload(code: int, data: bytes) -> memoryview:
        if code != PLACEHOLDER_EXT or len(data) != 8 or data[:7] != _SECRET or found[data[7]] is not None:
            raise _NotInPlace
        found[data[7]] = view[spans[data[7]][1]:spans[data[7]][2]]
        return found[data[7]]

    try:
        envelope = msgpack.unpackb(b"".join(pieces), ext_hook=payload, **options)
    except Exception:  # _NotInPlace, or anything the plain unpacker will report on the whole frame
        return None
    return envelope if _payloads_in_array_fields(envelope, found, array_fields) else None


class _NotInPlace(Exception):
    """An extension that is no placeholder of this frame, or one met twice."""


def _data_bins(view: memoryview) -> list[tuple[int, int, int]]:
    """(header start, payload start, payload end) of each large bin after a ``"data"`` key, in frame order."""
    spans, pos = [], 0
    while match := _DATA_BIN.search(view, pos):
        header_start = match.start(1)
        length_field = _LENGTH[view[header_start]]
        start = header_start + 1 + length_field.size
        if start > len(view):
            break
        (length,) = length_field.unpack_from(view, header_start + 1)
        if start + length > len(view):
            break
        if length >= MIN_PAYLOAD_BYTES:
            spans.append((header_start, start, start + length))
        pos = start + length  # a payload's bytes are data, whatever they look like
    return spans


def _payloads_in_array_fields(envelope: Any, found: list[memoryview | None],
                              array_fields: Callable[[str], frozenset[str]]) -> bool:
    """Whether every payload came out, each as the ``data`` of one of the body's array fields."""
    if None in found or not isinstance(envelope, dict) or not isinstance(envelope.get("body"), dict):
        return False
    type_name = envelope.get("type")
    fields = array_fields(type_name) if isinstance(type_name, str) else frozenset()
    body = envelope["body"]
    in_place = sum(1 for name in fields if isinstance(body.get(name), dict)
                   and type(body[name].get("data")) is memoryview)
    return in_place == len(found)
