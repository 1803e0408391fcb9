"""envhub's contract is its schema: every status a route answers is in its /openapi.json entry
(the env API's; the mounted trajectory viewer's at /ui/openapi.json).

A real server on loopback is walked route by route; each status the walk provokes is checked
against the route's documented ``responses`` (and the body against the documented error model).
Bad env options answer 400 naming the option, never 500. The documented codes and meanings come
from one table, envhub/errors.py.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from common.auth import TOKEN_ENV
from common.config.envhub import EnvhubConfig
from envhub import registry
from envhub.base import ConversationStart, Environment, StepResult
from envhub.errors import ANY_ROUTE, ERRORS, MEANING_SEPARATOR, ROUTE_ERRORS
from envhub.options import OptionsError
from envhub.ui import VIEWER_MOUNT
from tests.servers import registered_envs, running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

STEP_TIMEOUT_S = 0.5
MAX_SESSIONS = 3
MAX_ACTION_CHARS = 50
RUN = "run-a"
TOKEN = "contract-test-token-0123456789"
# Options the envs refuse, each naming what is wrong; agentgym-v0 has none at all (no url).
BAD_OPTIONS = {
    "textcraft-v0": {"recipes_dir": "/nonexistent/recipes"},
    "contract-keydoor-v0": {"rooms_per_task": 99},
}


class ContractEnv(Environment):
    """Task 1 plays; task 2 fails its reset, task 3 stalls it, task 4 is ruled out by the options.
    Actions: 'finish' ends the episode, 'explode' raises, 'stall' outlasts the deadline."""

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        if task_id == "2":
            raise RuntimeError("the reset exploded")
        if task_id == "3":
            await asyncio.sleep(60)
        if task_id == "4":
            raise OptionsError("contract-v0: task 4 needs option 'colour'")
        return "A plain room.", {"success": False}

    async def step(self, action: str) -> StepResult:
        if action == "explode":
            raise RuntimeError("the step exploded")
        if action == "stall":
            await asyncio.sleep(60)
        return StepResult("Done." if action == "finish" else "Nothing.", 0.0, action == "finish", False,
                          {"success": False})


class BrokenStartEnv(ContractEnv):
    """Its conversation start fails: a bug in the env, not the request."""

    @classmethod
    def conversation_start(cls, **options: Any) -> ConversationStart:
        raise RuntimeError("the instruction file is gone")


@pytest.fixture(scope="module", autouse=True)
def test_envs() -> Iterator[None]:
    with registered_envs(dict(id="contract-v0", entry_point=f"{__name__}:ContractEnv", max_turns=4,
                              splits={"train": range(5)}),
                         dict(id="contract-broken-start-v0", entry_point=f"{__name__}:BrokenStartEnv", max_turns=4,
                              splits={"train": range(5)}),
                         # keydoor under a second id, so options it refuses leave keydoor-v0 itself usable.
                         dict(id="contract-keydoor-v0", entry_point="envhub.envs.keydoor:KeyDoorEnv", max_turns=8,
                              splits={"train": range(10)})):
        yield


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> EnvhubConfig:
    runs_dir = tmp_path_factory.mktemp("runs")
    (runs_dir / RUN).mkdir()  # an empty run: the viewer lists it with no trajectories
    return EnvhubConfig(step_timeout_s=STEP_TIMEOUT_S, max_sessions=MAX_SESSIONS, max_action_chars=MAX_ACTION_CHARS,
                        runs_dir=str(runs_dir), env_options=BAD_OPTIONS)


@pytest.fixture(scope="module")
def hub(cfg: EnvhubConfig) -> Iterator[httpx.Client]:
    with running_hub(cfg) as url, httpx.Client(base_url=url, timeout=30.0, trust_env=False) as client:
        yield client


class RouteWalk:
    """Sends requests, checks each answer's status, and keeps one answer per (route, status)."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.answers: dict[tuple[str, str], dict[int, httpx.Response]] = defaultdict(dict)
        self.malformed = 0  # answers of FastAPI's request validation (a list of problems as the detail)

    def expect(self, status: int, method: str, route: str, json: Any = None, params: dict[str, Any] | None = None,
               **path: str) -> httpx.Response:
        response = self.http.request(method, route.format(**path), json=json, params=params)
        assert response.status_code == status, f"{method} {route} {path}: {response.status_code} {response.text[:300]}"
        self.answers[(method, route)][status] = response
        self.malformed += status == 422 and isinstance(response.json().get("detail"), list)
        return response


