"""What a decoded wire message must mean, beyond its field types.

``protocol.decode`` runs the check of each message type after building it, so a receiver never
holds a message whose arrays disagree, whose spans point outside its tokens or whose numbers are
out of range: those are the messages that decode cleanly and then crash the code that trusts
them. Each failure raises ``ProtocolError`` with a short ``reason`` that receivers count by.

What needs the receiver's context (the model's vocabulary, the learner's version, the lease an
episode answers) is checked where that context lives: ``learner/head.py``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

MAX_ID = 2**31 - 1
"""Ids, versions and counts travel as msgpack ints (up to 64 bits); ours fit int32 everywhere."""
MAX_DIMENSION_LENGTH = 2**31 - 1
"""The longest any dimension of a wire array may be: numpy refuses even an empty array of shape
``[0, 2**62]`` (its size overflows), and no frame holds 2**31 elements."""
MAX_TEXT = 1 << 16
"""Longest id or error string a message may carry (an error text is cut to 500 by actors)."""
WEIGHT_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4,
                      "int16": 2, "int8": 1, "uint8": 1, "bool": 1}
"""The parameter dtypes a weight broadcast may carry (``common/weight_sync.py``), with their sizes."""
OK_FINISH_REASONS = {"terminated", "env_truncated", "turn_cap", "token_budget"}


class MeaningError(ValueError):
    """A message whose fields are well typed but mean nothing valid; ``reason`` names the rule."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def require(condition: bool, reason: str, message: str) -> None:
    if not condition:
        raise MeaningError(reason, message)


# The checks every episode takes write their message only once they fail: formatting it for each
# require() cost more than the check (~0.3 us a field, on every episode the head takes).


def count_in_range(value: int, name: str, low: int = 0, high: int = MAX_ID) -> None:
    if not low <= value <= high:
        raise MeaningError("out_of_range", f"{name} {value} is outside [{low}, {high}]")


def text(value: str, name: str, allow_empty: bool = False) -> None:
    if not (allow_empty or value):
        raise MeaningError("empty_text", f"{name} is empty")
    if len(value) > MAX_TEXT:
        raise MeaningError("out_of_range", f"{name} is {len(value)} characters long")


# ---------------------------------------------------------------------------------- trajectory


def check_trajectory(t: Any, arrays_screened: bool = False) -> None:
    """``arrays_screened``: ``t`` was in a batch that passed ``batch_plainly_valid``, so its array
    rules hold."""
    for name in ("lease_id", "group_id", "env_id", "task_id"):
        text(getattr(t, name), name)
    text(t.error, "error", allow_empty=True)
    count_in_range(t.actor_id, "actor_id")
    count_in_range(t.group_size, "group_size", low=1)
    count_in_range(t.episode_index, "episode_index", high=t.group_size - 1)
    count_in_range(t.turn_cap, "turn_cap", low=1)
    count_in_range(t.num_turns, "num_turns", high=t.turn_cap)
    # The array rules one by one take ~20 numpy calls; a valid episode passes them all in 11.
    if not (arrays_screened or _arrays_plainly_valid(t)):
        _check_token_arrays(t)
        _check_turn_spans(t)
        _check_turn_arrays(t)
    _check_outcome(t)
    if not all(v >= 0 for v in t.timings.values()):
        raise MeaningError("out_of_range", "timings must be non-negative seconds")


def _arrays_plainly_valid(t: Any) -> bool:
    """True only when every rule of ``_check_token_arrays``, ``_check_turn_spans`` and
    ``_check_turn_arrays`` holds, in fewer passes; False when one may not, and those rules, in their
    order, then name the first that fails (``tests/test_wire_fuzz.py`` holds the two to agree)."""
    if not _shapes_plainly_valid(t):
        return False
    covered = sampled_turns_mask(t.turn_spans, len(t.token_ids))
    return covered is not None and _values_plainly_valid(t.token_ids, t.behavior_logprobs, t.token_versions,
                                                         t.loss_mask, covered, t.turn_rewards, t.turn_action_parsed,
                                                         t.turn_action_accepted)


