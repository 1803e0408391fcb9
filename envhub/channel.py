"""The session channel: create, step and close over one persistent msgpack connection per actor.

Beside the JSON HTTP API (envhub/server.py), on a port of its own that ``GET /channel`` names.
Frames and messages are in envhub/channel_frames.py. Each request runs the same
`SessionService` call as its HTTP route, validated by the same pydantic models (the channel's
step and close carry the session id in the body instead of the path), and answers the same
status and message; a failure is counted under the same kind in ``/health``'s ``stats.errors``.

What the connection adds over HTTP:
1. the first frame is a hello carrying the protocol version and, where the server requires one,
   the token (the HTTP API's bearer token); anything else first is refused (401) and ends it;
2. requests are pipelined: each runs as its own task, answers go out as they finish, written
   once per event-loop pass for all of them;
3. the sessions a connection opened are closed when it goes away (an actor that dies or
   disconnects releases its sessions at once instead of waiting for the idle reaper);
4. a frame that does not decode to a request is answered 422 and counted, and the connection
   and its sessions go on; only an oversized frame header ends the connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgpack
from pydantic import BaseModel, ConfigDict, ValidationError

from common.auth import tokens_match
from envhub.channel_frames import (
    FLUSH_FRAMES,
    MAX_FRAME_BYTES,
    OPS,
    PROTOCOL_VERSION,
    FrameReader,
    FrameTooLarge,
    frame,
)
from envhub.errors import ERRORS, EnvhubError
from envhub.session_models import CreateSessionRequest
from envhub.sites.serving import hub_sites_url

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 4096
"""Requests of one connection running at once; past it the server stops reading from it."""
DISCONNECT_REASON = "its session channel disconnected"


class HelloRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    protocol: int
    token: str | None = None


class ChannelStepRequest(BaseModel):
    """The HTTP step's path id and body (``StepRequest``) in one map."""

    model_config = ConfigDict(extra="forbid")
    session_id: str
    action: str


class ChannelCloseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str


