"""The session API's request and answer bodies, shared by the HTTP routes (envhub/server.py) and the
session channel (envhub/channel.py): one validation for both."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class CreateSessionRequest(BaseModel):
    """client -> envhub: open a session of ``env_id`` on task ``task_id`` (POST /sessions, channel create)."""

    model_config = ConfigDict(extra="forbid")
    env_id: str
    task_id: str
    seed: int = 0


class CreateSessionResponse(BaseModel):
    """envhub -> client: the new session's id, first observation and info."""

    session_id: str
    observation: str
    info: dict[str, Any]


class StepRequest(BaseModel):
    """client -> envhub: one action for the session in the path (POST /sessions/{id}/step)."""

    model_config = ConfigDict(extra="forbid")
    action: str


class StepResponse(BaseModel):
    """envhub -> client: what the step returned (envhub/base.py `StepResult`)."""

    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