def batch_plainly_valid(batch: Sequence[Any]) -> bool:
    """True only when every episode of ``batch`` passes every rule ``_arrays_plainly_valid`` screens,
    by one pass of each over all their arrays at once: a 1k-token episode's arrays take ~10 numpy
    calls of ~1 us fixed cost each, and a drained batch shares them. False when one may not (then
    each episode is checked on its own, and the failing one says why). Every screened rule holds for
    all episodes exactly when it holds over their concatenation: each is a minimum, a maximum, a
    finite sum or, for the loss mask, equality block by block."""
    if not all(map(_shapes_plainly_valid, batch)):
        return False
    covered = _batch_sampled_turns_mask(batch)
    if covered is None:
        return False
    ids, logprobs, versions, mask, turn_rewards, action_parsed, action_accepted = (
        concatenated([getattr(t, name) for t in batch], name) for name in _SCREENED_ARRAYS)
    return _values_plainly_valid(ids, logprobs, versions, mask, covered, turn_rewards, action_parsed,
                                 action_accepted)


_SCREENED_ARRAYS = ("token_ids", "behavior_logprobs", "token_versions", "loss_mask", "turn_rewards",
                    "turn_action_parsed", "turn_action_accepted")
_scratch = threading.local()


def concatenated(arrays: Sequence[np.ndarray], slot: str) -> np.ndarray:
    """``np.concatenate(arrays)`` (one dtype, at least one array), written into a buffer this
    thread keeps for ``slot``: valid until its next call for the same slot. A fresh 0.25 MB array
    per drained batch had glibc hand its pages back and fault them in again: 7.7 against 1.3 us an
    episode for the batch's seven arrays."""
    total = sum(map(len, arrays))
    buffer = getattr(_scratch, slot, None)
    if buffer is None or buffer.dtype != arrays[0].dtype or len(buffer) < total:
        buffer = np.empty(max(total, 2 * len(buffer) if buffer is not None else 0), arrays[0].dtype)
        setattr(_scratch, slot, buffer)
    return np.concatenate(arrays, out=buffer[:total])


def _batch_sampled_turns_mask(batch: Sequence[Any]) -> np.ndarray | None:
    """``sampled_turns_mask`` of each episode of ``batch``, concatenated; None unless every
    episode's spans are ordered and inside its tokens."""
    # One row of edges for all: each episode's block is its first token, its span edges, its end,
    # all shifted by where its tokens start. A block has an even number of edges, and the run from
    # one block's end to the next one's start is empty, so the runs keep alternating 0s and 1s
    # from block to block, and the row is non-decreasing exactly when every block is in order.
    lengths = np.fromiter((len(t.token_ids) for t in batch), np.int64, len(batch))
    span_edges = np.fromiter((t.turn_spans.size for t in batch), np.int64, len(batch))
    ends = np.cumsum(lengths)
    block_sizes = span_edges + 2
    block_ends = np.cumsum(block_sizes) - 1
    edges = np.empty(block_ends[-1] + 1, np.int64)
    inner = np.ones(len(edges), bool)
    inner[block_ends] = inner[block_ends - block_sizes + 1] = False
    edges[inner] = np.concatenate([t.turn_spans.ravel() for t in batch]) + np.repeat(ends - lengths, span_edges)
    edges[block_ends] = ends
    edges[block_ends - block_sizes + 1] = ends - lengths
    runs = edges[1:] - edges[:-1]
    try:
        return np.repeat(np.arange(len(runs)) % 2 == 1, runs)
    except ValueError:  # a negative run: spans out of order or outside their episode's tokens
        return None


def _shapes_plainly_valid(t: Any) -> bool:
    """The array rules that need no pass over the values: dimensions, lengths, the mask's dtype."""
    ids, mask, logprobs, versions = t.token_ids, t.loss_mask, t.behavior_logprobs, t.token_versions
    n = len(ids)
    if not (ids.ndim == mask.ndim == logprobs.ndim == versions.ndim == 1 and n == len(mask) == len(logprobs)
            == len(versions) and n > 0 and mask.dtype == np.uint8):
        return False
    spans, turns = t.turn_spans, t.num_turns
    if not (spans.ndim == 2 and spans.shape[1] == 2 and turns <= len(spans) <= turns + 1):
        return False
    per_turn = (t.turn_rewards, t.turn_observations, t.turn_action_parsed, t.turn_action_accepted)
    return all(a.ndim == 1 and len(a) in (0, turns) for a in per_turn)


