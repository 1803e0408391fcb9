"""What a dialect decides about a ScienceWorld episode, and the pieces both dialects share.

The env (env.py) owns the simulator JVM; an ``EpisodeRules`` object, one per episode, owns
everything a dialect changes: how the first observation is composed, what a reply asks for (a
simulator command, a hint, or an answer without the simulator), and how the simulator's state
after a command becomes a ``StepResult`` (observation, reward, end, info).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from envhub.base import StepResult

MAX_SCORE = 100
NO_KNOWN_ACTION = "No known action matches that input."
"""ScienceWorld's answer to a command its parser does not take."""


@dataclass(frozen=True)
class Simulate:
    """Send ``command`` to the simulator as it is."""

    command: str
    action_parsed: bool
    """Whether the reply held an action in the dialect's format."""


@dataclass(frozen=True)
class ListValidActions:
    """Answer with some actions valid here (lenient's hint command), without advancing the game."""


@dataclass(frozen=True)
class SimulatorState:
    """What the simulator reports after one command."""

    observation: str
    score: int
    """ScienceWorld's score, ``round(100 * getScore())``: 0..100, negative once the task failed."""
    completed: bool
    """``getCompleted()``: the task reached its end (ScienceWorld sets it on success)."""
    moves: int
    """``getNumMoves()``: game moves so far (``wait`` counts ten; refused commands none)."""


class EpisodeRules(Protocol):
    """One dialect's rules for one episode (stateful: it tracks the score paid so far)."""

    opening_look_is_a_move: bool
    """Whether the first observation's room comes from a ``look around`` command (a game move) or
    from ScienceWorld's free ``look()``."""

    def first_observation(self, task_description: str, room: str) -> tuple[str, dict[str, Any]]:
        """The first observation and the reset's info."""

    def interpret(self, reply: str) -> Simulate | ListValidActions | StepResult:
        """What the model's reply asks for; a ``StepResult`` answers it without the simulator."""

    def after_command(self, state: SimulatorState, action_parsed: bool) -> StepResult:
        """The step result once the simulator ran the command."""

    def after_hint(self, valid_actions: list[str]) -> StepResult:
        """The step result of a hint request (only for rules that return ``ListValidActions``)."""


class BestScoreRewards:
    """Training rewards in [0, 1]: each step pays the rise of the best clipped score so far,
    ``max(0, min(score, 100)) / 100``, so the rewards sum to the best clipped score reached. That
    is the final score's whenever the score never falls; ScienceWorld's falls only when a task
    fails (to -100) or on ``reset task``, and a reward once paid cannot be taken back."""

    def __init__(self) -> None:
        self.best_score = 0

    def reward_for(self, score: int) -> float:
        reached = min(max(score, 0), MAX_SCORE)
        reward = max(0, reached - self.best_score) / MAX_SCORE
        self.best_score = max(self.best_score, reached)
        return reward

    @property
    def paid(self) -> float:
        """The rewards paid so far (their sum), in [0, 1]."""
        return self.best_score / MAX_SCORE
