"""Run one envhub server (uvicorn + uvloop) serving every registered environment.

    python -m envhub.main --port 8000            # CLI; --host defaults to 127.0.0.1
    python -m envhub.main --runs-dir runs        # the trajectory viewer at /ui browses these runs

From code: `serve(cfg, on_ready)` blocks and calls `on_ready(port)` once requests are
accepted; `EnvhubServer(cfg).start_in_thread()` returns the bound port and `stop()` ends it
(tests, or a Ray actor process); `await EnvhubServer(cfg).serve()` runs in the current loop.
With `cfg.port == 0` the OS picks a free port: we bind the socket ourselves so the real
port is known before uvicorn starts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from typing import Any, Callable

import uvicorn
import uvloop

from common.config.command_line import load_or_exit, parse_command_line
from common.config.envhub import EnvhubConfig
from common.net import bind_socket
from envhub.envs.agentgym import register_configured_servers
from envhub.server import create_app

ReadyCallback = Callable[[int], None]


class EnvhubServer:
    """One uvicorn server over `create_app(cfg)`, startable in a thread or in a running loop."""

    def __init__(self, cfg: EnvhubConfig, log_level: str = "warning") -> None:
        self.cfg = cfg
        self._socket = bind_socket(cfg.host, cfg.port)
        self.port: int = self._socket.getsockname()[1]
        register_configured_servers(cfg.env_options)  # agentgym-<name>-vN ids: served here
        uvicorn_config = uvicorn.Config(
            # httptools, not "auto": auto falls back to pure-Python h11 without a word, at 3x the CPU.
            self._app(), loop="uvloop", http="httptools", lifespan="on", log_level=log_level, access_log=False,
            # Clients close idle connections first (EnvClient: 30 s); a server closing a
            # keep-alive connection while a client reuses it makes spurious ReadErrors.
            timeout_keep_alive=75,
        )
        self._server = uvicorn.Server(uvicorn_config)
        self._thread: threading.Thread | None = None

    def _app(self) -> Any:
        app = create_app(self.cfg)
        # Sessions opened over the session channel (no HTTP request to learn the address from) browse
        # webnav's sites here too; the browser runs on this host, so a wildcard bind is reached on loopback.
        wildcard = self.cfg.host in ("0.0.0.0", "::")
        app.state.hub_url = f"http://127.0.0.1:{self.port}" if wildcard else self.base_url
        return app

    @property
    def base_url(self) -> str:
        host = f"[{self.cfg.host}]" if ":" in self.cfg.host else self.cfg.host
        return f"http://{host}:{self.port}"

    async def serve(self, on_ready: ReadyCallback | None = None) -> None:
        """Serve in the running event loop until `stop()`; `on_ready(port)` once accepting."""
        watcher = asyncio.create_task(self._report_ready(on_ready))
        try:
            await self._server.serve(sockets=[self._socket])
        finally:
            watcher.cancel()

    def run(self, on_ready: ReadyCallback | None = None) -> None:
        """Serve in a fresh uvloop event loop on this thread (blocks until `stop()`)."""
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(self.serve(on_ready))

    def start_in_thread(self, ready_timeout_s: float = 30.0) -> int:
        """Serve on a daemon thread; returns the bound port once requests are accepted."""
        self._thread = threading.Thread(target=self.run, name=f"envhub-{self.port}", daemon=True)
        self._thread.start()
        deadline_s = time.monotonic() + ready_timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"envhub server on port {self.port} died during startup (see its log)")
            if time.monotonic() > deadline_s:
                self.stop()
                raise TimeoutError(f"envhub server on port {self.port} not ready after {ready_timeout_s}s")
            time.sleep(0.01)
        return self.port

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the server to shut down (closing every session); joins its thread if it has one."""
        self._server.should_exit = True  # uvicorn's main loop polls this flag
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise TimeoutError(f"envhub server on port {self.port} did not stop within {timeout_s}s")

    async def _report_ready(self, on_ready: ReadyCallback | None) -> None:
        while not self._server.started:
            await asyncio.sleep(0.01)
        if on_ready is not None:
            on_ready(self.port)


def serve(cfg: EnvhubConfig, on_ready: ReadyCallback | None = None, log_level: str = "info") -> None:
    """Run an envhub server on this thread until interrupted; `on_ready(port)` once accepting."""
    EnvhubServer(cfg, log_level=log_level).run(on_ready)


def parse_config(argv: list[str] | None = None) -> EnvhubConfig:
    """The run config's ``envhub`` section: ``--config FILE`` plus overrides in the project's one
    grammar; a bare ``--port 8000`` (or ``--step-timeout-s 5``) means ``--envhub.port 8000``."""
    parser = argparse.ArgumentParser(description="Run an envhub environment server.",
                                     epilog="Overrides: --envhub.<key> value, or --<key> value for short.")
    parser.add_argument("--config", help="a run config YAML; its envhub section is used")
    args, overrides = parse_command_line(parser, sys.argv[1:] if argv is None else argv, short_section="envhub")
    return load_or_exit(parser, args.config, overrides).envhub


def main(argv: list[str] | None = None) -> None:
    cfg = parse_config(argv)
    try:
        serve(cfg, on_ready=lambda port: print(f"envhub listening on http://{cfg.host}:{port}", flush=True))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