class MalformedFrame(ValueError):
    """A frame that is not a request; `request_id` when one could be read, for the answer."""

    def __init__(self, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


def decode_request(body: bytes) -> tuple[int, str, dict[str, Any]]:
    """(request_id, op, body map) of a request frame; `MalformedFrame` for anything else."""
    try:
        request = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except Exception as error:  # msgpack raises several types (ExtraData, FormatError, StackError, ...)
        raise MalformedFrame(f"not msgpack: {type(error).__name__}: {error}") from None
    if not (type(request) is list and len(request) == 3):
        raise MalformedFrame("a request is an array [request_id, op, body]")
    request_id, op, arguments = request
    if type(request_id) is not int or not 0 <= request_id < 2**63:
        raise MalformedFrame("request_id must be an integer in [0, 2**63)")
    if op not in OPS:
        raise MalformedFrame(f"unknown op {str(op)[:40]!r}; ops: {', '.join(OPS)}", request_id)
    if type(arguments) is not dict:
        raise MalformedFrame(f"the body of {op} must be a map", request_id)
    return request_id, op, arguments


class ChannelConnection(asyncio.Protocol):
    """One actor's connection: decodes frames, runs each request as a task, writes the answers."""

    def __init__(self, service: Any, token: str | None, sites_url: str | None = None) -> None:
        self.service, self.token, self.sites_url = service, token, sites_url
        self.transport: asyncio.Transport | None = None
        self.authenticated = False
        self.closed = False
        self.sessions: set[str] = set()
        """Sessions this connection opened and has not closed: released when it goes away."""
        self._reader = FrameReader(MAX_FRAME_BYTES)
        self._packer = msgpack.Packer(use_bin_type=True)
        self._outbox: list[bytes] = []
        self._tasks: set[asyncio.Task] = set()
        self._paused_for = set()  # "in_flight" and/or "writing": why reading is paused

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.service.stats.channel_connections += 1

    def connection_lost(self, error: Exception | None) -> None:
        self.closed = True
        self.service.stats.channel_connections -= 1
        for session_id in list(self.sessions):
            self._release(session_id)

    def pause_writing(self) -> None:  # the peer does not read its answers: stop taking requests
        self._pause("writing")

    def resume_writing(self) -> None:
        self._resume("writing")

    def data_received(self, data: bytes) -> None:
        try:
            bodies = self._reader.feed(data)
        except FrameTooLarge as error:
            self._reject(None, str(error))
            self._flush()
            self.transport.close()
            return
        for body in bodies:
            self._dispatch(body)

    def _dispatch(self, body: bytes) -> None:
        try:
            request_id, op, arguments = decode_request(body)
        except MalformedFrame as error:
            self._reject(error.request_id, str(error))
            return
        if op == "hello":  # no I/O: answered in order, so requests pipelined behind it find it done
            self._answer_hello(request_id, arguments)
            return
        if not self.authenticated:
            self._refuse(request_id, "the first frame must be a hello")
            return
        task = asyncio.get_running_loop().create_task(self._handle(request_id, op, arguments))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        if len(self._tasks) >= MAX_IN_FLIGHT:
            self._pause("in_flight")

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if len(self._tasks) < MAX_IN_FLIGHT // 2:
            self._resume("in_flight")

    async def _handle(self, request_id: int, op: str, arguments: dict[str, Any]) -> None:
        if self.sites_url:  # this task's context: an env reset here browses the hub's own /sites
            hub_sites_url.set(self.sites_url)
        try:
            status, answer = await self._run(op, arguments)
        except Exception as error:
            status, answer = self._failure(op, error)
        self._answer(request_id, status, answer)

    def _answer_hello(self, request_id: int, arguments: dict[str, Any]) -> None:
        try:
            status, answer = self._hello(HelloRequest.model_validate(arguments))
        except Exception as error:
            status, answer = self._failure("hello", error)
        self._answer(request_id, status, answer)
        if not self.authenticated:  # refused: the answer goes out, then the connection ends
            self._flush()
            self.transport.close()

    def _failure(self, op: str, error: Exception) -> tuple[int, dict[str, Any]]:
        """The status and answer of a failed request, as the HTTP API gives them."""
        if isinstance(error, ValidationError):
            self.service.stats.errors["malformed_request"] += 1
            return 422, {"detail": _as_http_errors(error), "kind": "malformed_request"}
        if isinstance(error, EnvhubError):
            return error.status_code, {"detail": error.detail, "kind": error.kind}
        logger.exception("channel %s failed", op, exc_info=error)  # a server bug, as InternalErrorMiddleware
        self.service.stats.errors["internal_error"] += 1
        return 500, {"detail": f"internal error in envhub: {type(error).__name__}: {error}", "kind": "internal_error"}

    async def _run(self, op: str, arguments: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        service = self.service
        if op == "step":
            request = ChannelStepRequest.model_validate(arguments)
            result = await service.step(request.session_id, request.action)
            return 200, {"observation": result.observation, "reward": result.reward,
                         "terminated": result.terminated, "truncated": result.truncated, "info": result.info}
        if op == "create":
            created = await service.create(CreateSessionRequest.model_validate(arguments))
            if self.closed:  # the connection went away while the env reset
                await service.close(created.session_id, DISCONNECT_REASON)
            else:
                self.sessions.add(created.session_id)
            return 201, {"session_id": created.session_id, "observation": created.observation, "info": created.info}
        if op == "close":
            request = ChannelCloseRequest.model_validate(arguments)
            self.sessions.discard(request.session_id)
            return 200, await service.close(request.session_id)
        raise AssertionError(f"op {op!r} reached _run: decode_request admits only OPS, hello is answered in _dispatch")

    def _hello(self, hello: HelloRequest) -> tuple[int, dict[str, Any]]:
        if hello.protocol != PROTOCOL_VERSION:
            raise self.service._error("malformed_request", f"protocol {hello.protocol} is not served; this "
                                      f"server speaks protocol {PROTOCOL_VERSION}")
        if self.token is not None and not tokens_match(hello.token, self.token):
            raise self.service._error("auth_refused", "missing or wrong token: this envhub requires "
                                      "LONGHORIZON_TOKEN in the channel's hello")
        self.authenticated = True
        return 200, {"protocol": PROTOCOL_VERSION, "max_frame_bytes": MAX_FRAME_BYTES}

    def _release(self, session_id: str) -> None:
        self.sessions.discard(session_id)
        self.service.stats.channel_sessions_released += 1
        task = asyncio.get_running_loop().create_task(self.service.close(session_id, DISCONNECT_REASON))
        self._tasks.add(task)  # keeps a reference until it finishes
        task.add_done_callback(self._tasks.discard)

    def _reject(self, request_id: int | None, message: str) -> None:
        self.service.stats.errors["malformed_request"] += 1
        self._answer(request_id, ERRORS["malformed_request"].status_code,
                     {"detail": f"malformed frame: {message}", "kind": "malformed_request"})

    def _refuse(self, request_id: int, message: str) -> None:
        self.service.stats.errors["auth_refused"] += 1
        self._answer(request_id, ERRORS["auth_refused"].status_code, {"detail": message, "kind": "auth_refused"})
        self._flush()
        self.transport.close()

    def _answer(self, request_id: int | None, status: int, answer: dict[str, Any]) -> None:
        if self.transport.is_closing():
            return
        if not self._outbox:  # one write per loop pass for every answer ready in it
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(frame(self._packer.pack([request_id, status, answer])))
        if len(self._outbox) >= FLUSH_FRAMES:
            self._flush()

    def _flush(self) -> None:
        if self._outbox and not self.transport.is_closing():
            self.transport.write(b"".join(self._outbox))
        self._outbox.clear()

    def _pause(self, reason: str) -> None:
        if not self._paused_for and not self.closed:
            self.transport.pause_reading()
        self._paused_for.add(reason)

    def _resume(self, reason: str) -> None:
        if reason in self._paused_for:
            self._paused_for.discard(reason)
            if not self._paused_for and not self.closed:
                self.transport.resume_reading()


def _as_http_errors(error: ValidationError) -> list[dict[str, Any]]:
    """The errors as FastAPI's 422 lists them, each location under "body"; the inputs go back as they
    came (they came as msgpack, so they pack), the context's values as text."""
    entries = error.errors(include_url=False)
    for entry in entries:
        entry["loc"] = ["body", *entry["loc"]]
        if "ctx" in entry:
            entry["ctx"] = {key: str(value) for key, value in entry["ctx"].items()}
    return entries


async def start_channel(service: Any, host: str, token: str | None, sites_url: str | None = None) -> asyncio.Server:
    """Listen for channel connections on `host` at a free port (``server.sockets[0]`` has it);
    ``sites_url``: the hub's ``/sites``, for webnav sessions opened over the channel."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: ChannelConnection(service, token, sites_url), host, 0)