def walk_create(walk: RouteWalk) -> None:
    create = lambda status, body: walk.expect(status, "POST", "/sessions", json=body)  # noqa: E731
    created = create(201, {"env_id": "contract-v0", "task_id": "1"}).json()
    assert created["observation"] == "A plain room."
    walk.http.delete(f"/sessions/{created['session_id']}")
    assert "nosuch-v0" in create(404, {"env_id": "nosuch-v0", "task_id": "1"}).json()["detail"]
    assert "'7'" in create(400, {"env_id": "contract-v0", "task_id": "7"}).json()["detail"]
    fuzzed = create(400, {"env_id": "agentgym-v0", "task_id": ""}).json()["detail"]  # the fuzzer's old 500
    assert "needs option 'url'" in fuzzed
    assert "recipes_dir" in create(400, {"env_id": "textcraft-v0", "task_id": "0"}).json()["detail"]
    assert "rooms_per_task" in create(400, {"env_id": "contract-keydoor-v0", "task_id": "0"}).json()["detail"]
    assert "'colour'" in create(400, {"env_id": "contract-v0", "task_id": "4"}).json()["detail"]
    create(422, {"env_id": "contract-v0"})
    create(422, {"env_id": "contract-v0", "task_id": "1", "extra": True})
    assert "the reset exploded" in create(500, {"env_id": "contract-v0", "task_id": "2"}).json()["detail"]
    assert "deadline" in create(504, {"env_id": "contract-v0", "task_id": "3"}).json()["detail"]


def walk_session_limit(walk: RouteWalk) -> None:
    open_ids = [walk.http.post("/sessions", json={"env_id": "contract-v0", "task_id": "1"}).json()["session_id"]
                for _ in range(MAX_SESSIONS - _open_sessions(walk.http))]
    walk.expect(503, "POST", "/sessions", json={"env_id": "contract-v0", "task_id": "1"})
    for session_id in open_ids:
        walk.expect(200, "DELETE", "/sessions/{session_id}", session_id=session_id)


def walk_step_and_close(walk: RouteWalk) -> None:
    step, close = "/sessions/{session_id}/step", "/sessions/{session_id}"
    session_id = _create(walk.http)
    walk.expect(200, "POST", step, json={"action": "look"}, session_id=session_id)
    walk.expect(413, "POST", step, json={"action": "x" * (MAX_ACTION_CHARS + 1)}, session_id=session_id)
    walk.expect(422, "POST", step, json={"act": "look"}, session_id=session_id)
    walk.expect(200, "POST", step, json={"action": "finish"}, session_id=session_id)
    walk.expect(409, "POST", step, json={"action": "look"}, session_id=session_id)
    walk.expect(200, "DELETE", close, session_id=session_id)
    walk.expect(410, "POST", step, json={"action": "look"}, session_id=session_id)
    walk.expect(404, "POST", step, json={"action": "look"}, session_id="no-such-session")
    walk.expect(404, "DELETE", close, session_id="no-such-session")
    walk.expect(500, "POST", step, json={"action": "explode"}, session_id=_create(walk.http))
    walk.expect(504, "POST", step, json={"action": "stall"}, session_id=_create(walk.http))


def walk_env_routes(walk: RouteWalk) -> None:
    walk.expect(200, "GET", "/health")
    assert walk.expect(200, "GET", "/channel").json()["port"] > 0
    walk.expect(200, "GET", "/envs")
    conversation = "/envs/{env_id}/conversation"
    walk.expect(200, "GET", conversation, env_id="keydoor-v0")
    walk.expect(404, "GET", conversation, env_id="nosuch-v0")
    assert "needs option 'url'" in walk.expect(400, "GET", conversation, env_id="agentgym-v0").json()["detail"]
    broken = walk.expect(500, "GET", conversation, env_id="contract-broken-start-v0").json()["detail"]
    assert "the instruction file is gone" in broken
    walk_task_lists(walk)


def walk_task_lists(walk: RouteWalk) -> None:
    tasks = "/envs/{env_id}/tasks"
    listed = walk.expect(200, "GET", tasks, params={"split": "train"}, env_id="contract-v0").json()
    assert listed == {"env_id": "contract-v0", "split": "train", "max_turns": 4,
                      "task_ids": registry.task_ids("contract-v0", "train")}
    assert "'test'" in walk.expect(400, "GET", tasks, params={"split": "test"}, env_id="contract-v0").json()["detail"]
    options = walk.expect(400, "GET", tasks, params={"split": "train"}, env_id="textcraft-v0").json()["detail"]
    assert "recipes_dir" in options
    walk.expect(404, "GET", tasks, params={"split": "train"}, env_id="nosuch-v0")
    walk.expect(422, "GET", tasks, env_id="contract-v0")  # the split is required


