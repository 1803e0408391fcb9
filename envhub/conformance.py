"""Conformance checker: does an environment keep the envhub contract (envhub/base.py)?

`await check_env(client_or_env, env_id)` drives one env, either in-process (an
`Environment` instance) or through a server (an `EnvClient` over HTTP, or a `ChannelEnvClient`
over the session channel: the same checks), and raises `ConformanceError`
naming the first broken rule:
1. reset returns a non-empty str observation and a JSON-serializable dict info;
2. reset is deterministic for a given (task_id, seed);
3. garbage and valid actions return well-typed `StepResult`s with reward in [0, 1];
4. terminal steps carry a bool info["success"], and any info["score"] is a finite number;
5. through a server: a step after the end answers 409, and close releases the session
   (the server's session count returns to its value before the check, so run it while
   no other client opens or closes sessions on that server).
The valid actions default to the env class's `example_actions`; when they form a winning
script (as KeyDoor's do), the terminal path is exercised too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

from envhub import registry
from envhub.base import Environment, StepResult
from envhub.client import EnvClient, EnvClientError

GARBAGE_ACTIONS = ("", "   ", "xyzzy plugh", "émoji 🙂 \u0000 \t control", "a" * 2000)


class ConformanceError(AssertionError):
    """An environment broke the envhub contract."""


@dataclass(frozen=True)
class ConformanceReport:
    """What the check exercised, for logs and tests."""

    env_id: str
    steps_taken: int
    reached_terminal: bool
    success: bool | None


class _LocalDriver:
    def __init__(self, env: Environment) -> None:
        self.env = env

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        return await self.env.reset(task_id, seed)

    async def step(self, action: str) -> StepResult:
        return await self.env.step(action)

    async def close(self) -> None:
        await self.env.close()


class _HttpDriver:
    def __init__(self, client: EnvClient, env_id: str) -> None:
        self.client, self.env_id = client, env_id
        self.session_id: str | None = None

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        await self.close()  # a reset over HTTP is a new session
        handle = await self.client.create(self.env_id, task_id, seed)
        self.session_id = handle.session_id
        return handle.observation, handle.info

    async def step(self, action: str) -> StepResult:
        assert self.session_id is not None
        return await self.client.step(self.session_id, action)

    async def close(self) -> None:
        if self.session_id is not None:
            await self.client.close(self.session_id)
            self.session_id = None


def _require(condition: bool, env_id: str, message: str) -> None:
    if not condition:
        raise ConformanceError(f"{env_id}: {message}")


def _check_reset(env_id: str, observation: Any, info: Any) -> None:
    _require(isinstance(observation, str) and observation.strip() != "", env_id,
             f"reset must return a non-empty str observation, got {observation!r}")
    _require(isinstance(info, dict), env_id, f"reset info must be a dict, got {type(info).__name__}")
    try:
        json.dumps(info, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ConformanceError(f"{env_id}: reset info is not JSON-serializable: {error}") from None


def _check_step(env_id: str, action: str, result: Any) -> None:
    where = f"step({action[:30]!r})"
    _require(isinstance(result, StepResult), env_id, f"{where} must return StepResult, got {type(result).__name__}")
    _require(isinstance(result.observation, str), env_id, f"{where}: observation must be str")
    _require(math.isfinite(result.reward) and 0.0 <= result.reward <= 1.0, env_id,
             f"{where}: reward {result.reward} outside [0, 1]")
    _require(isinstance(result.terminated, bool) and isinstance(result.truncated, bool), env_id,
             f"{where}: terminated/truncated must be bool")
    score = result.info.get("score", 0.0)
    _require(isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score), env_id,
             f"{where}: info['score'], when there, must be a finite number (AgentGym's score), got {score!r}")
    if result.terminated or result.truncated:
        _require(isinstance(result.info.get("success"), bool), env_id,
                 f"{where}: terminal step must carry a bool info['success'], got {result.info!r}")


async def _play(driver: _LocalDriver | _HttpDriver, env_id: str, actions: Sequence[str],
                max_steps: int) -> tuple[int, StepResult | None]:
    """Step through garbage then valid actions until terminal or `max_steps`."""
    script = [*GARBAGE_ACTIONS, *actions]
    last: StepResult | None = None
    for index in range(max_steps):
        action = script[index % len(script)]
        last = await driver.step(action)
        _check_step(env_id, action, last)
        if last.terminated or last.truncated:
            return index + 1, last
    return max_steps, last


async def check_env(
    client_or_env: EnvClient | Environment,
    env_id: str,
    task_id: str | None = None,
    seed: int = 0,
    actions: Sequence[str] | None = None,
    max_steps: int | None = None,
    options: dict[str, Any] | None = None,
) -> ConformanceReport:
    """Check env `env_id` (registered locally); see the module docstring for the rules."""
    env_spec = registry.spec(env_id)
    if task_id is None:
        task_id = str(next(iter(registry.task_splits(env_id, **(options or {})).values()))[0])
    actions = actions if actions is not None else registry.load_env_class(env_id).example_actions
    max_steps = max_steps if max_steps is not None else len(GARBAGE_ACTIONS) + len(actions) + env_spec.max_turns
    is_http = isinstance(client_or_env, EnvClient)
    driver = _HttpDriver(client_or_env, env_id) if is_http else _LocalDriver(client_or_env)
    sessions_before = (await client_or_env.health())["sessions"] if is_http else None
    try:
        first = await driver.reset(task_id, seed)
        _check_reset(env_id, *first)
        again = await driver.reset(task_id, seed)
        _require(again[0] == first[0], env_id, f"reset({task_id!r}, {seed}) is not deterministic")
        steps_taken, last = await _play(driver, env_id, actions, max_steps)
        reached_terminal = last is not None and (last.terminated or last.truncated)
        if is_http and reached_terminal:
            await _expect_conflict_after_end(driver, env_id)
    finally:
        await driver.close()
    if is_http:
        sessions_after = (await client_or_env.health())["sessions"]
        _require(sessions_after == sessions_before, env_id,
                 f"close did not release the session ({sessions_before} open before, {sessions_after} after)")
    success = last.info["success"] if reached_terminal else None
    return ConformanceReport(env_id, steps_taken, reached_terminal, success)


async def _expect_conflict_after_end(driver: _HttpDriver, env_id: str) -> None:
    try:
        await driver.step("look")
    except EnvClientError as error:
        _require(error.status_code == 409, env_id, f"step after the end must answer 409, got {error}")
        return
    raise ConformanceError(f"{env_id}: step after the end must answer 409, but it succeeded")
