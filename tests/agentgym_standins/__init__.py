"""Stand-ins for AgentGym's env servers, one per family, as strict as the real ones.

Each stand-in has the real server's routes, request models (so a missing or mistyped field answers
422), reply shapes and failure conventions (HTTP 200 ``{"error": ...}``, an uncaught exception's
500, WebArena's HTTP 200 ``{"observation": "TimeoutError"}``), written from the server's source in
WooooDyy/AgentGym (each module cites its files). Only the game behind them is ours: task k asks for
``secret_of(k)``, and the family's winning action names it. `serving` runs one on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI

from common.net import bind_socket

SECRETS = ("apple", "river", "stone", "cloud", "maple")


def secret_of(task: int) -> str:
    """The word task ``task`` asks for."""
    return SECRETS[task % len(SECRETS)]


@dataclass
class StandinState:
    """What a stand-in holds, for tests to inspect: its server-side envs and what it was sent."""

    envs: dict[int, dict[str, Any]] = field(default_factory=dict)
    next_id: int = 0
    actions: list[str] = field(default_factory=list)
    creates: int = 0
    closes: int = 0

    def new_id(self) -> int:
        self.creates += 1
        env_id, self.next_id = self.next_id, self.next_id + 1
        return env_id


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """Run ``app`` on a free loopback port in a thread; yield its base URL."""
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline_s = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "stand-in server died during startup"
        assert time.monotonic() < deadline_s, "stand-in server did not start within 30 s"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
