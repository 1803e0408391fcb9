"""A real envhub server on loopback, and test envs registered, for the duration of a ``with`` block."""

import contextlib
from collections.abc import Iterator
from typing import Any

from common.config.envhub import EnvhubConfig
from envhub import registry
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


@contextlib.contextmanager
def registered_envs(*specs: dict[str, Any]) -> Iterator[None]:
    """Register each spec (``registry.register``'s keywords) for the block, then forget it, so a test
    module's envs never leak into another module's registry."""
    ids = []
    try:
        for env_spec in specs:
            ids.append(registry.register(**env_spec).id)
        yield
    finally:
        for env_id in ids:
            registry.unregister(env_id)
