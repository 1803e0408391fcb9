"""Client of the session channel (envhub/channel.py): an `EnvClient` whose create, step and close
travel as pipelined msgpack frames over one connection instead of one HTTP request each.

    async with ChannelEnvClient("http://127.0.0.1:8000") as client:   # the server's HTTP url
        handle = await client.create("keydoor-v0", task_id="3", seed=0)
        result = await client.step(handle.session_id, "go attic")
        await client.close(handle.session_id)

The rest of the API (health, list_envs, conversation_start) goes over HTTP, as does the look-up
of the channel's port (``GET /channel``); the connection is made on first use and again after it
is lost. Failures raise `EnvClientError` exactly as over HTTP: the server's status and message,
status None when no answer came (transport failure, the per-call deadline). Sessions opened over
a connection that is lost are closed by the server: a later step on one answers 410.

`make_env_client(url, timeout_s, transport)` picks the transport (``actors.env_transport``).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Literal
from urllib.parse import urlsplit

import msgpack

from common.auth import token_from_env
from envhub.base import StepResult
from envhub.channel_frames import FLUSH_FRAMES, MAX_FRAME_BYTES, PROTOCOL_VERSION, FrameReader, FrameTooLarge, frame
from envhub.client import EnvClient, EnvClientError, SessionHandle, _MalformedAnswer

EnvTransport = Literal["channel", "http"]
_CREATE_ANSWER, _STEP_ANSWER = _MalformedAnswer("channel create"), _MalformedAnswer("channel step")


def make_env_client(base_url: str, timeout_s: float = 30.0, transport: EnvTransport = "channel",
                    token: str | None = None) -> EnvClient:
    """The client of the envhub at `base_url` whose session calls use `transport`."""
    if transport == "channel":
        return ChannelEnvClient(base_url, timeout_s, token=token)
    if transport == "http":
        return EnvClient(base_url, timeout_s, token=token)
    raise ValueError(f"env transport must be channel or http, got {transport!r}")


class _Connection(asyncio.Protocol):
    """The socket side: frames out once per loop pass, answers in, matched to waiting futures.

    Deadlines are kept by one sweep a second (or a quarter of the timeout) over the calls in
    flight, not by a timer per call: a timer armed and cancelled on every step cost the actor more
    than packing the frame. A call thus fails between ``timeout_s`` and ``timeout_s`` + one sweep.
    """

    def __init__(self, where: str, timeout_s: float) -> None:
        self.where, self.timeout_s = where, timeout_s
        self.transport: asyncio.Transport | None = None
        self.pending: dict[int, tuple[asyncio.Future, float, str]] = {}
        """request_id -> (its future, its deadline on the loop's clock, its op)."""
        self.lost: EnvClientError | None = None
        self._loop = asyncio.get_running_loop()
        self._reader = FrameReader(MAX_FRAME_BYTES)
        self._packer = msgpack.Packer(use_bin_type=True)
        self._outbox: list[bytes] = []
        self._sweep_s = min(1.0, timeout_s / 4)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._loop.call_later(self._sweep_s, self._sweep)

    def connection_lost(self, error: Exception | None) -> None:
        self.lost = EnvClientError(None, f"session channel to {self.where} lost: {error or 'closed by the server'}")
        for future, _, _ in self.pending.values():
            if not future.done():
                future.set_exception(self.lost)
        self.pending.clear()

    def send(self, request_id: int, op: str, body: dict[str, Any]) -> asyncio.Future:
        future = self._loop.create_future()
        self.pending[request_id] = (future, self._loop.time() + self.timeout_s, op)
        if not self._outbox:
            self._loop.call_soon(self._flush)
        self._outbox.append(frame(self._packer.pack([request_id, op, body])))
        if len(self._outbox) >= FLUSH_FRAMES:
            self._flush()
        return future

    def _sweep(self) -> None:
        """Fail the calls whose deadline passed (an answer that comes later is dropped)."""
        if self.lost is not None:
            return
        now = self._loop.time()
        for request_id in [rid for rid, (_, deadline, _) in self.pending.items() if deadline <= now]:
            future, _, op = self.pending.pop(request_id)
            if not future.done():
                future.set_exception(EnvClientError(None, f"channel {op} failed: timeout after {self.timeout_s} s"))
        self._loop.call_later(self._sweep_s, self._sweep)

    def _flush(self) -> None:
        if self._outbox and self.lost is None:
            self.transport.write(b"".join(self._outbox))
        self._outbox.clear()

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self._reader.feed(data)
            for body in bodies:
                request_id, status, answer = msgpack.unpackb(body, raw=False)
                waiting = self.pending.pop(request_id, None)
                if waiting is not None and not waiting[0].done():
                    waiting[0].set_result((status, answer))
        except (FrameTooLarge, ValueError, TypeError) as error:  # a broken server: nothing after can be trusted
            self.transport.abort()
            self.connection_lost(EnvClientError(None, f"malformed answer from server: {error!r}"))


class ChannelEnvClient(EnvClient):
    """`EnvClient` with create/step/close over the session channel; see the module docstring."""

    def __init__(self, base_url: str, timeout_s: float = 30.0, max_connections: int = 16,
                 token: str | None = None) -> None:
        super().__init__(base_url, timeout_s, max_connections, token)
        self._timeout_s = timeout_s
        self._token = token if token is not None else token_from_env()
        self._connection: _Connection | None = None
        self._connecting = asyncio.Lock()
        self._request_ids = itertools.count(1)

    async def aclose(self) -> None:
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.close()
        self._connection = None
        await super().aclose()

    async def create(self, env_id: str, task_id: str, seed: int) -> SessionHandle:
        body = await self._call("create", {"env_id": env_id, "task_id": task_id, "seed": seed})
        with _CREATE_ANSWER:
            return SessionHandle(body["session_id"], body["observation"], body["info"])

    async def step(self, session_id: str, action: str) -> StepResult:
        body = await self._call("step", {"session_id": session_id, "action": action})
        with _STEP_ANSWER:
            return StepResult(body["observation"], body["reward"], body["terminated"], body["truncated"], body["info"])

    async def close(self, session_id: str) -> None:
        await self._call("close", {"session_id": session_id})

    async def _call(self, op: str, body: dict[str, Any]) -> Any:
        connection = self._connection
        if connection is None or connection.lost is not None:
            connection = await self._connect()
        return await self._exchange(connection, op, body)

    async def _exchange(self, connection: _Connection, op: str, body: dict[str, Any]) -> Any:
        status, answer = await connection.send(next(self._request_ids), op, body)
        if 200 <= status < 300:
            return answer
        detail = answer.get("detail", answer) if isinstance(answer, dict) else answer
        raise EnvClientError(status, f"channel {op}: {detail if isinstance(detail, str) else str(detail)}")

    async def _connect(self) -> _Connection:
        async with self._connecting:  # one connection, however many episodes ask at once
            if self._connection is not None and self._connection.lost is None:
                return self._connection
            host = urlsplit(self._base_url).hostname or "127.0.0.1"
            port = (await self._request("GET", "/channel"))["port"]
            where = f"{host}:{port}"
            try:
                _, connection = await asyncio.get_running_loop().create_connection(
                    lambda: _Connection(where, self._timeout_s), host, port)
            except OSError as error:
                raise EnvClientError(None, f"session channel to {where}: {error}",
                                     isinstance(error, ConnectionRefusedError)) from error
            await self._exchange(connection, "hello", {"protocol": PROTOCOL_VERSION, "token": self._token})
            self._connection = connection
            return connection
