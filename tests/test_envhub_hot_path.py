"""The lean HTTP path (envhub/hot_path.py) answers exactly what FastAPI's routes answer.

A body sent as ``application/vnd.test+json`` is JSON to FastAPI but not one the lean path takes,
so the same request can be answered by either; the answers must match byte for byte.
"""

from __future__ import annotations

from typing import Iterator

import httpx
import pytest

from common.config.envhub import EnvhubConfig
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

LEAN, FASTAPI = "application/json", "application/vnd.test+json"


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with running_hub(EnvhubConfig(max_action_chars=50)) as url, httpx.Client(base_url=url, trust_env=False) as client:
        yield client


def _post(http: httpx.Client, path: str, body: bytes, content_type: str) -> httpx.Response:
    return http.post(path, content=body, headers={"content-type": content_type})


def _answer(response: httpx.Response) -> tuple[int, str, bytes]:
    return response.status_code, response.headers["content-type"], response.content


def test_create_step_and_close_answer_as_fastapi_does(http: httpx.Client) -> None:
    create = b'{"env_id": "keydoor-v0", "task_id": "4", "seed": 1}'
    lean, routed = _post(http, "/sessions", create, LEAN), _post(http, "/sessions", create, FASTAPI)
    assert lean.status_code == routed.status_code == 201
    lean_id, routed_id = lean.json().pop("session_id"), routed.json().pop("session_id")
    assert lean.content.replace(lean_id.encode(), b"ID") == routed.content.replace(routed_id.encode(), b"ID")
    too_long = b'{"action": "' + b"x" * 51 + b'"}'
    for action in (b'{"action": "go study"}', b'{"action": "\\u00e9 \\ud83d\\ude42"}', too_long):
        lean_step = _post(http, f"/sessions/{lean_id}/step", action, LEAN)
        routed_step = _post(http, f"/sessions/{routed_id}/step", action, FASTAPI)
        assert _answer(lean_step) == _answer(routed_step)
    assert lean_step.status_code == 413
    for session_id in (lean_id, routed_id):
        assert http.delete(f"/sessions/{session_id}").json() == {"closed": True}
    gone = [_post(http, f"/sessions/{sid}/step", b'{"action": "look"}', kind) for sid, kind in
            ((lean_id, LEAN), (routed_id, FASTAPI))]
    assert [response.status_code for response in gone] == [410, 410]


def test_errors_answer_as_fastapi_does(http: httpx.Client) -> None:
    cases = [("/sessions", b'{"env_id": "nosuch-v0", "task_id": "1"}'),
             ("/sessions", b'{"env_id": "keydoor-v0", "task_id": "999999999"}'),
             ("/sessions/no-such-session/step", b'{"action": "look"}')]
    for path, body in cases:
        assert _answer(_post(http, path, body, LEAN)) == _answer(_post(http, path, body, FASTAPI))


def test_a_body_the_lean_path_cannot_take_gets_fastapis_own_422(http: httpx.Client) -> None:
    before = http.get("/health").json()["stats"]["errors"].get("malformed_request", 0)
    for body in (b"{not json", b'{"action": 7}', b'{"action": "look", "extra": 1}', b"[]"):
        response = _post(http, "/sessions/any/step", body, LEAN)
        assert response.status_code == 422 and isinstance(response.json()["detail"], list)
    assert http.get("/health").json()["stats"]["errors"]["malformed_request"] == before + 4