def _values_plainly_valid(ids: np.ndarray, logprobs: np.ndarray, versions: np.ndarray, mask: np.ndarray,
                          covered: np.ndarray, turn_rewards: np.ndarray, action_parsed: np.ndarray,
                          action_accepted: np.ndarray) -> bool:
    """The array rules on the values, one pass each; ``covered``: the sampled turns' mask from the spans."""
    # Equal bytes: the mask is exactly the sampled turns, so also only 0s and 1s. Actors give context
    # tokens logprob 0, so every logprob is finite and a sampled one <= 0 when all lie in (-inf, 0]
    # (one that does not: the rules decide). NaN fails every comparison. A sum is finite only when
    # every term is (one may overflow and doubt a valid episode: the rules decide).
    return bool(covered.tobytes() == mask.tobytes() and np.minimum.reduce(ids) >= 0
                and np.minimum.reduce(logprobs) > -math.inf and np.maximum.reduce(logprobs) <= 0
                and np.minimum.reduce(versions, where=mask.view(bool), initial=0) >= 0
                and math.isfinite(np.add.reduce(turn_rewards))
                and np.maximum.reduce(action_parsed, initial=0) <= 1
                and np.maximum.reduce(action_accepted, initial=0) <= 1)


def _check_token_arrays(t: Any) -> None:
    # Whole-array reductions without temporaries (min, max, a reduction ``where`` sampled): this runs
    # on every episode the head doubts, 30k tokens long.
    arrays = (t.token_ids, t.loss_mask, t.behavior_logprobs, t.token_versions)
    require(all(a.ndim == 1 for a in arrays), "inconsistent_arrays", "token arrays must be 1-D")
    n = len(t.token_ids)
    if any(len(a) != n for a in arrays):
        lengths = dict(zip(("token_ids", "loss_mask", "behavior_logprobs", "token_versions"), map(len, arrays)))
        raise MeaningError("inconsistent_arrays", f"token arrays differ in length: {lengths}")
    if n == 0:
        return
    require(int(t.token_ids.min()) >= 0, "bad_token_ids", "negative token id")
    require(int(t.loss_mask.max()) <= 1, "inconsistent_arrays", "loss_mask holds values other than 0 and 1")
    sampled = sampled_mask(t)
    logprobs = t.behavior_logprobs
    # min and max are NaN when any value is, and +-inf when one is.
    require(bool(np.isfinite(logprobs.min()) and np.isfinite(logprobs.max())), "bad_logprobs",
            "behavior_logprobs are not all finite")
    require(float(logprobs.max(where=sampled, initial=0.0)) <= 0, "bad_logprobs",
            "a sampled token's logprob is positive")
    require(int(t.token_versions.min(where=sampled, initial=0)) >= 0, "bad_versions",
            "a sampled token has no policy version")


def sampled_mask(t: Any) -> np.ndarray:
    """The loss mask as booleans, without a copy of a decoded (uint8) one; only once ``loss_mask``
    holds just 0 and 1 (a byte of 0 or 1 is a valid bool)."""
    mask = t.loss_mask
    return mask.view(bool) if mask.dtype == np.uint8 else mask.astype(bool)


_ALTERNATING = np.arange(1025) % 2 == 1
"""False, True, False, ...: the loss mask's value on each run between span edges."""


