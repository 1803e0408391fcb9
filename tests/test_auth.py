"""The shared token: no bind beyond loopback without it; with it, peers without it are refused."""

import asyncio
import time

import httpx
import pytest
import zmq

from common import transport
from common.auth import TOKEN_ENV, AuthError, ChannelGuard
from common.config.envhub import EnvhubConfig
from envhub.client import EnvClient, EnvClientError
from envhub.server import create_app
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

TOKEN = "a-shared-token-of-24-chars"


@pytest.fixture
def token_env(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setattr(transport, "_guard", None)  # a fresh guard for this process' new token
    yield
    if transport._guard is not None:
        transport._guard.stop()


def test_binding_beyond_loopback_needs_the_token(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.setattr(transport, "_guard", None)
    sock = zmq.Context.instance().socket(zmq.PULL)
    try:
        with pytest.raises(AuthError, match=TOKEN_ENV):
            transport.bind_random(sock, "0.0.0.0")  # refused before anything binds
    finally:
        sock.close(linger=0)
    with pytest.raises(AuthError, match=TOKEN_ENV):
        create_app(EnvhubConfig(host="0.0.0.0"))


def test_a_short_token_is_rejected(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "short")
    with pytest.raises(AuthError, match="at least"):
        ChannelGuard.from_env()


def _push(token: str | None, address: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.linger = 0
    ChannelGuard(token).connecting(sock).connect(address)
    return sock


def test_zeromq_peers_without_the_token_are_refused_and_counted(token_env):
    pull = zmq.Context.instance().socket(zmq.PULL)
    address = transport.bind_random(pull, "127.0.0.1")
    pushes = [_push(TOKEN, address), _push("another-token-of-24-chars", address), _push(None, address)]
    for i, push in enumerate(pushes):
        push.send(f"from peer {i}".encode())
    received, deadline_s = [], time.monotonic() + 3
    while time.monotonic() < deadline_s and transport.channel_guard().refused < 2:
        if pull.poll(100):
            received.append(pull.recv())
    while pull.poll(200):
        received.append(pull.recv())
    assert received == [b"from peer 0"]  # only the peer with the token got through
    assert transport.channel_guard().refused >= 2  # the wrong key and the plain peer, both logged
    for sock in [*pushes, pull]:
        sock.close(linger=0)


def test_envhub_refuses_requests_without_the_token_and_counts_them(token_env):
    with running_hub(EnvhubConfig()) as url:
        refused = httpx.get(f"{url}/envs", trust_env=False)
        assert refused.status_code == 401 and TOKEN_ENV in refused.text
        assert httpx.get(f"{url}/envs", headers={"Authorization": "Bearer wrong-token-0123456789"},
                         trust_env=False).status_code == 401

        async def play() -> dict:
            async with EnvClient(url) as client:  # reads the token from the environment
                handle = await client.create("keydoor-v0", "0", 0)
                await client.step(handle.session_id, "look")
                await client.close(handle.session_id)
                return await client.health()

        health = asyncio.run(play())
        assert health["stats"]["errors"]["auth_refused"] == 2

        with httpx.Client(base_url=url, trust_env=False) as browser:  # /ui?token= once, then the cookie
            assert browser.get("/health", params={"token": TOKEN}).status_code == 200
            assert browser.get("/envs").status_code == 200


def test_an_envhub_client_without_the_token_gets_a_clear_error(token_env):
    with running_hub(EnvhubConfig()) as url:

        async def create() -> None:
            async with EnvClient(url, token="not-the-token-at-all-000") as client:
                await client.create("keydoor-v0", "0", 0)

        with pytest.raises(EnvClientError, match="401.*token"):
            asyncio.run(create())
