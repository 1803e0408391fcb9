"""One generic HTTP server for every registered environment (FastAPI; run by envhub/main.py).

Endpoints (JSON):
    GET    /health                    {"status": "ok", "sessions": n, "stats": {...}}
    GET    /envs                      [{"id", "max_turns", "splits": {name: count} | null, ["error"]}]
    GET    /envs/{env_id}/conversation {"instruction", "acknowledgement", "examples", "default_examples"}:
                                      what the agent reads before the first observation (envhub/base.py)
    GET    /envs/{env_id}/tasks?split=s {"env_id", "split", "max_turns", "task_ids"}: one split's task ids
                                      under this server's options (what the learner samples from)
    POST   /sessions                  {"env_id", "task_id", "seed"} -> 201 {"session_id", "observation", "info"}
    POST   /sessions/{sid}/step       {"action"} -> {"observation", "reward", "terminated", "truncated", "info"}
    DELETE /sessions/{sid}            {"closed": true}   (idempotent for sessions the server already closed)
    GET    /channel                   {"port": n, "protocol": 1}: the session channel beside this API
    GET    /ui, /ui/api/...           the trajectory viewer over ``runs_dir`` (envhub/ui/app.py, mounted)
    GET    /sites/...                 webnav-v0's offline sites (envhub/sites)

Errors carry {"detail": message}: 400 bad task id or split, or an env its options leave unusable
(say, a missing option), 404 unknown env or session, 409 step after the episode ended, 410 session gone
(idle-reaped or closed after a failure), 413 action longer than ``max_action_chars`` (session
kept), 422 malformed body, 500 the env raised (session closed) or a server bug (logged), 503
session limit, 504 env call past its deadline (session closed). envhub/errors.py holds the table
of them; each route documents its own in /openapi.json. A failing env is always reported, never
turned into a silent reward of 0.

The calls actors make all the time (create, step, close) have one fast path: envhub/channel.py
serves them over a persistent msgpack connection per actor, on its own port, with the same
validation and errors as the routes here (the actors' default transport). Over HTTP they take
these FastAPI routes like every other call.
"""

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Coroutine
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError

from common.auth import require_token_for
from common.config.envhub import EnvhubConfig
from envhub import registry
from envhub.auth import TokenMiddleware
from envhub.base import Environment, StepContractError, StepResult
from envhub.channel import start_channel
from envhub.channel_frames import PROTOCOL_VERSION
from envhub.deadline import DeadlinePassed, within_deadline
from envhub.errors import EnvhubError, InternalErrorMiddleware, route_responses
from envhub.options import OPTION_ERRORS, OptionsError
from envhub.session_models import CreateSessionRequest, CreateSessionResponse, StepRequest, StepResponse
from envhub.sessions import (
    EpisodeOverError,
    Session,
    SessionGoneError,
    SessionLimitError,
    SessionTable,
    UnknownSessionError,
)
from envhub.sites.serving import SITES_MOUNT, mount_sites
from envhub.ui import VIEWER_MOUNT, create_viewer_app

logger = logging.getLogger(__name__)


class ServerStats:
    """Error counts per kind and a window of recent step latencies, reported by /health."""

    def __init__(self, latency_window: int = 4096) -> None:
        self.errors: Counter[str] = Counter()
        self.step_latencies_s: deque[float] = deque(maxlen=latency_window)
        self.steps_total = 0
        self.sessions_created = 0
        self.sessions_reaped = 0
        self.channel_connections = 0
        """Session channel connections open now (envhub/channel.py)."""
        self.channel_sessions_released = 0
        """Sessions closed because the channel connection that opened them went away."""

    def snapshot(self) -> dict[str, Any]:
        latencies = sorted(self.step_latencies_s)

        def percentile(fraction: float) -> float | None:
            return latencies[min(len(latencies) - 1, int(fraction * len(latencies)))] if latencies else None

        return {
            "steps_total": self.steps_total,
            "sessions_created": self.sessions_created,
            "sessions_reaped": self.sessions_reaped,
            "channel": {"connections": self.channel_connections,
                        "sessions_released_on_disconnect": self.channel_sessions_released},
            "errors": dict(self.errors),
            "step_latency_s": {"p50": percentile(0.5), "p99": percentile(0.99), "window": len(latencies)},
        }


