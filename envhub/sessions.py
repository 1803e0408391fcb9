"""Session bookkeeping for the envhub server: one env instance per session, bounded.

Pure bookkeeping, no I/O: the table decides which sessions exist, are idle or are gone;
the server awaits `env.close()` for every session the table hands back as removed.
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from dataclasses import dataclass, field

from envhub.base import Environment


class SessionError(Exception):
    """Base of the session errors; `str(error)` is the message for the client."""


class UnknownSessionError(SessionError):
    """No session with this id was ever seen (or it was forgotten long ago)."""


class SessionGoneError(SessionError):
    """The session existed but was closed; `reason` says why (e.g. 'expired')."""

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {session_id} is gone: {reason}")
        self.reason = reason


class SessionLimitError(SessionError):
    """Creating a session would exceed `max_sessions`."""


class EpisodeOverError(SessionError):
    """A step was sent after the episode terminated or was truncated."""


class SessionIds:
    """Unguessable session ids (128 random bits, hex), drawn from the OS in batches: one system
    call per 256 ids, where uuid4 made one per session (each a release and re-take of the GIL,
    slow while env threads hold it)."""

    def __init__(self, batch: int = 256) -> None:
        self._batch, self._bytes, self._offset = batch, b"", 0

    def next(self) -> str:
        if self._offset >= len(self._bytes):
            self._bytes, self._offset = os.urandom(16 * self._batch), 0
        self._offset += 16
        return self._bytes[self._offset - 16:self._offset].hex()


@dataclass
class Session:
    """One client's episode on its own environment instance."""

    session_id: str
    env_id: str
    task_id: str
    env: Environment
    last_used_s: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Serializes calls on this session; concurrent steps on one env would corrupt it."""
    episode_over: bool = False
    closed_reason: str | None = None
    """Set when the table removes the session; a call holding a stale reference checks it."""

    def check_steppable(self) -> None:
        """Raise if a step may not run now (call with `lock` held)."""
        if self.closed_reason is not None:
            raise SessionGoneError(self.session_id, self.closed_reason)
        if self.episode_over:
            raise EpisodeOverError(f"session {self.session_id}: the episode is over; create a new session")


class SessionTable:
    """Open sessions plus a bounded memory of closed ones, to answer 'gone' distinctly."""

    def __init__(self, max_sessions: int, idle_timeout_s: float, remembered_ids: int = 65536) -> None:
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self._remembered_ids = remembered_ids
        self._open: dict[str, Session] = {}
        self._gone: OrderedDict[str, str] = OrderedDict()
        self._ids = SessionIds()

    def __len__(self) -> int:
        return len(self._open)

    def ensure_room(self) -> None:
        """Raise `SessionLimitError` when no session can be added (check before building an env)."""
        if len(self._open) >= self.max_sessions:
            raise SessionLimitError(f"session limit reached ({self.max_sessions} open); close sessions or retry later")

    def create(self, env_id: str, task_id: str, env: Environment, now_s: float) -> Session:
        """Add a session for `env`; raises `SessionLimitError` when the table is full."""
        self.ensure_room()
        session = Session(self._ids.next(), env_id, task_id, env, last_used_s=now_s)
        self._open[session.session_id] = session
        return session

    def get(self, session_id: str, now_s: float) -> Session:
        """The open session `session_id`, marked as used at `now_s`."""
        session = self._open.get(session_id)
        if session is None:
            reason = self._gone.get(session_id)
            if reason is not None:
                raise SessionGoneError(session_id, reason)
            raise UnknownSessionError(f"unknown session {session_id}")
        session.last_used_s = now_s
        return session

    def gone_reason(self, session_id: str) -> str | None:
        """Why a remembered closed session was closed, or None if it is open or unknown."""
        return self._gone.get(session_id)

    def remove(self, session_id: str, reason: str) -> Session | None:
        """Remove an open session (None if not open); the caller closes its env."""
        session = self._open.pop(session_id, None)
        if session is not None:
            session.closed_reason = reason
            self._gone[session_id] = reason
            while len(self._gone) > self._remembered_ids:
                self._gone.popitem(last=False)
        return session

    def reap_idle(self, now_s: float) -> list[Session]:
        """Remove sessions idle longer than the timeout; busy (locked) sessions are never idle."""
        idle_ids = [
            session.session_id
            for session in self._open.values()
            if now_s - session.last_used_s > self.idle_timeout_s and not session.lock.locked()
        ]
        reason = f"expired after {self.idle_timeout_s:g}s idle"
        return [session for sid in idle_ids if (session := self.remove(sid, reason)) is not None]

    def remove_all(self, reason: str) -> list[Session]:
        """Remove every open session (server shutdown)."""
        return [session for sid in list(self._open) if (session := self.remove(sid, reason)) is not None]
