"""Array payloads on the wire, packed aligned so that a receiver can use them in place.

The receiver's decoder (``common/wire_decoder.py``) leaves every array's bytes in the frame
it received, as a read-only view: copying them out cost most of what decoding a 30k-token
``Trajectory`` cost (0.4 MB into fresh memory per episode, and glibc hands freed pages back to
the kernel, so each copy also took ~100 page faults).

``pack`` writes a message as ``msgpack.packb`` would, but for the array fields, whose maps it
writes itself so that each payload starts at a multiple of 8 bytes from the frame's start
(msgpack lets a string take a longer header than it needs; three of the map's take 1, 2 or 4
bytes more). Any msgpack reader decodes the same values, and arrays left in place are aligned:
numpy's aligned loops are twice as fast as its unaligned ones.
"""

from __future__ import annotations

from typing import Any

import msgpack

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