def walk_viewer_routes(walk: RouteWalk) -> None:
    runs, rows, row = "/ui/api/runs", "/ui/api/runs/{run}/trajectories", "/ui/api/runs/{run}/trajectories/{number}"
    walk.expect(200, "GET", runs)
    walk.expect(200, "GET", rows, run=RUN)
    walk.expect(404, "GET", rows, run="no-such-run")
    walk.expect(422, "GET", rows, params={"limit": 0}, run=RUN)
    walk.expect(422, "GET", rows, params={"step": "soon"}, run=RUN)
    walk.expect(404, "GET", row, run=RUN, number="0")
    walk.expect(422, "GET", row, run=RUN, number="first")


def test_every_status_the_walk_provokes_is_documented_for_its_route(hub: httpx.Client) -> None:
    walk = RouteWalk(hub)
    for walk_routes in (walk_create, walk_session_limit, walk_step_and_close, walk_env_routes, walk_viewer_routes):
        walk_routes(walk)
    spec = public_schema(hub)
    assert set(walk.answers) == _operations(spec), "walk every route of the schema, and only those"
    for (method, route), answers in walk.answers.items():
        documented = spec["paths"][route][method.lower()]["responses"]
        for status, response in answers.items():
            assert str(status) in documented, f"{method} {route} answered {status}, undocumented"
            if status >= 400:
                assert _fits(response.json(), documented[str(status)], spec), f"{method} {route} {status} body"
    health = hub.get("/health").json()
    assert health["status"] == "ok" and health["sessions"] == 0  # every failure above closed its session
    # Each malformed request is counted, the mounted viewer's too (its own app, the hub's counts).
    assert health["stats"]["errors"]["malformed_request"] == walk.malformed


def test_without_the_token_every_route_answers_a_documented_401(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    hub_cfg = EnvhubConfig(runs_dir=str(tmp_path))
    with running_hub(hub_cfg) as url, httpx.Client(base_url=url, trust_env=False) as client:
        spec = public_schema(client, headers={"Authorization": f"Bearer {TOKEN}"})
        for method, route in _operations(spec):
            response = client.request(method, re.sub(r"\{\w+\}", "x", route))
            assert response.status_code == 401, (method, route)
            documented = spec["paths"][route][method.lower()]["responses"]
            assert "401" in documented and _fits(response.json(), documented["401"], spec), (method, route)


def test_openapi_lists_every_code_a_route_declares_with_the_tables_meaning(hub: httpx.Client) -> None:
    spec = public_schema(hub)
    assert set(ROUTE_ERRORS) == _operations(spec), "every route of the schema declares its errors, and only those"
    for (method, route), kinds in ROUTE_ERRORS.items():
        documented = spec["paths"][route][method.lower()]["responses"]
        for kind in (*kinds, *ANY_ROUTE):
            error = ERRORS[kind]
            entry = documented.get(str(error.status_code))
            assert entry is not None, f"{method} {route} declares {kind} ({error.status_code}); /openapi.json lacks it"
            assert error.meaning in entry["description"].split(MEANING_SEPARATOR), (method, route, kind)
            assert error.body.__name__ in _body_models(entry), (method, route, kind)


def public_schema(client: httpx.Client, **request: Any) -> dict[str, Any]:
    """envhub's schema and its mounted viewer's as one, the viewer's paths as clients call them."""
    hub = client.get("/openapi.json", **request).raise_for_status().json()
    viewer = client.get(f"{VIEWER_MOUNT}/openapi.json", **request).raise_for_status().json()
    assert not any(path.startswith(VIEWER_MOUNT) for path in hub["paths"]), "the viewer documents its own routes"
    paths = {**hub["paths"], **{VIEWER_MOUNT + path: operations for path, operations in viewer["paths"].items()}}
    schemas = {**viewer["components"]["schemas"], **hub["components"]["schemas"]}
    return {**hub, "paths": paths, "components": {**hub["components"], "schemas": schemas}}


def _operations(spec: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, operations in spec["paths"].items() for method in operations}


def _body_models(documented: dict[str, Any]) -> list[str]:
    """Names of the models a documented response's body may be (one, or a union)."""
    schema = documented["content"]["application/json"]["schema"]
    return [option["$ref"].rsplit("/", 1)[1] for option in schema.get("anyOf", [schema])]


def _fits(body: Any, documented: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Whether an error body has the shape of the documented model (``detail`` a str or a list)."""
    models = spec["components"]["schemas"]
    detail_types = {models[name]["properties"]["detail"]["type"] for name in _body_models(documented)}
    detail = body.get("detail")
    shape = "string" if isinstance(detail, str) else "array" if isinstance(detail, list) else None
    return shape in detail_types


def _create(http: httpx.Client) -> str:
    response = http.post("/sessions", json={"env_id": "contract-v0", "task_id": "1"})
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


def _open_sessions(http: httpx.Client) -> int:
    return http.get("/health").json()["sessions"]
