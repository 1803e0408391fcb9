"""The environment contract every envhub environment implements.

Gymnasium-shaped but async and text-only: `reset(task_id, seed)` returns the first
observation, `step(action)` returns a `StepResult`. Conventions (checked by
envhub/conformance.py and by `StepResult` itself):

- rewards lie in [0, 1];
- every terminal step (`terminated` or `truncated`) carries an explicit bool `info["success"]`;
- an invalid action gets an explanatory observation, never an exception;
- `truncated` means an env-internal time limit only; the actor enforces the turn cap itself;
- `step` must not block the event loop (use `asyncio.to_thread` for heavy work), otherwise
  the server's per-call deadline cannot interrupt it;
- a step may say whether the reply held an action in the env's format, `info["action_parsed"]`
  (bool), and whether that action could be carried out here, `info["action_valid"]` (bool): the
  actors count them (`rollout/valid_action_frac`) and the learner's optional format reward reads
  the first.

What the agent reads before the first observation (the task instruction, an acknowledgement, worked
example exchanges) is the env's `conversation_start`, not part of the observation: the actor renders
it as turns of its own, as AgentGym's clients do, so a run can switch the examples on or off.
"""

from __future__ import annotations

import abc
import math
import zlib
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


ACKNOWLEDGEMENT = "OK. I'll follow your instructions and try my best to solve the task."
"""The assistant turn that answers the instruction in AgentGym's clients, word for word."""


@dataclass(frozen=True)
class ConversationStart:
    """The turns before an episode's first observation (AgentGym's ``conversation_start``).

    Rendered by the actor as ``user: instruction``, ``assistant: acknowledgement``, then the
    turns of the first ``n`` examples (each a short worked episode of (observation, reply)
    pairs in the env's exact action format, from a task other than the one being played), then
    ``user: first observation``. These tokens are context: never trained on.
    """

    instruction: str = ""
    """The task's rules and reply format; empty: no instruction turn (the observations say it all)."""
    acknowledgement: str = ACKNOWLEDGEMENT
    """The assistant's reply to the instruction."""
    examples: tuple[tuple[tuple[str, str], ...], ...] = ()
    """Worked examples; each a tuple of (observation, reply) turns."""
    default_examples: int = 0
    """Examples shown when the run does not say how many (the env's own judgement of what helps)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "examples", tuple(tuple((str(o), str(r)) for o, r in ex) for ex in self.examples))
        if not all(self.examples) or not 0 <= self.default_examples <= len(self.examples):
            raise ValueError(f"examples must be non-empty exchanges and default_examples in [0, "
                             f"{len(self.examples)}], got {self.default_examples}")

    def turns(self, num_examples: int | None = None, task_id: str | None = None) -> list[tuple[str, str]]:
        """(role, text) turns to render before the first observation; ``None``: the env's default
        number of examples. No instruction turn when the env has none (its observations say it all).

        Asked for fewer examples than the env has, an episode of ``task_id`` sees the ones its task id
        picks (the same for every episode of the task, so a group shares its prompt): shown one fixed
        example, SmolLM2 learned to repeat its answer ("go to red ball 1" in 52 of 60 held-out BabyAI
        episodes), winning only the tasks that example's goal matched."""
        count = self.default_examples if num_examples is None else num_examples
        if not 0 <= count <= len(self.examples):
            raise ValueError(f"this env has {len(self.examples)} worked examples; {count} asked for")
        turns = [("user", self.instruction), ("assistant", self.acknowledgement)] if self.instruction else []
        picks = task_id is not None and count < len(self.examples)
        first = zlib.crc32(task_id.encode()) % len(self.examples) if picks else 0
        for example in (self.examples[first:] + self.examples[:first])[:count]:
            for observation, reply in example:
                turns += [("user", observation), ("assistant", reply)]
        return turns

    def to_json(self) -> dict[str, Any]:
        return {"instruction": self.instruction, "acknowledgement": self.acknowledgement,
                "examples": [[list(turn) for turn in example] for example in self.examples],
                "default_examples": self.default_examples}

    @classmethod
    def from_json(cls, data: Any) -> ConversationStart:
        """Inverse of ``to_json``; ``ValueError`` on anything else."""
        try:
            examples = tuple(tuple((o, r) for o, r in example) for example in data["examples"])
            fields = (data["instruction"], data["acknowledgement"], data["default_examples"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"not a conversation start: {error!r}") from None
        if not (all(isinstance(x, str) for x in fields[:2]) and isinstance(fields[2], int)
                and all(isinstance(t, str) for ex in examples for turn in ex for t in turn)):
            raise ValueError("not a conversation start: instruction, acknowledgement and turns must be text")
        return cls(fields[0], fields[1], examples, fields[2])


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
    def conversation_start(cls, **options: Any) -> ConversationStart:
        """The instruction and worked examples shown before the first observation under ``options``
        (the env's constructor keywords); the default has none."""
        return ConversationStart()

    @classmethod
    def task_splits(cls, **options: Any) -> dict[str, range]:
        """Task-id ranges per split, for envs registered with ``splits=None`` (tasks that depend
        on options, such as a recipe folder). Envs with fixed splits never need this."""
        raise NotImplementedError(f"{cls.__name__} was registered without splits and defines no task_splits()")
