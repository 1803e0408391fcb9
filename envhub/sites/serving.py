"""Where the sites are served: mounted in an envhub server, or on a loopback port of their own.

Inside envhub, `mount_sites(app)` mounts the sites at ``/sites`` and records, for every request,
the hub's own address in a context variable: an env reset by that request (the hub runs envs
in its request handlers) then points its browser at the hub's ``/sites``. Outside a hub (an env
used in-process), `standalone_sites_url()` starts one uvicorn server for the process on a free
loopback port. Both serve the same process-wide session store.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import time
from typing import Any, Awaitable, Callable

import uvicorn
from fastapi import FastAPI

from common.net import bind_socket
from envhub.sites.app import create_sites_app

SITES_MOUNT = "/sites"
hub_sites_url: contextvars.ContextVar[str | None] = contextvars.ContextVar("hub_sites_url", default=None)


class _RecordHubAddress:
    """ASGI middleware: sets `hub_sites_url` to this server's ``/sites`` for the request's duration."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        server = scope.get("server") if scope["type"] == "http" else None
        if not server or server[1] is None:
            await self.app(scope, receive, send)
            return
        host = f"[{server[0]}]" if ":" in server[0] else server[0]
        token = hub_sites_url.set(f"http://{host}:{server[1]}{scope.get('root_path', '')}{SITES_MOUNT}")
        try:
            await self.app(scope, receive, send)
        finally:
            hub_sites_url.reset(token)


def mount_sites(app: FastAPI) -> None:
    """Serve the offline sites from `app` (an envhub server) at ``/sites``."""
    app.mount(SITES_MOUNT, create_sites_app())
    app.add_middleware(_RecordHubAddress)


_standalone_lock = threading.Lock()


def standalone_sites_url(ready_timeout_s: float = 30.0) -> str:
    """Base URL of this process's own sites server (started on first call, a daemon thread)."""
    with _standalone_lock:  # two envs resetting at once must not start two servers
        return _start_standalone(ready_timeout_s)


@functools.cache
def _start_standalone(ready_timeout_s: float) -> str:
    sock = bind_socket("127.0.0.1", 0)
    config = uvicorn.Config(create_sites_app(), log_level="warning", access_log=False, lifespan="off",
                            timeout_keep_alive=75)
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="webnav-sites", daemon=True).start()
    deadline_s = time.monotonic() + ready_timeout_s
    while not server.started:
        if time.monotonic() > deadline_s:
            raise TimeoutError(f"the webnav sites server did not start within {ready_timeout_s}s")
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}"