def _check_turn_spans(t: Any) -> None:
    spans = t.turn_spans
    require(spans.ndim == 2 and spans.shape[1] == 2, "bad_turn_spans", f"turn_spans shape {spans.shape}, not [n, 2]")
    require(t.num_turns <= len(spans) <= t.num_turns + 1, "bad_turn_spans",
            f"{len(spans)} sampled turns for {t.num_turns} env turns")  # +1: the reply the env never got
    covered = sampled_turns_mask(spans, len(t.loss_mask))
    require(covered is not None, "bad_turn_spans", "turn_spans are not ordered [start, end) inside the tokens")
    require(covered.tobytes() == sampled_mask(t).tobytes(), "bad_turn_spans",
            "the loss mask is not exactly the sampled turns")


def sampled_turns_mask(spans: np.ndarray, n: int) -> np.ndarray | None:
    """The ``n`` tokens as booleans, True inside a ``[start, end)`` of ``spans`` ([k, 2]); None
    unless the spans are ordered and inside the tokens."""
    # 0, start, end, start, end, ..., n: ordered [start, end) spans inside the tokens are exactly a
    # non-decreasing row, and its steps are the runs of the loss mask (0s, 1s, 0s, ...).
    edges = np.empty(2 * len(spans) + 2, np.int64)  # int64: int32 bounds cannot overflow their differences
    edges[0], edges[1:-1], edges[-1] = 0, spans.ravel(), n
    runs = edges[1:] - edges[:-1]
    alternating = _ALTERNATING[:len(runs)] if len(runs) <= len(_ALTERNATING) else np.arange(len(runs)) % 2 == 1
    try:
        return np.repeat(alternating, runs)
    except ValueError:  # a negative run: a span that ends before it starts or before the last one ends
        return None


_TURN_ARRAYS = ("turn_rewards", "turn_observations", "turn_action_parsed", "turn_action_accepted")


def _check_turn_arrays(t: Any) -> None:
    for name in _TURN_ARRAYS:
        values = getattr(t, name)
        require(values.ndim == 1 and len(values) in (0, t.num_turns), "inconsistent_arrays",
                f"{name} has {values.shape} entries for {t.num_turns} turns")
    require(bool(np.isfinite(t.turn_rewards).all()), "out_of_range", "turn_rewards are not all finite")
    for name in ("turn_action_parsed", "turn_action_accepted"):
        require(bool((getattr(t, name) <= 1).all()), "out_of_range", f"{name} holds values other than 0, 1")


def _check_outcome(t: Any) -> None:
    if not 0.0 <= t.reward <= 1.0:
        raise MeaningError("out_of_range", f"reward {t.reward} is outside [0, 1]")
    status, reason = t.status, t.finish_reason
    if not (t.score is None or status == "ok"):
        raise MeaningError("inconsistent_outcome", f"a score with status {status}")
    if status == "ok":
        if reason not in OK_FINISH_REASONS:
            raise MeaningError("inconsistent_outcome", f"status ok with finish_reason {reason!r}")
    elif reason != status and not (status == "timeout" and reason == "deadline"):
        raise MeaningError("inconsistent_outcome", f"status {status} with finish_reason {reason!r}")
    if t.terminated != (reason == "terminated"):
        raise MeaningError("inconsistent_outcome", f"terminated={t.terminated} with finish_reason {reason!r}")
    if t.terminated and t.truncated:
        raise MeaningError("inconsistent_outcome", "both terminated and truncated")
    if t.success and status != "ok":
        raise MeaningError("inconsistent_outcome", f"a success with status {status}")


# ---------------------------------------------------------------------------------- the others


def check_lease_request(m: Any) -> None:
    count_in_range(m.actor_id, "actor_id")
    count_in_range(m.max_leases, "max_leases", low=1, high=4096)


def check_task_lease(m: Any) -> None:
    for name in ("lease_id", "group_id", "env_id", "task_id"):
        text(getattr(m, name), name)
    count_in_range(m.group_size, "group_size", low=1)
    count_in_range(m.turn_cap, "turn_cap", low=1)
    count_in_range(m.max_episode_tokens, "max_episode_tokens", low=1)
    count_in_range(m.policy_version, "policy_version")
    require(-2**63 <= m.seed < 2**64, "out_of_range", "seed does not fit 64 bits")
    require(m.deadline_unix_s > 0, "out_of_range", f"deadline {m.deadline_unix_s} is not a time")


