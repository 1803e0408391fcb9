"""Async HTTP client of the envhub server (used by actors and the conformance checker).

    async with EnvClient("http://127.0.0.1:8000") as client:
        handle = await client.create("keydoor-v0", task_id="3", seed=0)
        result = await client.step(handle.session_id, "go attic")
        await client.close(handle.session_id)

Every non-2xx answer or transport failure raises `EnvClientError` carrying the HTTP status
(None for transport failures) and the server's detail message.

It runs on aiohttp: an actor makes thousands of step calls per second on the same event loop
as its episodes, and httpx's connection pool cost ~70 % of that loop's time at 64 concurrent
episodes (profiled with py-spy); aiohttp's costs a fraction of it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from common.auth import token_from_env
from envhub.base import ConversationStart, StepResult

_KEEPALIVE_S = 30.0
"""Below the server's keep-alive timeout (75 s), so the client never reuses a connection the
server is closing."""


class EnvClientError(Exception):
    """An envhub call failed; `status_code` is None when no HTTP answer came back, and
    `connection_refused` says no server listened (one being restarted, say)."""

    def __init__(self, status_code: int | None, message: str, connection_refused: bool = False) -> None:
        super().__init__(f"[{status_code if status_code is not None else 'no response'}] {message}")
        self.status_code = status_code
        self.message = message
        self.connection_refused = connection_refused


@dataclass(frozen=True)
class SessionHandle:
    """A freshly created session and its first observation."""

    session_id: str
    observation: str
    info: dict[str, Any]


@dataclass(frozen=True)
class TaskList:
    """One split's task ids of an env under the server's options, and the env's own turn limit."""

    env_id: str
    split: str
    task_ids: list[str]
    max_turns: int


class EnvClient:
    """Talks to one envhub server over a pooled `aiohttp.ClientSession`, made on first use (it
    must be made on the event loop that uses it)."""

    def __init__(self, base_url: str, timeout_s: float = 30.0, max_connections: int = 256,
                 token: str | None = None) -> None:
        token = token if token is not None else token_from_env()  # the shared token, if the run has one
        self._base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_connections = max_connections
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EnvClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def create(self, env_id: str, task_id: str, seed: int) -> SessionHandle:
        body = await self._request("POST", "/sessions", {"env_id": env_id, "task_id": task_id, "seed": seed})
        with _CREATE_ANSWER:
            return SessionHandle(body["session_id"], body["observation"], body["info"])

    async def step(self, session_id: str, action: str) -> StepResult:
        body = await self._request("POST", f"/sessions/{session_id}/step", {"action": action})
        with _STEP_ANSWER:
            return StepResult(body["observation"], body["reward"], body["terminated"], body["truncated"], body["info"])

    async def close(self, session_id: str) -> None:
        await self._request("DELETE", f"/sessions/{session_id}")

    async def conversation_start(self, env_id: str) -> ConversationStart:
        """What `env_id` shows before its first observation, under the server's options for it."""
        body = await self._request("GET", f"/envs/{env_id}/conversation")
        with _MalformedAnswer("GET /envs/{id}/conversation"):
            return ConversationStart.from_json(body)

    async def tasks(self, env_id: str, split: str) -> TaskList:
        """The task ids of `split` of `env_id` under the server's options for it (400: no such split)."""
        body = await self._request("GET", f"/envs/{quote(env_id, safe='')}/tasks?{urlencode({'split': split})}")
        with _MalformedAnswer("GET /envs/{id}/tasks"):
            return TaskList(body["env_id"], body["split"], [str(task_id) for task_id in body["task_ids"]],
                            int(body["max_turns"]))

    async def list_envs(self) -> list[dict[str, Any]]:
        return await self._request("GET", "/envs")

    async def health(self) -> dict[str, Any]:
        return await self._request("GET", "/health")

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            # trust_env=False: envhub is an internal loopback/cluster service; a proxy from the
            # environment (HTTP_PROXY) must not intercept it.
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=_KEEPALIVE_S)
            self._http = aiohttp.ClientSession(self._base_url, connector=connector, timeout=self._timeout,
                                               headers=self._headers, trust_env=False)
        return self._http

    async def _request(self, method: str, path: str, json_body: dict[str, Any] | None = None) -> Any:
        try:
            async with self._session().request(method, path, json=json_body) as response:
                text = await response.text()
                status = response.status
        except aiohttp.ClientConnectorError as error:
            refused = isinstance(error.os_error, ConnectionRefusedError)
            raise EnvClientError(None, f"{method} {path} failed: {type(error).__name__}: {error}", refused) from error
        except aiohttp.ClientError as error:
            raise EnvClientError(None, f"{method} {path} failed: {type(error).__name__}: {error}") from error
        except asyncio.TimeoutError as error:
            raise EnvClientError(None, f"{method} {path} failed: timeout after {self._timeout.total} s") from error
        if 200 <= status < 300:
            with _MalformedAnswer(f"{method} {path}"):
                return json.loads(text)
        raise EnvClientError(status, f"{method} {path}: {_detail(text)}")


class _MalformedAnswer:
    """``with _MalformedAnswer(call):`` turns a missing key, a wrong type or a broken contract in
    the server's answer into an ``EnvClientError`` naming the call. A class, not a generator
    context manager (a third of the cost, on every step); it holds no state, so one instance per
    call site serves every call."""

    def __init__(self, call: str) -> None:
        self.call = call

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> bool:
        # ValueError covers StepContractError and bad JSON.
        if kind is not None and issubclass(kind, (KeyError, TypeError, ValueError)):
            raise EnvClientError(None, f"{self.call}: malformed answer from server: {error!r}") from error
        return False


_CREATE_ANSWER, _STEP_ANSWER = _MalformedAnswer("POST /sessions"), _MalformedAnswer("POST /sessions/{id}/step")


def _detail(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return detail if isinstance(detail, str) else str(detail)
