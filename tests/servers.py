"""A real envhub server on loopback for the duration of a ``with`` block."""

import contextlib
from collections.abc import Iterator

from envhub.config import EnvhubConfig
from envhub.main import EnvhubServer


@contextlib.contextmanager
def running_hub(cfg: EnvhubConfig) -> Iterator[str]:
    """Start a server in a background thread, yield its base URL, stop it."""
    server = EnvhubServer(cfg)
    server.start_in_thread()
    try:
        yield server.base_url
    finally:
        server.stop()
