"""A broken envhub's answers to session calls: the client names the call and says the answer is
malformed, over HTTP and over the session channel, instead of failing with a bare KeyError.

The server here is a test double of a broken envhub (real aiohttp and asyncio servers on loopback
that answer every session call with the same wrong body), since a real envhub never sends one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import msgpack
import pytest
from aiohttp import web

from envhub.channel_client import make_env_client
from envhub.channel_frames import PROTOCOL_VERSION, FrameReader, frame
from envhub.client import EnvClientError

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

BROKEN_ANSWERS = {
    "a missing field": {"session_id": "s", "observation": "A room."},
    "a reward that is no number": {"session_id": "s", "observation": "A room.", "reward": "high",
                                   "terminated": False, "truncated": False, "info": {}},
    "an observation that is no text": {"session_id": "s", "observation": 7, "reward": 0.0,
                                       "terminated": False, "truncated": False, "info": {}},
}


@asynccontextmanager
async def broken_envhub(answer: dict) -> AsyncIterator[str]:
    """An HTTP API and a session channel that take every session call and answer ``answer``."""
    channel = await asyncio.start_server(lambda r, w: _serve_channel(r, w, answer), "127.0.0.1", 0)
    port = channel.sockets[0].getsockname()[1]

    async def channel_port(request: web.Request) -> web.Response:
        return web.json_response({"port": port})

    async def session_call(request: web.Request) -> web.Response:
        return web.json_response(answer, status=201 if request.path == "/sessions" else 200)

    app = web.Application()
    app.router.add_get("/channel", channel_port)
    app.router.add_post("/sessions", session_call)
    app.router.add_post("/sessions/{session_id}/step", session_call)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        host, http_port = runner.addresses[0][:2]
        yield f"http://{host}:{http_port}"
    finally:
        await runner.cleanup()
        channel.close()
        await channel.wait_closed()


async def _serve_channel(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: dict) -> None:
    frames = FrameReader()
    while data := await reader.read(65536):
        for body in frames.feed(data):
            request_id, op, _ = msgpack.unpackb(body)
            reply = {"protocol": PROTOCOL_VERSION} if op == "hello" else answer
            writer.write(frame(msgpack.packb([request_id, 201 if op == "create" else 200, reply])))
        await writer.drain()
    writer.close()


@pytest.mark.parametrize("transport", ["channel", "http"])
@pytest.mark.parametrize("broken", list(BROKEN_ANSWERS))
def test_a_malformed_answer_is_an_error_naming_the_call(transport: str, broken: str) -> None:
    async def scenario() -> None:
        async with broken_envhub(BROKEN_ANSWERS[broken]) as url, make_env_client(url, 10.0, transport) as env:
            with pytest.raises(EnvClientError, match="step: malformed answer from server"):
                await env.step("s", "look")
            if broken == "a missing field":
                with pytest.raises(EnvClientError, match="malformed answer from server"):
                    await env.create("keydoor-v0", "0", 0)

    asyncio.run(scenario())
