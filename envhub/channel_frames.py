"""The session channel's framing, shared by its server (envhub/channel.py) and client
(envhub/channel_client.py).

A frame is a 4-byte big-endian length, then that many bytes of msgpack (never pickle: a peer
can send only plain values). Requests and answers are msgpack arrays:

    request  [request_id, op, body]     op: "hello" | "create" | "step" | "close"; body a map
    answer   [request_id, status, body] status: the HTTP status the same call answers over HTTP;
                                        body: the HTTP answer's body (errors: {"detail", "kind"})

Bodies: hello {"protocol": 1, "token": str | None} (the first frame; the token as the HTTP API's
bearer token), create {"env_id", "task_id", "seed"}, step {"session_id", "action"}, close
{"session_id"}. Requests may be pipelined; answers come as calls finish, matched by request_id.
A frame that does not decode to a request is answered 422 (request_id nil when unreadable) and
counted; only a length past `MAX_FRAME_BYTES` ends the connection, as nothing after it can be
framed.
"""

from __future__ import annotations

import struct

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 4 * 2**20
"""Largest frame either side accepts: an 8k-character action is ~32 KiB of UTF-8 at most, but
observations (webnav pages) run to hundreds of KiB."""
OPS = ("hello", "create", "step", "close")
FLUSH_FRAMES = 32
"""Frames either side holds before writing them at once, even mid loop pass: both write once a pass
otherwise, and with hundreds of calls in flight each side then works while the other waits (a
convoy: half of each core idle, and the latency of a whole batch on every call)."""


class FrameTooLarge(ValueError):
    """A frame header announced more than `MAX_FRAME_BYTES`; the stream cannot be resynchronized."""


class FrameReader:
    """Cuts a byte stream into frame bodies."""

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The bodies of every frame completed by `data`; `FrameTooLarge` on an oversized header."""
        buffer = self._buffer
        buffer += data
        bodies, offset, size = [], 0, len(buffer)
        while size - offset >= HEADER.size:
            (length,) = HEADER.unpack_from(buffer, offset)
            if length > self.max_frame_bytes:
                raise FrameTooLarge(f"frame of {length} bytes announced; the limit is {self.max_frame_bytes}")
            end = offset + HEADER.size + length
            if end > size:
                break
            bodies.append(bytes(buffer[offset + HEADER.size:end]))
            offset = end
        del buffer[:offset]
        return bodies


def frame(body: bytes) -> bytes:
    """`body` with its length header."""
    return HEADER.pack(len(body)) + body