def check_weights_announce(m: Any) -> None:
    count_in_range(m.version, "version")
    count_in_range(m.generation, "generation")
    require(all(0 <= n < 2**62 for n in m.bucket_nbytes), "out_of_range", "bucket sizes out of range")
    require(len({s.name for s in m.slots}) == len(m.slots), "bad_slots", "two slots share a name")
    for slot in m.slots:
        _check_slot(slot, m.bucket_nbytes)


def _check_slot(slot: Any, bucket_nbytes: list[int]) -> None:
    # The peer's name and dtype shown cut short, its shape only once it is short: any may be megabytes.
    where = f"slot {cut_short(slot.name)!r}"
    require(slot.dtype in WEIGHT_DTYPE_BYTES, "bad_slots",
            f"{where}: dtype {cut_short(slot.dtype)!r} is not a weight dtype")
    require(len(slot.shape) <= MAX_WEIGHT_DIMS and all(0 <= d < 2**31 for d in slot.shape), "bad_slots",
            f"{where}: bad shape (at most {MAX_WEIGHT_DIMS} dimensions, each 0 to 2**31 - 1)")
    require(slot.nbytes == math.prod(slot.shape) * WEIGHT_DTYPE_BYTES[slot.dtype], "bad_slots",
            f"{where}: {slot.nbytes} bytes for shape {slot.shape} of {slot.dtype}")
    require(0 <= slot.bucket < len(bucket_nbytes), "bad_slots", f"{where}: no bucket {slot.bucket}")
    require(0 <= slot.offset_bytes and slot.offset_bytes + slot.nbytes <= bucket_nbytes[slot.bucket], "bad_slots",
            f"{where}: bytes [{slot.offset_bytes}, +{slot.nbytes}) outside its bucket")


MAX_WEIGHT_DIMS = 8
"""The most dimensions a parameter's shape may have (a model's have up to 5)."""


def cut_short(text: str, chars: int = 40) -> str:
    """A peer's name in an error, bounded: it may be megabytes long."""
    return text if len(text) <= chars else text[:chars] + "..."


def check_control(m: Any) -> None:
    if m.command == "regroup":
        require(m.generation is not None and m.members is not None, "bad_regroup", "regroup needs generation, members")
        count_in_range(m.generation, "generation")
        for member in m.members:
            count_in_range(member, "member")
        require(len(set(m.members)) == len(m.members), "bad_regroup", "a member is named twice")


def check_group_join(m: Any) -> None:
    count_in_range(m.actor_id, "actor_id")
    count_in_range(m.weight_version, "weight_version")
    count_in_range(m.generation_seen, "generation_seen")


def check_actor_stats(m: Any) -> None:
    for name in ("actor_id", "weight_version", "episodes_running", "episodes_finished", "engine_queue_depth"):
        count_in_range(getattr(m, name), name)
    require(m.tokens_per_s >= 0 and m.episode_latency_s_mean >= 0, "out_of_range", "negative rate or latency")
    require(all(0 <= n <= 2**62 for n in m.errors.values()), "out_of_range", "error counts out of range")


def check_trained_sample(m: Any) -> None:
    text(m.lease_id, "lease_id")
    text(m.group_id, "group_id")
    count_in_range(m.episode_index, "episode_index")
    count_in_range(m.learner_step, "learner_step")
    require(m.token_advantages.ndim == 1, "inconsistent_arrays", "token_advantages must be 1-D")
    require(bool(np.all(np.isfinite(m.token_advantages))), "out_of_range", "token_advantages are not all finite")


CHECKS: dict[str, Callable[[Any], None]] = {
    "Trajectory": check_trajectory, "LeaseRequest": check_lease_request, "TaskLease": check_task_lease,
    "WeightsAnnounce": check_weights_announce, "Control": check_control, "GroupJoin": check_group_join,
    "ActorStats": check_actor_stats, "TrainedSample": check_trained_sample,
}
"""The meaning check of each message type, by name (every type in ``protocol.MESSAGE_TYPES``)."""