async def _checked_reset(env: Environment, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
    result = await env.reset(task_id, seed)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise StepContractError(f"reset must return (observation, info), got {type(result).__name__}")
    observation, info = result
    if not isinstance(observation, str) or not isinstance(info, dict):
        raise StepContractError("reset must return (str, dict)")
    _check_json(info)
    return observation, info


async def _checked_step(env: Environment, action: str) -> StepResult:
    result = await env.step(action)
    if not isinstance(result, StepResult):
        raise StepContractError(f"step must return StepResult, got {type(result).__name__}")
    _check_json(result.info)
    return result


_JSON_SCALARS = (str, int, bool, type(None))


def _check_json(info: dict[str, Any]) -> None:
    # Envs' infos are almost always flat maps of text, numbers and bools: checking those directly
    # costs a tenth of encoding them; anything else is encoded to find out.
    for key, value in info.items():
        if type(key) is not str or not (type(value) in _JSON_SCALARS
                                        or (type(value) is float and math.isfinite(value))):
            break
    else:
        return
    try:
        json.dumps(info, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise StepContractError(f"info is not JSON-serializable: {error}") from None


class SessionService:
    """The server's behaviour behind the routes: sessions, deadlines, error mapping, reaping."""

    def __init__(self, cfg: EnvhubConfig) -> None:
        self.cfg = cfg
        self.stats = ServerStats()
        self.table = SessionTable(cfg.max_sessions, cfg.session_idle_timeout_s)

    def options(self, env_id: str) -> dict[str, Any]:
        """Constructor options configured for `env_id` (``envhub.env_options``)."""
        return dict(self.cfg.env_options.get(env_id, {}))

    def conversation_start(self, env_id: str) -> dict[str, Any]:
        """The env's instruction and worked examples under this server's options for it."""
        try:
            return registry.conversation_start(env_id, **self.options(env_id)).to_json()
        except registry.UnknownEnvError as error:
            raise self._error("unknown_env", str(error)) from None
        except OPTION_ERRORS as error:  # options the env refuses, e.g. agentgym-v0 without its url
            raise self._error("env_config", f"env {env_id}: no conversation start under its "
                              f"envhub.env_options: {error}") from None

    def tasks(self, env_id: str, split: str) -> dict[str, Any]:
        """The task ids of one split of `env_id` under this server's options, and its ``max_turns``."""
        try:
            env_spec = registry.spec(env_id)
        except registry.UnknownEnvError as error:
            raise self._error("unknown_env", str(error)) from None
        splits = self._task_splits(env_id, self.options(env_id))
        if split not in splits:
            raise self._error("unknown_split", f"env {env_id} has no split {_shorten(split)!r}; "
                              f"splits: {', '.join(sorted(splits))}")
        return {"env_id": env_id, "split": split, "max_turns": env_spec.max_turns,
                "task_ids": [str(number) for number in splits[split]]}

    def _error(self, kind: str, message: str) -> EnvhubError:
        """The answer to a failed request of `kind`, with the status envhub/errors.py gives it."""
        self.stats.errors[kind] += 1
        return EnvhubError(kind, message)

    def _session(self, session_id: str) -> Session:
        try:
            return self.table.get(session_id, time.monotonic())
        except UnknownSessionError as error:
            raise self._error("unknown_session", str(error)) from None
        except SessionGoneError as error:
            raise self._error("session_gone", str(error)) from None

    async def create(self, request: CreateSessionRequest) -> CreateSessionResponse:
        try:
            env_spec = registry.spec(request.env_id)
        except registry.UnknownEnvError as error:
            raise self._error("unknown_env", str(error)) from None
        options = self.options(request.env_id)
        splits = self._task_splits(request.env_id, options)  # before the task check: it may need options
        if not env_spec.has_task(request.task_id, splits):
            ranges = ", ".join(f"{name}: {_describe(numbers)}" for name, numbers in splits.items())
            raise self._error("bad_task", f"env {request.env_id}: no task {_shorten(request.task_id)!r}; "
                              f"tasks: {ranges}")
        session = self._new_session(request)
        async with session.lock:
            reset = _checked_reset(session.env, request.task_id, request.seed)
            observation, info = await self._call_env(session, "reset", reset)
        self.stats.sessions_created += 1
        return CreateSessionResponse(session_id=session.session_id, observation=observation, info=info)

    def _task_splits(self, env_id: str, options: dict[str, Any]) -> dict[str, range | list[int]]:
        """The env's task list under `options`; 400 naming the option when they leave it unusable."""
        try:
            return registry.task_splits(env_id, **options)
        except OPTION_ERRORS as error:  # e.g. agentgym-v0 without its url: the server's config, not a crash
            raise self._options_error(env_id, error) from None
        except Exception as error:
            logger.exception("could not list the tasks of env %s", env_id)
            raise self._error("env_error", f"could not list the tasks of env {env_id}: {error!r}") from None

    def _options_error(self, env_id: str, error: Exception) -> EnvhubError:
        return self._error("env_config", f"env {env_id} cannot run under its envhub.env_options: {error}")

    def _new_session(self, request: CreateSessionRequest) -> Session:
        # No await between the room check and table.create, so the limit holds under concurrency.
        try:
            self.table.ensure_room()
        except SessionLimitError as error:
            raise self._error("session_limit", str(error)) from None
        try:
            env = registry.make(request.env_id, **self.options(request.env_id))
        except OPTION_ERRORS as error:  # options only the constructor checks (envs with fixed task lists)
            raise self._options_error(request.env_id, error) from None
        except Exception as error:
            logger.exception("could not build env %s", request.env_id)
            raise self._error("env_error", f"could not build env {request.env_id}: {error!r}") from None
        return self.table.create(request.env_id, request.task_id, env, time.monotonic())

    async def step(self, session_id: str, action: str) -> StepResult:
        if len(action) > self.cfg.max_action_chars:
            raise self._error("action_too_large", f"action is {len(action)} characters; the limit is "
                              f"{self.cfg.max_action_chars} (envhub.max_action_chars); the session stays open")
        session = self._session(session_id)
        async with session.lock:
            try:
                session.check_steppable()
            except SessionGoneError as error:
                raise self._error("session_gone", str(error)) from None
            except EpisodeOverError as error:
                raise self._error("episode_over", str(error)) from None
            started_s = time.perf_counter()
            result = await self._call_env(session, "step", _checked_step(session.env, action))
            self.stats.step_latencies_s.append(time.perf_counter() - started_s)
            self.stats.steps_total += 1
            session.last_used_s = time.monotonic()
            session.episode_over = result.terminated or result.truncated
        return result

    async def close(self, session_id: str, reason: str = "closed by client") -> dict[str, Any]:
        gone_reason = self.table.gone_reason(session_id)
        if gone_reason is not None:  # idempotent: clients close in `finally` after a 410/500/504
            return {"closed": True, "reason": gone_reason}
        session = self.table.remove(session_id, reason)
        if session is None:
            raise self._error("unknown_session", f"unknown session {session_id}")
        async with session.lock:  # lets an in-flight step finish first
            await self._close_env(session.env, session.env_id)
        return {"closed": True}

    async def _call_env(self, session: Session, call: str, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Await an env call under the deadline; on timeout or error close the session and raise."""
        where = f"env {session.env_id} task {session.task_id}: {call}"
        try:
            return await within_deadline(coroutine, self.cfg.step_timeout_s)
        except DeadlinePassed:
            await self._discard(session, f"{call} exceeded the {self.cfg.step_timeout_s:g}s deadline")
            raise self._error("timeout", f"{where} exceeded the {self.cfg.step_timeout_s:g}s deadline; "
                              f"session {session.session_id} closed") from None
        except OptionsError as error:  # the task and the options do not fit: say so, not "the env failed"
            await self._discard(session, f"options error in {call}")
            raise self._error("env_config", f"{where}: {error}; session {session.session_id} closed") from None
        except Exception as error:
            return await self._env_failed(session, call, where, error)

    async def _env_failed(self, session: Session, call: str, where: str, error: Exception) -> Any:
        logger.warning("%s raised %r", where, error)
        await self._discard(session, f"env error in {call}")
        raise self._error("env_error", f"{where} raised {type(error).__name__}: {error}; "
                          f"session {session.session_id} closed") from None

    async def _discard(self, session: Session, reason: str) -> None:
        # The caller holds session.lock, so close the env directly.
        self.table.remove(session.session_id, reason)
        await self._close_env(session.env, session.env_id)

    async def _close_env(self, env: Environment, env_id: str) -> None:
        try:
            await within_deadline(env.close(), self.cfg.step_timeout_s)
        except Exception as error:  # the session is gone either way; count it, do not raise
            logger.warning("closing an env %s failed: %r", env_id, error)
            self.stats.errors["close_error"] += 1

    async def _close_sessions(self, sessions: list[Session]) -> None:
        async def close_one(session: Session) -> None:
            async with session.lock:
                await self._close_env(session.env, session.env_id)

        await asyncio.gather(*(close_one(session) for session in sessions))

    async def reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.reap_interval_s)
            try:
                reaped = self.table.reap_idle(time.monotonic())
                self.stats.sessions_reaped += len(reaped)
                await self._close_sessions(reaped)
            except Exception:  # keep reaping; a dead reaper would leak every idle session
                logger.exception("reaping idle sessions failed")
                self.stats.errors["reaper_error"] += 1

    async def shutdown(self) -> None:
        await self._close_sessions(self.table.remove_all("server shut down"))


def create_app(cfg: EnvhubConfig) -> FastAPI:
    """The envhub ASGI app: routes over a `SessionService`, with a reaper for idle sessions."""
    service = SessionService(cfg)
    token = require_token_for(cfg.host, "envhub")  # beyond loopback only with the shared token

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(service.reap_forever(), name="envhub-reaper")
        hub_url = getattr(app.state, "hub_url", None)  # set by EnvhubServer, which knows its port
        channel = await start_channel(service, cfg.host, token, sites_url=hub_url and hub_url + SITES_MOUNT)
        app.state.channel_port = channel.sockets[0].getsockname()[1]
        try:
            yield
        finally:
            channel.close()  # stops listening; open connections end with the server's loop
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await service.shutdown()

    app = FastAPI(title="envhub", lifespan=lifespan)
    app.state.service = service
    app.state.channel_port = None
    _add_routes(app, service)
    # Two apps of their own: the trajectory viewer (envhub/ui; its schema at /ui/openapi.json) and
    # webnav-v0's sites (envhub/sites). The middlewares below wrap them too: one token, one 500 path.
    app.mount(VIEWER_MOUNT, create_viewer_app(cfg.runs_dir, service.stats.errors))
    mount_sites(app)
    app.add_middleware(InternalErrorMiddleware, errors=service.stats.errors)  # a bug answers 500, logged
    if token is not None:
        app.add_middleware(TokenMiddleware, token=token, refusals=service.stats.errors)
    return app


def _add_routes(app: FastAPI, service: SessionService) -> None:
    @app.exception_handler(RequestValidationError)
    async def count_malformed(request: Request, error: RequestValidationError) -> Any:
        service.stats.errors["malformed_request"] += 1
        return await request_validation_exception_handler(request, error)

    @app.get("/health", responses=route_responses("GET", "/health"))
    async def health() -> dict[str, Any]:
        return {"status": "ok", "sessions": len(service.table), "stats": service.stats.snapshot()}

    @app.get("/channel", responses=route_responses("GET", "/channel"))
    async def channel(request: Request) -> dict[str, Any]:
        """Where the session channel (envhub/channel.py) listens: same host, this port."""
        return {"port": request.app.state.channel_port, "protocol": PROTOCOL_VERSION}

    @app.get("/envs", responses=route_responses("GET", "/envs"))
    async def list_envs() -> list[dict[str, Any]]:
        return [_describe_env(env_spec, service.options(env_spec.id)) for env_spec in registry.list_specs()]

    @app.get("/envs/{env_id}/conversation", responses=route_responses("GET", "/envs/{env_id}/conversation"))
    async def conversation(env_id: str) -> dict[str, Any]:
        # Off the event loop: an env may play its worked example the first time (then it is cached).
        return await asyncio.to_thread(service.conversation_start, env_id)

    @app.get("/envs/{env_id}/tasks", responses=route_responses("GET", "/envs/{env_id}/tasks"))
    async def tasks(env_id: str, split: str) -> dict[str, Any]:
        # Off the event loop: the first listing may load a dataset (then it is cached).
        return await asyncio.to_thread(service.tasks, env_id, split)

    @app.post("/sessions", status_code=201, response_model=CreateSessionResponse,
              responses=route_responses("POST", "/sessions"))
    async def create_session(request: CreateSessionRequest) -> CreateSessionResponse:
        return await service.create(request)

    @app.post("/sessions/{session_id}/step", response_model=StepResponse,
              responses=route_responses("POST", "/sessions/{session_id}/step"))
    async def step_session(session_id: str, request: StepRequest) -> StepResponse:
        result = await service.step(session_id, request.action)
        return StepResponse(observation=result.observation, reward=result.reward, terminated=result.terminated,
                            truncated=result.truncated, info=result.info)

    @app.delete("/sessions/{session_id}", responses=route_responses("DELETE", "/sessions/{session_id}"))
    async def close_session(session_id: str) -> dict[str, Any]:
        return await service.close(session_id)


def _describe_env(env_spec: registry.EnvSpec, options: dict[str, Any]) -> dict[str, Any]:
    """One /envs entry; an env whose task list fails (say, a missing option) says why instead."""
    try:
        splits = {name: len(numbers) for name, numbers in registry.task_splits(env_spec.id, **options).items()}
    except Exception as error:
        return {"id": env_spec.id, "max_turns": env_spec.max_turns, "splits": None, "error": str(error)}
    return {"id": env_spec.id, "max_turns": env_spec.max_turns, "splits": splits}


def _shorten(text: str, max_chars: int = 200) -> str:
    """`text` cut for an error message: a fuzzer's megabyte task id need not come back whole."""
    return text if len(text) <= max_chars else f"{text[:max_chars]}... ({len(text)} characters)"


def _describe(numbers: range | list[int]) -> str:
    if isinstance(numbers, range):
        return f"{numbers.start}..{numbers.stop - 1}"
    return f"{len(numbers)} ids from {min(numbers, default=0)} to {max(numbers, default=0)}"
