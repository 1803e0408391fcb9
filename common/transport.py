"""ZeroMQ plumbing shared by head and actors: sockets, send, and validated receive.

A malformed message is rejected and counted in ``Inbox.rejected``; it never raises into the
receiver's loop.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import zmq

from common import protocol
from common.auth import ChannelGuard

log = logging.getLogger(__name__)


_guard: ChannelGuard | None = None


def channel_guard() -> ChannelGuard:
    """This process's guard, from ``LONGHORIZON_TOKEN`` (``common/auth.py``)."""
    global _guard
    if _guard is None:
        _guard = ChannelGuard.from_env()
    return _guard


def bind_random(sock: zmq.Socket, host: str) -> str:
    """Bind to a free port on ``host`` and return the address peers connect to.

    Beyond loopback only with the shared token (AuthError otherwise); with a token, peers must
    present it (CURVE) and those that do not are refused and logged.
    """
    guard = channel_guard()
    guard.check_bind(host, "a ZeroMQ channel")
    port = guard.bound(sock).bind_to_random_port(f"tcp://{host}")
    return f"tcp://{host}:{port}"


def connect(sock: zmq.Socket, address: str) -> zmq.Socket:
    """Connect to a bound channel, presenting the shared token if one is set."""
    channel_guard().connecting(sock).connect(address)
    return sock


def configure(sock: zmq.Socket, hwm: int = 10_000) -> zmq.Socket:
    # linger 0: a stopping process must never block on undelivered messages.
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    return sock


class Inbox:
    """Decodes incoming frames into protocol messages, counting what it rejects."""

    def __init__(self, name: str):
        self.name = name
        self.rejected: Counter[str] = Counter()

    def parse(self, frame: bytes, expected: type | tuple[type, ...] | None = None) -> Any | None:
        try:
            return protocol.decode(frame, expected)
        except protocol.ProtocolError as exc:
            self.reject(exc.reason, str(exc))
            return None

    def parse_many(self, frames: list[bytes | memoryview],
                   expected: type | tuple[type, ...] | None = None) -> list[Any | None]:
        """``parse`` of each frame, in order; short episodes among them are checked together
        (``protocol.decode_many``)."""
        parsed = []
        for result in protocol.decode_many(frames, expected):
            if isinstance(result, protocol.ProtocolError):
                self.reject(result.reason, str(result))
                result = None
            parsed.append(result)
        return parsed

    def reject(self, reason: str, detail: str) -> None:
        """Count one rejected message by ``reason``; log the first ones and then every 1000th, so a
        flood of garbage cannot flood the log."""
        self.rejected[reason] += 1
        total = self.total_rejected
        if total <= 20 or total % 1000 == 0:
            log.warning("%s: rejected a message (%s; %d so far): %s", self.name, reason, total, detail)

    @property
    def total_rejected(self) -> int:
        return sum(self.rejected.values())
