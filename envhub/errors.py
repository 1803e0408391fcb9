"""Every error envhub answers, in one table: its kind, HTTP status and meaning.

The server raises errors by kind (``SessionService._error``), so the status a kind answers is the
status documented here; `ROUTE_ERRORS` lists the kinds each route can answer, and
`route_responses` turns them into the route's OpenAPI ``responses`` (so ``/openapi.json`` is the
server's contract, and tests/test_envhub_contract.py provokes each status to check it).
The session API's kinds double as the counters in ``/health``'s ``stats.errors``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Union

from fastapi import HTTPException
from pydantic import BaseModel

logger = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    """envhub -> client: why a request failed (every error answer except FastAPI's own 422)."""

    detail: str


class ValidationErrorBody(BaseModel):
    """envhub -> client: a 422 from FastAPI: where the request broke the route's schema."""

    detail: list[dict[str, Any]]


@dataclass(frozen=True)
class ErrorKind:
    """One way a request fails: the status it answers, what that means, and the body it carries."""

    status_code: int
    meaning: str
    body: type[BaseModel] = ErrorBody


ERRORS: dict[str, ErrorKind] = {
    "bad_task": ErrorKind(400, "The task id is not a task of this env (the message lists its splits)."),
    "unknown_split": ErrorKind(400, "The env has no split of this name (the message lists its splits)."),
    "env_config": ErrorKind(400, "The env cannot run under this server's envhub.env_options: the message names "
                                 "the missing or invalid option (or the task those options rule out)."),
    "auth_refused": ErrorKind(401, "Missing or wrong token: the server requires LONGHORIZON_TOKEN as "
                                   "`Authorization: Bearer <token>`."),
    "unknown_env": ErrorKind(404, "No env is registered under this id (the message lists the registered ones)."),
    "unknown_session": ErrorKind(404, "No session with this id was ever opened on this server."),
    "unknown_run": ErrorKind(404, "No run folder, or no trajectory with this number, in the viewer's runs_dir."),
    "episode_over": ErrorKind(409, "A step after the episode terminated or was truncated; create a new session."),
    "session_gone": ErrorKind(410, "The session was closed: idle-reaped, closed by the client, or after an env "
                                   "failure or a missed deadline (the message says which)."),
    "action_too_large": ErrorKind(413, "The action is longer than envhub.max_action_chars; the session stays open."),
    "malformed_request": ErrorKind(422, "The body, path or query does not match the route's schema.",
                                   ValidationErrorBody),
    "bad_query": ErrorKind(422, "A query value the schema cannot check is malformed (the message says which)."),
    "env_error": ErrorKind(500, "The env raised: a failure of the env, not of the request (the session, if "
                                "one was opened, is closed)."),
    "internal_error": ErrorKind(500, "An unexpected failure in the server; it is logged there."),
    "unreadable_trajectory": ErrorKind(500, "The viewer cannot read this trajectory from the run's stream."),
    "session_limit": ErrorKind(503, "The session limit (envhub.max_sessions) is reached; close sessions or retry."),
    "timeout": ErrorKind(504, "An env call exceeded envhub.step_timeout_s; the session is closed."),
}

class EnvhubError(HTTPException):
    """A failed request of a kind in `ERRORS`: FastAPI answers it as ``{"detail": message}`` with the
    kind's status, and the session channel (envhub/channel.py) sends the same status and message."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(status_code=ERRORS[kind].status_code, detail=message)
        self.kind = kind


ANY_ROUTE = ("auth_refused", "internal_error")
"""Kinds every route can answer: the token check runs before any route, and any route can fail."""

MEANING_SEPARATOR = " Or: "
"""Joins the meanings of the kinds that share a status code in one description."""


ROUTE_ERRORS: dict[tuple[str, str], tuple[str, ...]] = {
    ("GET", "/health"): (),
    ("GET", "/channel"): (),
    ("GET", "/envs"): (),  # an env whose task list fails is listed with its error, not failed
    ("GET", "/envs/{env_id}/conversation"): ("env_config", "unknown_env"),
    ("GET", "/envs/{env_id}/tasks"): ("unknown_split", "env_config", "unknown_env", "malformed_request", "env_error"),
    ("POST", "/sessions"): ("bad_task", "env_config", "unknown_env", "malformed_request", "env_error",
                            "session_limit", "timeout"),
    ("POST", "/sessions/{session_id}/step"): ("env_config", "unknown_session", "episode_over", "session_gone",
                                              "action_too_large", "malformed_request", "env_error", "timeout"),
    ("DELETE", "/sessions/{session_id}"): ("unknown_session",),  # closing a gone session succeeds
    ("GET", "/ui/api/runs"): (),
    ("GET", "/ui/api/runs/{run}/trajectories"): ("unknown_run", "malformed_request", "bad_query"),
    ("GET", "/ui/api/runs/{run}/trajectories/{number}"): ("unknown_run", "malformed_request",
                                                          "unreadable_trajectory"),
}
"""The kinds each route answers besides `ANY_ROUTE`, by (method, path as clients call it: the mounted
viewer's /ui routes are in /ui/openapi.json, the rest in /openapi.json)."""


def route_responses(method: str, path: str) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a route: per status code it can answer, the meanings of its
    kinds and the body (a union where those kinds carry different bodies)."""
    by_status: dict[int, list[ErrorKind]] = {}
    for kind in dict.fromkeys((*ROUTE_ERRORS[(method, path)], *ANY_ROUTE)):  # ordered, no repeats
        error = ERRORS[kind]
        by_status.setdefault(error.status_code, []).append(error)
    return {status: _response(errors) for status, errors in sorted(by_status.items())}


def _response(errors: list[ErrorKind]) -> dict[str, Any]:
    bodies = tuple(dict.fromkeys(error.body for error in errors))
    model = bodies[0] if len(bodies) == 1 else Union[bodies]  # noqa: UP007 (a runtime union of classes)
    return {"description": MEANING_SEPARATOR.join(error.meaning for error in errors), "model": model}


class InternalErrorMiddleware:
    """ASGI middleware: an exception no route handled answers 500 with an `ErrorBody`, is counted
    as ``internal_error`` and logged with its traceback. FastAPI's own handler for ``Exception``
    re-raises after answering, and uvicorn then drops the keep-alive connection under the client."""

    def __init__(self, app: Any, errors: Counter[str]) -> None:
        self.app, self._errors = app, errors

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_noting_start(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_noting_start)
        except Exception as error:
            if started:
                raise  # too late for an answer of our own: the server ends the response
            logger.exception("%s %s failed", scope.get("method"), scope.get("path"))
            self._errors["internal_error"] += 1
            body = {"detail": f"internal error in envhub: {type(error).__name__}: {error}"}
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": json.dumps(body).encode()})
