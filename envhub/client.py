"""Async HTTP client of the envhub server (used by actors and the conformance checker).

    async with EnvClient("http://127.0.0.1:8000") as client:
        handle = await client.create("keydoor-v0", task_id="3", seed=0)
        result = await client.step(handle.session_id, "go attic")
        await client.close(handle.session_id)

Every non-2xx answer or transport failure raises `EnvClientError` carrying the HTTP status
(None for transport failures) and the server's detail message.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import httpx

from envhub.base import StepResult


class EnvClientError(Exception):
    """An envhub call failed; `status_code` is None when no HTTP answer came back."""

    def __init__(self, status_code: int | None, message: str) -> None:
        super().__init__(f"[{status_code if status_code is not None else 'no response'}] {message}")
        self.status_code = status_code
        self.message = message


@dataclass(frozen=True)
class SessionHandle:
    """A freshly created session and its first observation."""

    session_id: str
    observation: str
    info: dict[str, Any]


class EnvClient:
    """Talks to one envhub server over a pooled `httpx.AsyncClient`."""

    def __init__(self, base_url: str, timeout_s: float = 30.0, max_connections: int = 256) -> None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                              keepalive_expiry=30.0)  # below the server's keep-alive timeout (75 s)
        # trust_env=False: envhub is an internal loopback/cluster service; a proxy from the
        # environment (HTTP_PROXY) must not intercept it.
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits, trust_env=False)

    async def __aenter__(self) -> EnvClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def create(self, env_id: str, task_id: str, seed: int) -> SessionHandle:
        body = await self._request("POST", "/sessions", {"env_id": env_id, "task_id": task_id, "seed": seed})
        with _malformed_answer("POST /sessions"):
            return SessionHandle(body["session_id"], body["observation"], body["info"])

    async def step(self, session_id: str, action: str) -> StepResult:
        body = await self._request("POST", f"/sessions/{session_id}/step", {"action": action})
        with _malformed_answer("POST /sessions/{id}/step"):
            return StepResult(body["observation"], body["reward"], body["terminated"], body["truncated"], body["info"])

    async def close(self, session_id: str) -> None:
        await self._request("DELETE", f"/sessions/{session_id}")

    async def list_envs(self) -> list[dict[str, Any]]:
        return await self._request("GET", "/envs")

    async def health(self) -> dict[str, Any]:
        return await self._request("GET", "/health")

    async def _request(self, method: str, path: str, json_body: dict[str, Any] | None = None) -> Any:
        try:
            response = await self._http.request(method, path, json=json_body)
        except httpx.HTTPError as error:
            raise EnvClientError(None, f"{method} {path} failed: {type(error).__name__}: {error}") from error
        if response.is_success:
            return response.json()
        raise EnvClientError(response.status_code, f"{method} {path}: {_detail(response)}")


@contextlib.contextmanager
def _malformed_answer(call: str) -> Iterator[None]:
    try:
        yield
    except (KeyError, TypeError, ValueError) as error:  # ValueError covers StepContractError
        raise EnvClientError(None, f"{call}: malformed answer from server: {error!r}") from error


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return detail if isinstance(detail, str) else str(detail)
