"""Host one role object (learner, actor, envhub) inside a Ray worker process.

The launcher creates one ``RoleHost`` per process. It sends the process's stdout, stderr and
logging to ``<run>/logs/<role>-<i>.log`` before the role is built, so the first thing a failing
role prints lands in its own file, then forwards method calls to the role object.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any


def redirect_output(log_path: str | Path) -> None:
    """Point fds 1 and 2 (so native code too) and Python logging at ``log_path``."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per HTTP call drowns the log


class RoleHost:
    """``RoleHost(log_path, "learner.main:Learner", *args)`` builds the role in this process."""

    def __init__(self, log_path: str, factory: str, *args: Any):
        redirect_output(log_path)
        Path(log_path).with_suffix(".pid").write_text(f"{os.getpid()}\n")  # for operators and kill tests
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # tqdm bars clutter role logs
        module_name, class_name = factory.split(":")
        self.role = getattr(importlib.import_module(module_name), class_name)(*args)

    def call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.role, method)(*args)
        except BaseException:
            # Ray hands the exception to the caller; the role's own log must tell the story too.
            logging.getLogger("role").exception("%s() failed", method)
            raise

    def pid(self) -> int:
        return os.getpid()

    def watch(self) -> None:
        """Never returns: the launcher keeps one call pending per service (envhub), so that the
        service's process dying shows up in ``ray.wait`` like a role's ``run()`` failing."""
        threading.Event().wait()
