"""KeyDoor: a tiny multi-turn text game a ~1M-parameter policy can learn.

The agent starts in a hall with a locked door and three rooms. The first observation says
which room a key jingles in. Optimal play takes 4 turns:
`go <key room>`, `take key`, `go hall`, `open door` -> reward 1, success.
Task id and seed decide (deterministically) which 3 of the 6 rooms exist and which holds the key
(both counts are options, as is a progress reward for the key: ``KeyDoorOptions``).
Observations stay short (< 200 characters) because a tiny model reads them. A reply is either
the bare command or ends with ``Action: <command>`` (AgentGym's format, for instruction-tuned models).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from dataclasses import dataclass
from typing import Any

from envhub.actions import MalformedAction, extract_action
from envhub.base import ConversationStart, Environment, StepResult
from envhub.options import parse_options

ROOM_POOL = ("kitchen", "garden", "attic", "cellar", "library", "study")
ROOMS_PER_TASK = 3
ACTIONS_HELP = "Actions: go <room>, take key, go hall, open door."

_GO_PATTERN = re.compile(r"^go (?:to )?(?:the )?([a-z]+)$")

# A won episode in the env's own words, each reply in AgentGym's "Action: <command>" form.
_WORKED_EXAMPLE = (
    (f"You are in a hall with a locked door. {ACTIONS_HELP} Rooms: garden, attic, study. "
     "A key jingles in the attic.", "Action: go attic"),
    ("You are in the attic. A key lies here. Try: take key.", "Action: take key"),
    ("You take the key. Now go hall and open door.", "Action: go hall"),
    ("You are in the hall. The door is here. Rooms: garden, attic, study. You hold the key.", "Action: open door"),
)


def normalize_action(action: str) -> str:
    """Lower-case, single-spaced, without trailing punctuation: tolerant of small format slips."""
    return " ".join(action.lower().split()).rstrip(".!")


@dataclass(frozen=True)
class KeyDoorOptions:
    """Difficulty and simulated step latency (``envhub.env_options: {keydoor-v0: {...}}``).

    Real agent environments take 10 ms to seconds per step (a browser, a search API, a
    compiler) and a few tasks are far slower than the rest; this toy env can mimic that, so
    the cost of waiting for the slowest episode (synchronous RL) can be measured. Latency is off
    by default.
    """

    room_pool: tuple[str, ...] = ROOM_POOL
    """Rooms the tasks draw from (one lower-case word each, not "hall")."""
    rooms_per_task: int = ROOMS_PER_TASK
    """Rooms of each task (2 to the pool's size), one of them holding the key."""
    subgoal_reward: float = 0.0
    """Progress reward for each subgoal, paid once: taking the key, and bringing it to the hall;
    opening the door pays the rest (``1 - 2 * subgoal_reward``), so a won episode returns 1.
    Like ScienceWorld's partial score, it lets a policy that plays at random (1 win in 200 at 6
    turns with 3 rooms) learn from the episodes that got part of the way."""

    step_latency_s: float = 0.0
    """Seconds every reset and step waits before answering."""
    slow_task_fraction: float = 0.0
    """Fraction of the tasks (chosen by a hash of the task id) that are slow."""
    slow_step_latency_s: float = 0.0
    """Seconds every reset and step of a slow task waits instead of ``step_latency_s``."""

    def __post_init__(self) -> None:
        if min(self.step_latency_s, self.slow_step_latency_s) < 0 or not 0 <= self.slow_task_fraction <= 1:
            raise ValueError("keydoor-v0: latencies must be >= 0 and slow_task_fraction in [0, 1]")
        object.__setattr__(self, "room_pool", tuple(self.room_pool))  # a YAML list
        if len(set(self.room_pool)) != len(self.room_pool) or not all(
                re.fullmatch(r"[a-z]+", room) and room != "hall" for room in self.room_pool):
            raise ValueError(f"keydoor-v0: room_pool must hold distinct lower-case words other than hall; "
                             f"got {self.room_pool!r}")
        if not 2 <= self.rooms_per_task <= len(self.room_pool) or not 0 <= self.subgoal_reward < 0.5:
            raise ValueError(f"keydoor-v0: rooms_per_task must be in [2, {len(self.room_pool)}] (the room pool) "
                             "and subgoal_reward in [0, 0.5)")

    def latency_s(self, task_id: str) -> float:
        draw = int(hashlib.sha256(f"slow:{task_id}".encode()).hexdigest()[:8], 16) / 16**8
        return self.slow_step_latency_s if draw < self.slow_task_fraction else self.step_latency_s


class KeyDoorEnv(Environment):
    """Find the key named by the hint, bring it to the hall, open the door."""

    # Visits every room of the pool, so this script wins every task (used by conformance).
    example_actions = (
        *(action for room in ROOM_POOL for action in (f"go {room}", "take key")),
        "go hall",
        "open door",
    )

    @classmethod
    def conversation_start(cls, **options: Any) -> ConversationStart:
        """No instruction turn (the first observation names the actions); one worked example, off by
        default: the tiny model reads bare observations, an instruction-tuned model needs the
        example to reply ``Action: <command>`` at all (SmolLM2: 0 of 24 first replies without it)."""
        parse_options(KeyDoorOptions, options, "keydoor-v0")
        return ConversationStart(examples=(_WORKED_EXAMPLE,), default_examples=0)

    def __init__(self, **options: Any) -> None:
        self.options = parse_options(KeyDoorOptions, options, "keydoor-v0")
        self._latency_s = 0.0
        self._rooms: tuple[str, ...] = ()
        self._key_room = ""
        self._location = "hall"
        self._has_key = False
        self._brought_key = False
        self._done = True
        self._parsed = True

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        self._latency_s = self.options.latency_s(task_id)
        await self._wait()
        rng = random.Random(f"keydoor:{int(task_id)}:{int(seed)}")
        self._rooms = tuple(rng.sample(self.options.room_pool, self.options.rooms_per_task))
        self._key_room = rng.choice(self._rooms)
        self._location, self._has_key, self._brought_key, self._done = "hall", False, False, False
        # What to act on comes last, next to the reply: a tiny model attends to it most easily.
        observation = (
            f"You are in a hall with a locked door. {ACTIONS_HELP} Rooms: {', '.join(self._rooms)}. "
            f"A key jingles in the {self._key_room}."
        )
        return observation, self._info(success=False)

    async def step(self, action: str) -> StepResult:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        await self._wait()
        reply = extract_action(action, require_marker=False)  # "Action: go attic" or a bare "go attic"
        command = "" if isinstance(reply, MalformedAction) else normalize_action(reply)
        self._parsed = command in ("open door", "take key") or bool(_GO_PATTERN.match(command))
        if command == "open door":
            return self._open_door()
        if command == "take key":
            had_key = self._has_key
            observation = self._take_key()
            return self._continue(observation, self._subgoal_reward(self._has_key and not had_key))
        go_match = _GO_PATTERN.match(command)
        if go_match:
            observation = self._go(go_match.group(1))
            brought_key = self._has_key and self._location == "hall" and not self._brought_key
            self._brought_key = self._brought_key or brought_key
            return self._continue(observation, self._subgoal_reward(brought_key))
        return self._continue(f"Unknown action. {ACTIONS_HELP}")

    def valid_actions(self) -> list[str]:
        """The admissible commands here, good or bad moves alike, as ALFWorld and TextWorld list
        them: ``go <room>`` anywhere, ``go hall`` out of the hall, ``take key`` where it lies,
        ``open door`` in the hall (locked or not). For warm starts: a model trained on random
        admissible actions must read where it is, yet prefers no move over another."""
        actions = [f"go {room}" for room in self._rooms]
        if self._location == "hall":
            return [*actions, "open door"]
        key_here = self._location == self._key_room and not self._has_key
        return [*actions, "go hall", *(["take key"] if key_here else [])]

    def _go(self, place: str) -> str:
        if place == "hall":
            self._location = "hall"
            return f"You are in the hall. The door is here. Rooms: {', '.join(self._rooms)}. {self._key_status()}"
        if place not in self._rooms:
            return f"There is no {place[:20]} here. Rooms: {', '.join(self._rooms)}."
        self._location = place
        if place == self._key_room and not self._has_key:
            return f"You are in the {place}. A key lies here. Try: take key."
        return f"You are in the {place}. Nothing here. {self._key_status()}"

    def _key_status(self) -> str:
        """Where the key is, said last, as a text game's description would: the right move (open
        the door, fetch the key from that room) then shows in the latest observation, where a
        tiny model attends most easily, and the game needs no memory of the first one."""
        return "You hold the key." if self._has_key else f"A key jingles in the {self._key_room}."

    def _take_key(self) -> str:
        if self._has_key:
            return "You already hold the key."
        if self._location != self._key_room:
            return "There is no key here."
        self._has_key = True
        return "You take the key. Now go hall and open door."

    def _open_door(self) -> StepResult:
        if self._location != "hall":
            return self._continue("The door is in the hall. Try: go hall.")
        if not self._has_key:
            return self._continue("The door is locked.")
        self._done = True
        return StepResult("The door opens. You escaped!", 1.0 - 2 * self.options.subgoal_reward, True, False,
                          self._info(success=True))

    def _subgoal_reward(self, reached: bool) -> float:
        return self.options.subgoal_reward if reached else 0.0

    def _continue(self, observation: str, reward: float = 0.0) -> StepResult:
        return StepResult(observation, reward, False, False, self._info(success=False))

    async def _wait(self) -> None:
        if self._latency_s > 0:
            await asyncio.sleep(self._latency_s)

    def _info(self, success: bool) -> dict[str, Any]:
        return {"success": success, "room": self._location, "has_key": self._has_key, "action_parsed": self._parsed}
