"""The shared token that guards every channel bound beyond loopback.

Everything binds 127.0.0.1 by default. Binding another interface (``envhub.host``,
``learner.host``) requires a token shared by all roles, read from ``LONGHORIZON_TOKEN`` (an
environment variable, so it never lands in a config file or the resolved ``config.yaml``):

- ZeroMQ channels use CURVE (encrypted, authenticated). Both key pairs derive from the token,
  so a peer that knows it can connect and a peer that does not fails the handshake; the
  binding side refuses it and logs the refusal (``SocketWatch``).
- envhub's HTTP API requires ``Authorization: Bearer <token>`` (``envhub/auth.py``).

With a token set, every channel is guarded, loopback included.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import itertools
import logging
import os
import socket
import threading
import time
from collections import Counter

import zmq
import zmq.auth.thread
import zmq.utils.monitor

log = logging.getLogger(__name__)

TOKEN_ENV = "LONGHORIZON_TOKEN"
_MIN_TOKEN_CHARS = 16
_LOG_EVERY_S = 10.0


class AuthError(ValueError):
    """A non-loopback bind without a token, or a token too short to be a secret."""


def token_from_env() -> str | None:
    token = os.environ.get(TOKEN_ENV) or None
    if token is not None and len(token) < _MIN_TOKEN_CHARS:
        raise AuthError(f"{TOKEN_ENV} must be at least {_MIN_TOKEN_CHARS} characters "
                        f"(e.g. `export {TOKEN_ENV}=$(openssl rand -hex 24)`)")
    return token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def require_token_for(host: str, what: str) -> str | None:
    """The token to guard a bind on ``host``; AuthError if ``host`` is not loopback and none is set."""
    token = token_from_env()
    if token is None and not is_loopback(host):
        raise AuthError(f"{what} binds {host}, beyond loopback: set a shared token first, "
                        f"e.g. `export {TOKEN_ENV}=$(openssl rand -hex 24)` on every node")
    return token


def tokens_match(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _key_pair(token: str, role: str) -> tuple[bytes, bytes]:
    """A CURVE key pair derived from the token (public, secret), Z85-encoded."""
    secret = zmq.utils.z85.encode(hashlib.sha256(f"longhorizon/{role}/{token}".encode()).digest())
    return zmq.curve_public(secret), secret


class ChannelGuard:
    """Applies the token to ZeroMQ sockets: ``bound(sock)`` before bind, ``connecting(sock)``
    before connect. Without a token it does nothing (loopback only, checked by ``check_bind``)."""

    def __init__(self, token: str | None):
        self.token = token
        self._authenticator: zmq.auth.thread.ThreadAuthenticator | None = None
        self._watch: SocketWatch | None = None

    @classmethod
    def from_env(cls) -> ChannelGuard:
        return cls(token_from_env())

    def check_bind(self, host: str, what: str) -> None:
        if self.token is None:
            require_token_for(host, what)

    def bound(self, sock: zmq.Socket) -> zmq.Socket:
        """Guard a socket about to bind; with or without a token its peers' handshake failures and
        disconnects are counted (a socket has one monitor, so this is where it lives)."""
        if self.token is not None:
            self._start_authenticator(sock.context)
            sock.curve_server = True
            sock.curve_publickey, sock.curve_secretkey = _key_pair(self.token, "server")
        if self._watch is None:
            self._watch = SocketWatch()
            self._watch.start()
        self._watch.add(sock)
        return sock

    def connecting(self, sock: zmq.Socket) -> zmq.Socket:
        if self.token is not None:
            sock.curve_serverkey = _key_pair(self.token, "server")[0]
            sock.curve_publickey, sock.curve_secretkey = _key_pair(self.token, "client")
        return sock

    @property
    def refused(self) -> int:
        """Peers refused so far: a wrong key, or no CURVE at all (a plain ZeroMQ client)."""
        return self._watch.refused if self._watch is not None else 0

    def disconnects(self, sock: zmq.Socket) -> int:
        """Peers of a bound socket whose connection ended: a peer that stopped, or one ZeroMQ
        dropped for a message over the socket's ``MAXMSGSIZE``."""
        return self._watch.disconnects[id(sock)] if self._watch is not None else 0

    def _start_authenticator(self, context: zmq.Context) -> None:
        """A ZAP handler that admits the token's client key."""
        if self._authenticator is not None:
            return
        self._authenticator = zmq.auth.thread.ThreadAuthenticator(zmq.Context(shadow=context.underlying), log=log)
        self._authenticator.start()
        self._authenticator.configure_curve_callback("*", _TokenKeys(self.token))

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None


class _TokenKeys:
    """ZAP credentials provider: admits the one client key the token derives."""

    def __init__(self, token: str):
        self._client_public = _key_pair(token, "client")[0]

    def callback(self, domain: str, key: bytes) -> bool:
        return hmac.compare_digest(key, self._client_public)  # pyzmq passes the Z85 form


class SocketWatch(threading.Thread):
    """Reads the monitor sockets of bound sockets: logs and counts failed handshakes (a peer
    without the token never reaches the application, so this is where it shows) and counts
    disconnects per socket."""

    _FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
               | zmq.EVENT_HANDSHAKE_FAILED_AUTH)

    def __init__(self) -> None:
        super().__init__(name="zmq-socket-watch", daemon=True)
        self.refused = 0
        self.disconnects: Counter[int] = Counter()  # by id() of the watched socket
        self.errors = 0
        self._monitors: list[tuple[int, zmq.Socket]] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._last_log_s = -_LOG_EVERY_S
        self._serial = itertools.count()  # not id(sock): a closed socket's id comes back, its address stays bound

    def add(self, sock: zmq.Socket) -> None:
        address = f"inproc://socket-watch-{id(self)}-{next(self._serial)}"
        sock.monitor(address, self._FAILED | zmq.EVENT_DISCONNECTED)
        # The monitor's peer must live in the same context; a sync shadow also serves asyncio sockets.
        monitor = zmq.Context(shadow=sock.context.underlying).socket(zmq.PAIR)
        monitor.connect(address)
        with self._lock:
            self._monitors.append((id(sock), monitor))

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._read_events()
            except Exception:  # contained: counting must not end because one event could not be read
                self.errors += 1
                log.exception("socket watch: an event could not be read (%d so far)", self.errors)
                time.sleep(0.2)
        with self._lock:
            for _, monitor in self._monitors:
                monitor.close(linger=0)

    def _read_events(self) -> None:
        with self._lock:
            monitors = {monitor: key for key, monitor in self._monitors if not monitor.closed}
        poller = zmq.Poller()
        for monitor in monitors:
            poller.register(monitor, zmq.POLLIN)
        for monitor, _ in poller.poll(200):
            event = zmq.utils.monitor.recv_monitor_message(monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.disconnects[monitors[monitor]] += 1
            elif event["event"] != zmq.EVENT_MONITOR_STOPPED:
                self._refuse(event)

    def _refuse(self, event: dict) -> None:
        # A refused peer retries every few hundred ms: log the first refusal, then one line a while.
        self.refused += 1
        now_s = time.monotonic()
        if now_s - self._last_log_s >= _LOG_EVERY_S:
            self._last_log_s = now_s
            log.warning("refused a ZeroMQ peer without the shared token at %s (%s); %d refusals so far",
                        event["endpoint"].decode(errors="replace"), zmq.Event(event["event"]).name, self.refused)

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=2)
