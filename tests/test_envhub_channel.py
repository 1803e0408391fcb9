"""The session channel (envhub/channel.py) beside the HTTP API: same contract, same errors.

The conformance checker over it; every status the session calls answer, compared call by call
with HTTP; malformed frames rejected and counted while the connection and its sessions go on;
sessions released when their connection goes away; the hello and the token.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any, Iterator

import httpx
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.auth import TOKEN_ENV
from common.config.envhub import EnvhubConfig
from envhub.base import Environment, StepResult
from envhub.channel_client import ChannelEnvClient, make_env_client
from envhub.channel_frames import FLUSH_FRAMES, HEADER, MAX_FRAME_BYTES, PROTOCOL_VERSION, FrameReader, frame
from envhub.client import EnvClient, EnvClientError
from envhub.conformance import check_env
from tests.servers import registered_envs, running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

MAX_ACTION_CHARS = 4000  # above the conformance checker's 2000-character garbage action
MAX_SESSIONS = 12
CONFORMANCE_ENV_IDS = ("keydoor-v0", "textcraft-v0", "babyai-v0")


class StallingEnv(Environment):
    """Ends on 'finish', raises on 'explode', outlasts any deadline on 'stall'."""

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        return "A plain room.", {"success": False}

    async def step(self, action: str) -> StepResult:
        if action == "explode":
            raise RuntimeError("the step exploded")
        if action == "stall":
            await asyncio.sleep(60)
        return StepResult("Nothing happens.", 0.0, action == "finish", False, {"success": False})


@pytest.fixture(scope="module", autouse=True)
def test_envs() -> Iterator[None]:
    with registered_envs(dict(id="channel-test-v0", entry_point=f"{__name__}:StallingEnv", max_turns=4,
                              splits={"train": range(3)})):
        yield


@pytest.fixture(scope="module")
def hub_url() -> Iterator[str]:
    cfg = EnvhubConfig(max_action_chars=MAX_ACTION_CHARS, max_sessions=MAX_SESSIONS, step_timeout_s=0.5)
    with running_hub(cfg) as url:
        yield url


class RawChannel:
    """A bare socket speaking frames, to send what no well-behaved client would."""

    def __init__(self, url: str, hello: bool = True, token: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        port = httpx.get(f"{url}/channel", headers=headers, trust_env=False).json()["port"]
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = FrameReader()
        self.answers: list[list] = []
        if hello:
            assert self.call(0, "hello", {"protocol": PROTOCOL_VERSION})[1] == 200

    def send_body(self, body: bytes) -> None:
        self.sock.sendall(frame(body))

    def receive(self) -> list:
        while not self.answers:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.answers += [msgpack.unpackb(body) for body in self.reader.feed(data)]
        return self.answers.pop(0)

    def call(self, request_id: Any, op: Any, body: Any) -> list:
        self.send_body(msgpack.packb([request_id, op, body]))
        return self.receive()

    def closed_by_server(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True


def _health(url: str, token: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{url}/health", headers=headers, trust_env=False).json()


@pytest.mark.parametrize("env_id", CONFORMANCE_ENV_IDS)
def test_conformance_over_the_channel(hub_url: str, env_id: str) -> None:
    async def body() -> None:
        async with ChannelEnvClient(hub_url) as client:
            report = await check_env(client, env_id)
            assert report.steps_taken >= 1
            if env_id == "keydoor-v0":  # a winning script: the 409 after the end is checked too
                assert report.reached_terminal and report.success is True

    asyncio.run(body())


async def _statuses(client: EnvClient) -> list[int | None]:
    """The status of each call of a walk through every way the session calls fail."""

    async def status(call: Any) -> int | None:
        try:
            await call
        except EnvClientError as error:
            return error.status_code
        return 200

    ended = await client.create("channel-test-v0", "0", 0)
    failing = await client.create("channel-test-v0", "1", 0)
    stalling = await client.create("channel-test-v0", "2", 0)
    statuses = [
        await status(client.create("nosuch-v0", "0", 0)),
        await status(client.create("channel-test-v0", "9", 0)),
        await status(client._call("create", {"env_id": "channel-test-v0", "task_id": "0", "extra": 1})
                     if isinstance(client, ChannelEnvClient)
                     else client._request("POST", "/sessions", {"env_id": "channel-test-v0", "task_id": "0",
                                                                 "extra": 1})),
        await status(client.step(ended.session_id, "x" * (MAX_ACTION_CHARS + 1))),
        await status(client.step(ended.session_id, "finish")),
        await status(client.step(ended.session_id, "look")),
        await status(client.step("no-such-session", "look")),
        await status(client.step(failing.session_id, "explode")),
        await status(client.step(stalling.session_id, "stall")),
    ]
    await client.close(ended.session_id)
    statuses += [await status(client.step(ended.session_id, "look")),
                 await status(client.close("no-such-session"))]
    await client.close(failing.session_id)  # closed by the server already: closing is idempotent
    opened = [await client.create("channel-test-v0", "0", 0) for _ in range(MAX_SESSIONS - await _open(client))]
    statuses.append(await status(client.create("channel-test-v0", "0", 0)))
    for handle in opened:
        await client.close(handle.session_id)
    return statuses


async def _open(client: EnvClient) -> int:
    return (await client.health())["sessions"]


def test_every_failure_answers_the_same_status_over_the_channel_as_over_http(hub_url: str) -> None:
    async def walk(transport: str) -> list[int | None]:
        async with make_env_client(hub_url, 10.0, transport) as client:
            return await _statuses(client)

    over_http = asyncio.run(walk("http"))
    assert over_http == [404, 400, 422, 413, 200, 409, 404, 500, 504, 410, 404, 503]
    assert asyncio.run(walk("channel")) == over_http


def test_malformed_frames_are_answered_422_and_counted_and_the_session_goes_on(hub_url: str) -> None:
    channel, bystander = RawChannel(hub_url), RawChannel(hub_url)
    session_id = channel.call(1, "create", {"env_id": "keydoor-v0", "task_id": "0", "seed": 0})[2]["session_id"]
    before = _health(hub_url)["stats"]["errors"].get("malformed_request", 0)
    nested = b"\x91" * 5000 + b"\xc0"  # arrays 5000 deep
    bad_bodies = [b"\xc1", b"not msgpack at all", msgpack.packb({"op": "step"}), msgpack.packb([1, "step"]),
                  msgpack.packb([-1, "step", {}]), msgpack.packb([True, "step", {}]),
                  msgpack.packb([2, "dance", {}]), msgpack.packb([3, "step", ["a", "list"]]),
                  msgpack.packb([4, "step", {"session_id": session_id}]),
                  msgpack.packb([5, "step", {"session_id": session_id, "action": 7}]),
                  msgpack.packb([6, "step", {"session_id": session_id, "action": "look", "extra": 1}]),
                  msgpack.packb([7, "create", {"env_id": "keydoor-v0", "task_id": "0", "seed": "x"}]),
                  nested, b""]
    answers = []
    for body in bad_bodies:
        channel.send_body(body)
        answers.append(channel.receive())
    assert [answer[1] for answer in answers] == [422] * len(bad_bodies)
    assert all(answer[2]["kind"] == "malformed_request" for answer in answers)
    assert [answer[0] for answer in answers[6:12]] == [2, 3, 4, 5, 6, 7]  # answered under their ids
    assert answers[9][2]["detail"][0]["loc"] == ["body", "action"]  # FastAPI's 422 layout
    stepped = channel.call(8, "step", {"session_id": session_id, "action": "look"})
    assert stepped[1] == 200 and isinstance(stepped[2]["observation"], str)
    assert _health(hub_url)["stats"]["errors"]["malformed_request"] == before + len(bad_bodies)
    bystander.sock.sendall(HEADER.pack(MAX_FRAME_BYTES + 1))  # cannot be framed: this connection ends
    assert bystander.receive()[1] == 422 and bystander.closed_by_server()
    assert channel.call(9, "close", {"session_id": session_id})[1] == 200


def test_a_client_that_disconnects_releases_its_sessions(hub_url: str) -> None:
    before = _health(hub_url)
    channel = RawChannel(hub_url)
    session_ids = [channel.call(n, "create", {"env_id": "keydoor-v0", "task_id": str(n), "seed": 0})[2]["session_id"]
                   for n in range(1, 4)]
    assert _health(hub_url)["sessions"] == before["sessions"] + 3
    channel.sock.close()

    async def step_after() -> EnvClientError:
        async with EnvClient(hub_url) as client:
            for _ in range(100):
                if (await client.health())["sessions"] == before["sessions"]:
                    break
                await asyncio.sleep(0.02)
            with pytest.raises(EnvClientError) as caught:
                await client.step(session_ids[0], "look")
            return caught.value

    gone = asyncio.run(step_after())
    assert gone.status_code == 410 and "channel disconnected" in gone.message
    after = _health(hub_url)
    assert after["sessions"] == before["sessions"]
    released = after["stats"]["channel"]["sessions_released_on_disconnect"]
    assert released == before["stats"]["channel"]["sessions_released_on_disconnect"] + 3


def test_a_request_before_the_hello_is_refused_and_ends_the_connection(hub_url: str) -> None:
    channel = RawChannel(hub_url, hello=False)
    answer = channel.call(1, "create", {"env_id": "keydoor-v0", "task_id": "0", "seed": 0})
    assert answer[1] == 401 and "hello" in answer[2]["detail"]
    assert channel.closed_by_server()


def test_the_channel_needs_the_token_when_the_server_has_one(monkeypatch: pytest.MonkeyPatch) -> None:
    token = "a-shared-token-of-24-chars"
    monkeypatch.setenv(TOKEN_ENV, token)
    with running_hub(EnvhubConfig()) as url:

        async def play() -> StepResult:
            async with ChannelEnvClient(url) as client:  # the token from the environment
                handle = await client.create("keydoor-v0", "0", 0)
                return await client.step(handle.session_id, "look")

        assert isinstance(asyncio.run(play()), StepResult)
        for wrong in (None, "not-the-token-at-all-000"):
            channel = RawChannel(url, hello=False, token=token)
            answer = channel.call(1, "hello", {"protocol": PROTOCOL_VERSION, "token": wrong})
            assert answer[1] == 401 and TOKEN_ENV in answer[2]["detail"] and channel.closed_by_server()
        assert _health(url, token)["stats"]["errors"]["auth_refused"] == 2


def test_pipelined_steps_of_many_sessions_each_answer_their_own_call(hub_url: str) -> None:
    async def body() -> None:
        async with ChannelEnvClient(hub_url) as client:
            handles = await asyncio.gather(*(client.create("keydoor-v0", str(n), n) for n in range(8)))
            direct = [await client.step(handle.session_id, "go attic") for handle in handles]
            await asyncio.gather(*(client.close(handle.session_id) for handle in handles))
            again = await asyncio.gather(*(client.create("keydoor-v0", str(n), n) for n in range(8)))
            pipelined = await asyncio.gather(*(client.step(handle.session_id, "go attic") for handle in again))
            assert len({result.observation for result in direct}) > 1  # each task names its own rooms
            assert [result.observation for result in pipelined] == [result.observation for result in direct]
            await asyncio.gather(*(client.close(handle.session_id) for handle in again))
            # More calls in flight than either side holds before writing (FLUSH_FRAMES): each still
            # gets its own answer, none lost between the early writes and the end-of-pass ones.
            burst = await asyncio.gather(*(client.close(f"no-such-session-{n}") for n in range(5 * FLUSH_FRAMES + 3)),
                                         return_exceptions=True)
            assert [getattr(error, "status_code", None) for error in burst] == [404] * len(burst)
            assert all(f"no-such-session-{n}" in str(error) for n, error in enumerate(burst))

    asyncio.run(body())


def test_a_call_past_the_clients_deadline_fails_as_a_timeout_and_the_connection_goes_on(hub_url: str) -> None:
    async def body() -> None:
        async with ChannelEnvClient(hub_url, timeout_s=0.2) as client:  # the server's own deadline is 0.5 s
            handle = await client.create("channel-test-v0", "0", 0)
            with pytest.raises(EnvClientError, match="timeout") as caught:
                await client.step(handle.session_id, "stall")
            assert caught.value.status_code is None
            other = await client.create("channel-test-v0", "1", 0)
            assert (await client.step(other.session_id, "look")).observation == "Nothing happens."
            await client.close(other.session_id)
            await asyncio.sleep(0.5)  # the server's deadline closes the stalled session
            await client.close(handle.session_id)

    asyncio.run(body())


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
                     st.text(max_size=30), st.binary(max_size=30))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                       max_leaves=12)
_BODIES = st.dictionaries(st.sampled_from(["env_id", "task_id", "seed", "session_id", "action", "protocol", "x"]),
                          st.one_of(_VALUES, st.sampled_from(["keydoor-v0", "0", "3", "look"])), max_size=4)
_REQUESTS = st.one_of(st.tuples(st.integers(0, 2**40), st.sampled_from(["create", "step", "close", "hello"]), _BODIES),
                      st.lists(_VALUES, max_size=4))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(_REQUESTS, min_size=1, max_size=6), raw=st.binary(max_size=40))
def test_no_frame_crashes_the_channel_or_leaks_a_session(hub_url: str, requests: list, raw: bytes) -> None:
    channel = RawChannel(hub_url)
    for request in [*requests, raw]:
        channel.send_body(request if isinstance(request, bytes) else msgpack.packb(list(request)))
        _, status, answer = channel.receive()
        assert status in (200, 201, 400, 401, 404, 409, 410, 413, 422, 503), answer
        if status == 401:  # a hello with a wrong protocol field ends nothing; only a missing hello does
            pytest.fail(f"refused after the hello: {answer}")
    channel.sock.close()
    deadline_s = time.monotonic() + 5
    while _health(hub_url)["sessions"] and time.monotonic() < deadline_s:  # released on disconnect
        time.sleep(0.01)
    assert _health(hub_url)["sessions"] == 0



def test_requests_pipelined_right_behind_the_hello_are_served(hub_url: str) -> None:
    """A client may send its hello and its first create in one write, without waiting."""
    channel = RawChannel(hub_url, hello=False)
    channel.sock.sendall(frame(msgpack.packb([1, "hello", {"protocol": PROTOCOL_VERSION}]))
                         + frame(msgpack.packb([2, "create", {"env_id": "keydoor-v0", "task_id": "1", "seed": 0}])))
    assert [channel.receive()[:2] for _ in range(2)] == [[1, 200], [2, 201]]
    channel.sock.close()
