"""The lean HTTP path for the calls actors make all the time: create, step and close a session.

An ASGI middleware in front of FastAPI (envhub/server.py). FastAPI's routing, dependency solving
and response serialization cost most of a step's server time, so these three routes are answered
here, calling the same `SessionService` with the same pydantic models, and writing the JSON
FastAPI would write (``JSONResponse``'s compact encoding). It handles only requests it can parse
cleanly: any other (a body that is not JSON, fails validation, or is not sent as
``application/json``) falls through, body and all, to the FastAPI route, so every 422 is
FastAPI's own. The routes stay declared there too: they document the contract in /openapi.json.
"""

from __future__ import annotations

import json
import re
from typing import Any, Awaitable, Callable

from pydantic import ValidationError

from envhub.errors import EnvhubError
from envhub.session_models import CreateSessionRequest, StepRequest

_STEP_PATH = re.compile(r"/sessions/([^/]+)/step")
_SESSION_PATH = re.compile(r"/sessions/([^/]+)")
_JSON_TYPES = (b"application/json", b"application/json; charset=utf-8")


class SessionHotPath:
    """ASGI middleware: POST /sessions, POST /sessions/{id}/step and DELETE /sessions/{id}."""

    def __init__(self, app: Any, service: Any) -> None:
        self.app, self.service = app, service

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if method == "POST" and (path == "/sessions" or _STEP_PATH.fullmatch(path)):
            await self._post(scope, receive, send, path)
        elif method == "DELETE" and (match := _SESSION_PATH.fullmatch(path)):
            await self._answer(send, lambda: self.service.close(match.group(1)), _as_is)
        else:
            await self.app(scope, receive, send)

    async def _post(self, scope: dict[str, Any], receive: Callable, send: Callable, path: str) -> None:
        body = await _read_body(receive)
        step = _STEP_PATH.fullmatch(path)
        try:
            if not _sent_as_json(scope):
                raise ValueError("not sent as JSON")
            payload = json.loads(body)
            request = (StepRequest if step else CreateSessionRequest).model_validate(payload)
        except (ValueError, ValidationError):  # FastAPI answers it (a 422), and counts it
            await self.app(scope, _replay(body, receive), send)
            return
        if step:
            await self._answer(send, lambda: self.service.step(step.group(1), request.action), _step_body)
        else:
            await self._answer(send, lambda: self.service.create(request), _created_body, status=201)

    async def _answer(self, send: Callable, call: Callable[[], Awaitable[Any]], encode: Callable[[Any], Any],
                      status: int = 200) -> None:
        try:
            content = encode(await call())
        except EnvhubError as error:  # as FastAPI's handler of HTTPException answers it
            status, content = error.status_code, {"detail": error.detail}
        body = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(body)).encode()), (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


def _sent_as_json(scope: dict[str, Any]) -> bool:
    content_types = [value for name, value in scope["headers"] if name == b"content-type"]
    return len(content_types) == 1 and content_types[0].lower() in _JSON_TYPES


async def _read_body(receive: Callable) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Callable) -> Callable:
    """A `receive` that yields the already-read body once, then defers to the real one."""
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _as_is(content: dict[str, Any]) -> dict[str, Any]:
    return content


def _created_body(created: Any) -> dict[str, Any]:
    return {"session_id": created.session_id, "observation": created.observation, "info": created.info}


def _step_body(result: Any) -> dict[str, Any]:
    return {"observation": result.observation, "reward": result.reward, "terminated": result.terminated,
            "truncated": result.truncated, "info": result.info}
