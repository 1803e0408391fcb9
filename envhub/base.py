"""The environment contract every envhub environment implements.

Gymnasium-shaped but async and text-only: `reset(task_id, seed)` returns the first
observation, `step(action)` returns a `StepResult`. Conventions (checked by
envhub/conformance.py and by `StepResult` itself):

- rewards lie in [0, 1];
- every terminal step (`terminated` or `truncated`) carries an explicit bool `info["success"]`;
- an invalid action gets an explanatory observation, never an exception;
- `truncated` means an env-internal time limit only; the actor enforces the turn cap itself;
- `step` must not block the event loop (use `asyncio.to_thread` for heavy work), otherwise
  the server's per-call deadline cannot interrupt it.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar


class StepContractError(ValueError):
    """A step result breaks the environment contract (an env bug, never a user error)."""


@dataclass(frozen=True)
class StepResult:
    """What one `Environment.step` returns; validated on construction."""

    observation: str
    """Text the agent sees next."""

    reward: float
    """Reward of this step, in [0, 1]."""

    terminated: bool
    """The episode reached a terminal state of the task (success or failure)."""

    truncated: bool
    """The env's own time limit ended the episode (not the actor's turn cap)."""

    info: dict[str, Any] = field(default_factory=dict)
    """JSON-serializable extras; `success` (bool) is required on terminal steps."""

    def __post_init__(self) -> None:
        if not isinstance(self.observation, str):
            raise StepContractError(f"observation must be str, got {type(self.observation).__name__}")
        _check_reward(self.reward)
        object.__setattr__(self, "reward", float(self.reward))
        for name in ("terminated", "truncated"):
            if not isinstance(getattr(self, name), bool):
                raise StepContractError(f"{name} must be bool, got {getattr(self, name)!r}")
        if not isinstance(self.info, dict):
            raise StepContractError(f"info must be dict, got {type(self.info).__name__}")
        ended = self.terminated or self.truncated
        if ended and not isinstance(self.info.get("success"), bool):
            raise StepContractError("a terminal step must carry a bool info['success']")


def _check_reward(reward: object) -> None:
    # bool is an int subclass; a True reward is almost certainly a bug in the env.
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise StepContractError(f"reward must be a number, got {reward!r}")
    if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        raise StepContractError(f"reward must lie in [0, 1], got {reward!r}")


class Environment(abc.ABC):
    """One episode at a time of a text environment; the server makes one instance per session."""

    example_actions: ClassVar[tuple[str, ...]] = ()
    """A few valid actions, used by the conformance checker to exercise non-garbage steps."""

    @abc.abstractmethod
    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        """Start the episode of `task_id` (deterministic given `seed`); return (observation, info)."""

    @abc.abstractmethod
    async def step(self, action: str) -> StepResult:
        """Apply one action given as free text."""

    async def close(self) -> None:
        """Release resources held by this instance; the default holds none."""

    @classmethod
    def task_splits(cls, **options: Any) -> dict[str, range]:
        """Task-id ranges per split, for envs registered with ``splits=None`` (tasks that depend
        on options, such as a recipe folder). Envs with fixed splits never need this."""
        raise NotImplementedError(f"{cls.__name__} was registered without splits and defines no task_splits()")
