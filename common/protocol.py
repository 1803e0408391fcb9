"""The wire protocol between learner head and actors: one typed class per message.

Every message travels as msgpack: ``{"type": <name>, "schema": SCHEMA_VERSION, "body": {...}}``.
Arrays travel as ``{"dtype": "<i4", "shape": [n], "data": <raw little-endian bytes>}``, never as
Python lists: a 30k-token trajectory as a list of ints is ~5x larger and ~50x slower to decode.
No pickle anywhere. ``decode`` validates every field against the declared type annotation (msgspec
structs made from these classes, ``common/wire_decoder.py``) and what it means
(``common/wire_checks.py``), and raises
``ProtocolError`` (one error type) for anything malformed, so receivers can reject and count bad
messages instead of crashing.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from common import wire_checks, wire_decoder, wire_payloads

SCHEMA_VERSION = 2
"""2: a ``Trajectory``'s outcome fields are required, ``finish_reason`` is a closed set, status
``actor_error``."""

EpisodeStatus = Literal["ok", "env_error", "engine_error", "timeout", "actor_error"]
"""``actor_error``: the actor itself failed the episode (a bug or a prompt it cannot serve); the
error text says why. Only ``ok`` episodes are trained on."""
FinishReason = Literal["terminated", "env_truncated", "turn_cap", "token_budget", "deadline",
                       "env_error", "engine_error", "timeout", "actor_error"]
"""Why the episode ended: the env ended it (``terminated``, ``env_truncated``), the lease's limits
cut it (``turn_cap``, ``token_budget``, ``deadline``: past the lease's deadline), or it failed
(the status, repeated)."""
ControlCommand = Literal["stop", "regroup"]
LeasePurpose = Literal["train", "eval"]


class ProtocolError(ValueError):
    """A wire message that cannot be decoded into its declared type, or means nothing valid.
    ``reason`` is a short name receivers count rejections by (``not_msgpack``, ``bad_field``,
    ``inconsistent_arrays``, ...)."""

    def __init__(self, message: str, reason: str = "bad_field"):
        super().__init__(message)
        self.reason = reason


def array_field(dtype: str, optional: bool = False) -> Any:
    """Declare an ndarray field with its required little-endian dtype (e.g. ``"<i4"``);
    ``optional``: empty when absent (a field added later, missing from older recordings)."""
    if optional:
        return field(default_factory=lambda: np.zeros(0, np.dtype(dtype)), metadata={"dtype": np.dtype(dtype)})
    return field(metadata={"dtype": np.dtype(dtype)})


@dataclass(frozen=True)
class LeaseRequest:
    """actor -> head: ask for up to ``max_leases`` new task leases (answered when admissible)."""

    actor_id: int
    max_leases: int


@dataclass(frozen=True)
class TaskLease:
    """head -> actor: run ``group_size`` episodes of one task and return them before the deadline."""

    lease_id: str
    group_id: str
    env_id: str
    task_id: str
    seed: int
    group_size: int
    turn_cap: int
    max_episode_tokens: int
    policy_version: int
    deadline_unix_s: float
    purpose: LeasePurpose = "train"
    """``eval``: a held-out task of a validation round (``learner/evaluation.py``), never trained on."""


@dataclass(frozen=True)
class Trajectory:
    """actor -> head: one finished episode, token-aligned, with why and how it ended.

    ``token_ids``, ``loss_mask``, ``behavior_logprobs`` and ``token_versions`` are aligned one
    to one. ``turn_spans`` holds the ``[start, end)`` of every assistant segment.
    """

    lease_id: str
    group_id: str
    env_id: str
    task_id: str
    actor_id: int
    episode_index: int
    group_size: int
    token_ids: np.ndarray = array_field("<i4")
    loss_mask: np.ndarray = array_field("u1")
    behavior_logprobs: np.ndarray = array_field("<f4")
    token_versions: np.ndarray = array_field("<i4")
    turn_spans: np.ndarray = array_field("<i4")
    reward: float
    success: bool
    terminated: bool
    truncated: bool
    finish_reason: FinishReason
    status: EpisodeStatus
    turn_rewards: np.ndarray = array_field("<f4", optional=True)
    """The env's reward for each turn (``num_turns`` of them, unclipped; ``reward`` is their sum
    clipped to [0, 1])."""
    turn_observations: np.ndarray = array_field("<u8", optional=True)
    """A 64-bit fingerprint of the observation each turn answered (``observation_fingerprint``):
    turns of one group that saw the same observation share an anchor state (GiGPO)."""
    turn_action_parsed: np.ndarray = array_field("u1", optional=True)
    """1 where the turn's reply held an action in the env's format (the env's ``action_parsed``),
    else 0: ``rollout/valid_action_frac`` and the learner's optional format reward read it."""
    turn_action_accepted: np.ndarray = array_field("u1", optional=True)
    """1 where the env carried the turn's action out (its ``action_valid``; where it does not say,
    whether the action parsed), else 0: a well-formed reply naming an action the turn does not offer
    is parsed but not accepted. ``rollout/accepted_action_frac`` reads it."""
    score: float | None = None
    """AgentGym's score of the episode: the env's ``info["score"]`` after the last step (AgentGym-RL
    scores an episode by its last step's reward; its evaluation reports the mean and the best over
    a task's samples). It may lie outside [0, 1] (SciWorld's is -100 on failure). ``None``: the env
    reports no score (``reward`` stands for it), or the episode did not end ``ok``."""
    error: str = ""
    num_turns: int = 0
    turn_cap: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    env_info: dict[str, Any] = field(default_factory=dict)
    purpose: LeasePurpose = "train"
    """The lease's purpose, carried over: ``eval`` episodes are logged, never trained on."""


@dataclass(frozen=True)
class TensorSlot:
    """Where one parameter lives inside the bucketed weight broadcast."""

    name: str
    shape: list[int]
    dtype: str
    bucket: int
    offset_bytes: int
    nbytes: int


@dataclass(frozen=True)
class WeightsAnnounce:
    """head -> actors (PUB): version ``version`` follows as ``bucket_nbytes`` broadcasts on the
    weight group of generation ``generation`` (actors not in that group ignore it)."""

    version: int
    bucket_nbytes: list[int]
    slots: list[TensorSlot]
    generation: int = 0


@dataclass(frozen=True)
class Control:
    """head -> actors (PUB): run-level commands. ``stop`` ends the run; ``regroup`` forms weight-group
    generation ``generation`` from ``members`` (actor ids; actor ``members[i]`` is rank i + 1)."""

    command: ControlCommand
    generation: int | None = None
    members: list[int] | None = None


@dataclass(frozen=True)
class GroupJoin:
    """actor -> head: this actor is alive and wants to be in the next weight group (at start,
    after a failed broadcast, after a restart); ``weight_version`` is what it serves now.
    ``generation_seen`` is the newest weight-group generation it had heard announced (0: none),
    so the head can tell a request the actor sent just before joining the current generation
    (stale: it is in already) from one of a member that dropped out of it."""

    actor_id: int
    weight_version: int
    generation_seen: int


@dataclass(frozen=True)
class ActorStats:
    """actor -> head: periodic health and throughput of one actor."""

    actor_id: int
    weight_version: int
    episodes_running: int
    episodes_finished: int
    engine_queue_depth: int
    tokens_per_s: float
    episode_latency_s_mean: float
    errors: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainedSample:
    """learner head -> run record ``trajectories/trained.msgpack`` (read by the envhub trajectory
    viewer): one episode the learner trained on, named by ``lease_id`` and ``episode_index`` as in
    its ``Trajectory``. ``learner_step`` is the step of the update (the tensorboard step);
    ``advantage`` is the mean over the episode's action tokens (loss mask 1) and
    ``token_advantages`` holds one value per action token, in order."""

    lease_id: str
    group_id: str
    episode_index: int
    learner_step: int
    advantage: float
    token_advantages: np.ndarray = array_field("<f4")


MESSAGE_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (LeaseRequest, TaskLease, Trajectory, WeightsAnnounce, Control, GroupJoin, ActorStats, TrainedSample)
}


