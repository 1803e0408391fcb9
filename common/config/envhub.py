"""Configuration of one envhub HTTP server (see envhub/server.py and envhub/main.py)."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from common.config.types import Count, NonNegativeInt, Port, Positive, Str, section


@section
class EnvhubConfig:
    """Settings of one envhub server; every session on it shares them."""

    host: Str = "127.0.0.1"
    """Interface to bind; loopback by default so nothing is exposed by accident."""

    port: Port = 0
    """TCP port to bind; 0 asks the OS for a free port (the bound port is reported back)."""

    step_timeout_s: Positive = 10.0
    """Deadline on every env reset/step/close call; past it the call fails with 504 and the
    session is closed, so one stuck environment never stalls an actor forever."""

    session_idle_timeout_s: Positive = 120.0
    """A session untouched for this long is reaped (closed); later calls on it answer 410."""

    reap_interval_s: Positive = 5.0
    """How often the background reaper looks for idle sessions."""

    max_sessions: Count = 1024
    """Most sessions open at once; creating one more answers 503 instead of exhausting memory."""

    max_action_chars: Count = 8000
    """Longest action (characters) a step may carry; a longer one answers 413 and the session
    stays open, so a runaway generation cannot make an env parse megabytes of text."""

    env_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Constructor options per env id, e.g. ``{textcraft-v0: {recipes_dir: /data/recipes}}``;
    they also decide the task list of envs whose tasks depend on options."""

    runs_dir: Str = "runs"
    """Folder of run folders (``run.output_dir``) that the trajectory viewer at ``/ui`` browses;
    read only, and only the direct sub-folders are served."""

    actors_per_server: Count = 8
    """Launcher: actors sharing one envhub server; a run starts ``ceil(actors / this)`` servers
    and actor k talks to server ``k % servers`` (round-robin). Each server's sessions are about
    this times ``actors.max_concurrent_episodes``; keep ``max_sessions`` above that."""

    cpus_per_server: Positive = 1.0
    """Launcher: CPUs reserved for each server in its placement-group bundle."""

    max_restarts: NonNegativeInt = 3
    """Launcher: times a dead server is restarted on the same node and port before the run fails;
    the episodes it was running end with status ``env_error``."""
