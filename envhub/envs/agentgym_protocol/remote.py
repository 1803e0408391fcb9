"""HTTP calls to one AgentGym server, and the server-side envs kept for reuse.

AgentGym servers report most failures as HTTP 200 with ``{"error": "..."}``; that, any non-2xx
answer and any transport failure raise `AgentGymServerError`, so envhub ends the session with
status ``env_error`` and the server's message.

Servers without ``/close`` (WebShop, ALFWorld, SQLGym, LMRL-Gym, the tool servers) keep every env
that ``/create`` made until they restart. `IdleEnvs` keeps the ids this envhub process created on
such a server and hands them to later sessions, which reset them: a server holds at most as many
envs as sessions were ever open on it at once, however many episodes are played.
"""

from __future__ import annotations

import functools
import ssl
from collections import defaultdict
from typing import Any, Hashable

import httpx


class AgentGymServerError(RuntimeError):
    """The AgentGym server failed a call; `status_code` is None without an HTTP answer."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # One context for every session: building one per client costs time and memory.
    return ssl.create_default_context()


class AgentGymHttp:
    """One session's connection to an AgentGym server at ``url`` (routes under ``route_prefix``)."""

    def __init__(self, url: str, route_prefix: str, timeout_s: float) -> None:
        self.url, self.route_prefix, self.timeout_s = url, route_prefix, timeout_s
        self._http: httpx.AsyncClient | None = None

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None,
                   params: dict[str, Any] | None = None) -> Any:
        """One request; any failure, including an ``{"error": ...}`` answer, raises AgentGymServerError."""
        path = self.route_prefix + path
        where = f"{method} {self.url}{path}"
        try:
            response = await self._client().request(method, path, json=body, params=params)
        except httpx.HTTPError as error:
            raise AgentGymServerError(f"{where} failed: {type(error).__name__}: {error}") from error
        if response.status_code >= 500:
            # AgentGym's servers are uvicorn apps: after an unhandled exception uvicorn closes the
            # connection it answered 500 on, and a request sent on it before the close arrives fails
            # with ReadError. Drop the pool so the next call opens a fresh connection.
            await self.aclose()
        if not response.is_success:
            raise AgentGymServerError(f"{where} answered HTTP {response.status_code}: {response.text[:300]}",
                                      response.status_code)
        try:
            answer = response.json()
        except ValueError:
            raise AgentGymServerError(f"{where} answered non-JSON: {response.text[:300]!r}") from None
        if isinstance(answer, dict) and "error" in answer:
            raise AgentGymServerError(f"{where} reported an error: {answer['error']}")
        return answer

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            # trust_env=False: env servers are local or cluster-internal; no proxy should intercept them.
            self._http = httpx.AsyncClient(base_url=self.url, timeout=self.timeout_s, trust_env=False,
                                           verify=_tls_context(), limits=httpx.Limits(max_connections=2))
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


class IdleEnvs:
    """Server-side env ids free for reuse and those in use, per server (process-wide).

    envhub runs every session on one event loop, so plain dicts are safe: no await separates a
    check from its update.
    """

    def __init__(self) -> None:
        self._idle: dict[Hashable, list[Any]] = defaultdict(list)
        self._in_use: dict[Hashable, set[Any]] = defaultdict(set)

    def take(self, server: Hashable) -> Any | None:
        """An idle env id of ``server``, now in use; None when it has none."""
        if not self._idle[server]:
            return None
        env_id = self._idle[server].pop()
        self._in_use[server].add(env_id)
        return env_id

    def claim_new(self, server: Hashable, env_id: Any, max_server_envs: int | None) -> None:
        """Mark an id that ``/create`` just answered as in use. Servers with a fixed number of env slots
        (SQLGym 8, WebShop 8000) hand out old ids again once full: one another session holds is refused."""
        if env_id in self._in_use[server]:
            limit = f" (it holds at most {max_server_envs})" if max_server_envs else ""
            raise AgentGymServerError(
                f"{server}: /create answered env id {env_id!r}, which another envhub session is using: the "
                f"server has run out of env slots{limit} and hands out old ones again. Run fewer sessions "
                f"at once against it (envhub.max_sessions, actors) or start more servers.")
        if env_id in self._idle[server]:
            self._idle[server].remove(env_id)
        self._in_use[server].add(env_id)

    def give_back(self, server: Hashable, env_id: Any) -> None:
        self._in_use[server].discard(env_id)
        if env_id not in self._idle[server]:
            self._idle[server].append(env_id)

    def forget(self, server: Hashable, env_id: Any) -> None:
        """Drop an id the server no longer knows (its reset failed)."""
        self._in_use[server].discard(env_id)

    def count(self, server: Hashable) -> tuple[int, int]:
        """(idle, in use) ids of ``server``."""
        return len(self._idle[server]), len(self._in_use[server])


IDLE_ENVS = IdleEnvs()
"""The process's idle server-side envs, shared by every `AgentGymEnv`."""