# ---------------------------------------------------------------------------------- encoding


def _to_wire(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        le = value.astype(value.dtype.newbyteorder("<"), copy=False)
        return {"dtype": le.dtype.str, "shape": list(le.shape), "data": np.ascontiguousarray(le).tobytes()}
    if dataclasses.is_dataclass(value):
        return {f.name: _to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    if isinstance(value, np.generic):
        return value.item()
    return value


def encode(message: Any) -> bytes:
    """Serialize one protocol message to msgpack bytes."""
    name = type(message).__name__
    if MESSAGE_TYPES.get(name) is not type(message):
        raise ProtocolError(f"not a protocol message: {type(message)!r}")
    return wire_payloads.pack(name, SCHEMA_VERSION, _to_wire(message), _array_fields(name))


# ---------------------------------------------------------------------------------- decoding


def decode(data: bytes | memoryview, expected: type | tuple[type, ...] | None = None) -> Any:
    """Parse and validate msgpack bytes into a protocol message; ``ProtocolError`` if malformed.
    The message may keep ``data``: its arrays are read-only views of it, not copies (so pass
    ``bytes``, or a buffer nothing writes to afterwards, as a received ZeroMQ frame)."""
    message = _decode_unchecked(data, expected)
    _check(message)
    return message


BATCH_SCREEN_MAX_TOKENS = 4096
"""``decode_many`` screens the arrays of episodes up to this long together: for longer ones the
numpy calls' fixed cost is small, and joining their arrays would be one more pass over them."""


def decode_many(frames: Sequence[bytes | memoryview], expected: type | tuple[type, ...] | None = None) -> list[Any]:
    """``decode`` of each frame, in order: the message, or the ``ProtocolError`` it raised. The
    array rules of the short episodes among them are screened in one pass over all of them
    (``wire_checks.batch_plainly_valid``); each is checked on its own when the screen fails."""
    decoded = []
    for frame in frames:
        try:
            decoded.append(_decode_unchecked(frame, expected))
        except ProtocolError as exc:
            decoded.append(exc)
    short = list(map(screened_together, decoded))
    batch = list(itertools.compress(decoded, short))
    screened = len(batch) > 1 and wire_checks.batch_plainly_valid(batch)
    results = []
    for message, in_batch in zip(decoded, short):
        if not isinstance(message, ProtocolError):
            try:
                _check(message, arrays_screened=screened and in_batch)
            except ProtocolError as exc:
                message = exc
        results.append(message)
    return results


def screened_together(message: Any) -> bool:
    """Whether ``decode_many`` screens ``message`` together with the others: a short episode."""
    return type(message) is Trajectory and len(message.token_ids) <= BATCH_SCREEN_MAX_TOKENS


def _decode_unchecked(data: bytes | memoryview, expected: type | tuple[type, ...] | None) -> Any:
    """The message in ``data``, well typed but not yet checked for meaning; a message of a type not
    ``expected`` here is refused before anything in its body is read."""
    try:
        return _decoder().decode(data, expected)
    except wire_decoder.DecodeError as exc:
        raise ProtocolError(str(exc), exc.reason) from None


def _check(message: Any, arrays_screened: bool = False) -> None:
    """Raise ``ProtocolError`` unless ``message`` means something valid (``common/wire_checks.py``)."""
    name = type(message).__name__
    try:
        if arrays_screened:
            wire_checks.CHECKS[name](message, arrays_screened=True)
        else:
            wire_checks.CHECKS[name](message)
    except wire_checks.MeaningError as exc:
        raise ProtocolError(f"{name}: {exc}", exc.reason) from None


@functools.cache
def _decoder() -> wire_decoder.Decoder:
    return wire_decoder.Decoder(MESSAGE_TYPES.values(), SCHEMA_VERSION)


@functools.cache
def _array_fields(type_name: str) -> frozenset[str]:
    cls = MESSAGE_TYPES.get(type_name)
    return frozenset() if cls is None else frozenset(f.name for f in dataclasses.fields(cls) if _array_dtype(f))


def _array_dtype(f: dataclasses.Field) -> np.dtype | None:
    return f.metadata.get("dtype")
