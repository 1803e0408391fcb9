"""Property-based fuzzing of every decoder and of the head's ingest path.

Properties, for frames made by mutating valid ones (bytes flipped, cut or spliced; a field
replaced by any msgpack value or left out; an array's dtype, shape or data changed):
- ``decode`` either returns a message of a declared type or raises ``ProtocolError``, nothing else;
- an episode the head accepts can be trained on: it collates, and ``policy_lag``, the turn table
  and the rollout metrics run on it (before the meaning checks, one such episode killed the learner);
- no frame makes the head's message handler raise, and a valid episode afterwards still
  completes its group;
- what decodes holds the types its class declares (checked here, not by the decoder) and leaves its
  arrays in the frame; what does not says why, briefly, with a reason to count it by;
- the array screen passes only episodes the array rules pass.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
import types
import typing
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import protocol, wire_checks
from common.protocol import (
    ActorStats,
    Control,
    GroupJoin,
    LeaseRequest,
    ProtocolError,
    TaskLease,
    TensorSlot,
    TrainedSample,
    Trajectory,
    WeightsAnnounce,
)
from learner.batching import collate, policy_lag
from learner.group import Group
from learner.head import HeadFailed, HeadServer
from learner.rollout_metrics import rollout_scalars
from learner.sampler import TaskSampler
from tests.test_protocol import make_trajectory

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


@st.composite
def trajectories(draw, lease: TaskLease | None = None, episode_index: int | None = None) -> Trajectory:
    """A valid episode: observation tokens, then replies, turn by turn."""
    turns = draw(st.integers(0, 4))
    tokens, mask, spans = [], [], []
    for _ in range(turns + 1):
        tokens += draw(st.lists(st.integers(0, 255), min_size=1, max_size=6))  # an observation
        mask += [0] * (len(tokens) - len(mask))
        if len(spans) < turns:
            reply = draw(st.lists(st.integers(0, 255), min_size=1, max_size=6))
            spans.append([len(tokens), len(tokens) + len(reply)])
            tokens += reply
            mask += [1] * len(reply)
    n = len(tokens)
    sampled = np.array(mask, bool)
    logprobs = np.where(sampled, -np.array(draw(st.lists(st.floats(0, 20), min_size=n, max_size=n))), 0.0)
    lease = lease or TaskLease("l0", "g0", "keydoor-v0", "1", 0, 2, 4, 4096, 3, 1.5e9)
    success = draw(st.booleans())
    return Trajectory(
        lease_id=lease.lease_id, group_id=lease.group_id, env_id=lease.env_id, task_id=lease.task_id, actor_id=0,
        episode_index=draw(st.integers(0, lease.group_size - 1)) if episode_index is None else episode_index,
        group_size=lease.group_size, token_ids=np.array(tokens, np.int32), loss_mask=sampled.astype(np.uint8),
        behavior_logprobs=logprobs.astype(np.float32), token_versions=np.where(sampled, lease.policy_version, -1)
        .astype(np.int32), turn_spans=np.array(spans, np.int32).reshape(-1, 2), reward=float(success),
        success=success, terminated=success, truncated=not success,
        finish_reason="terminated" if success else "turn_cap", status="ok", num_turns=turns,
        turn_cap=lease.turn_cap, turn_rewards=np.zeros(turns, np.float32),
        turn_observations=np.arange(turns, dtype=np.uint64), turn_action_parsed=np.ones(turns, np.uint8))


MESSAGES = st.one_of(
    trajectories(),
    st.just(LeaseRequest(actor_id=0, max_leases=2)),
    st.just(TaskLease("l", "g", "keydoor-v0", "1", 7, 4, 3, 1024, 2, 1.5e9)),
    st.just(WeightsAnnounce(3, [128], [TensorSlot("w", [2, 3], "bfloat16", 0, 0, 12)])),
    st.just(Control(command="regroup", generation=3, members=[0, 2])),
    st.just(GroupJoin(actor_id=2, weight_version=7, generation_seen=3)),
    st.just(ActorStats(0, 3, 2, 10, 1, 55.5, 0.7, {"env_error": 1})),
    st.just(TrainedSample("l", "g", 0, 3, 0.5, np.array([0.5, -1.0], np.float32))),
)
MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)
ARRAY_MUTATIONS = st.fixed_dictionaries({
    "dtype": st.sampled_from(["<i4", "u1", "<f4", "<u8", "<f8", "|O", "<i4"]),
    "shape": st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 12), max_size=3),
    "data": st.binary(max_size=64),
})


def place_in(frame: bytearray) -> st.SearchStrategy[int]:
    """An index into ``frame``, drawn the same way whatever its length: the head's lease ids grow a
    digit as examples run (g99, g100), and a draw bounded by the length would make hypothesis
    replay an example differently (``FlakyStrategyDefinition``)."""
    return st.integers(0, 2**16 - 1).map(lambda fraction: fraction * len(frame) >> 16)


@st.composite
def mutated_frames(draw, messages=MESSAGES) -> bytes:
    envelope = msgpack.unpackb(protocol.encode(draw(messages)))
    how = draw(st.sampled_from(["field", "drop", "array", "resize", "resize", "bytes", "cut", "envelope"]))
    body = envelope["body"]
    arrays = sorted(k for k, v in body.items() if isinstance(v, dict) and "shape" in v)
    if how == "resize" and arrays:  # well formed, another length and other values: decodes as types
        key = draw(st.sampled_from(arrays))
        old = body[key]
        rows = draw(st.integers(0, 12))
        nbytes = np.dtype(old["dtype"]).itemsize * rows * int(np.prod(old["shape"][1:], dtype=np.int64))
        body[key] = {**old, "shape": [rows, *old["shape"][1:]], "data": draw(st.binary(min_size=nbytes,
                                                                                       max_size=nbytes))}
    if how == "field":
        body[draw(st.sampled_from(sorted(body)))] = draw(MSGPACK_VALUES)
    elif how == "drop" and body:  # a required field missing, or one with a default, as older senders send it
        del body[draw(st.sampled_from(sorted(body)))]
    elif how == "array":
        if arrays:
            key, mutation = draw(st.sampled_from(arrays)), draw(ARRAY_MUTATIONS)
            changed = draw(st.lists(st.sampled_from(sorted(mutation)), min_size=1, unique=True))
            body[key] = {**body[key], **{k: mutation[k] for k in changed}}
    elif how == "envelope":
        envelope[draw(st.sampled_from(["type", "schema", "body"]))] = draw(MSGPACK_VALUES)
    frame = bytearray(msgpack.packb(envelope))
    if how == "bytes":
        for _ in range(draw(st.integers(1, 8))):
            frame[draw(place_in(frame))] = draw(st.integers(0, 255))
    if how == "cut":
        frame = frame[: draw(place_in(frame))]
    return bytes(frame)


@FUZZ
@given(mutated_frames())
def test_decode_returns_a_message_or_raises_protocol_error(frame):
    try:
        message = protocol.decode(frame)
    except ProtocolError as exc:
        assert exc.reason
        return
    assert type(message) in protocol.MESSAGE_TYPES.values()
    assert protocol.decode(protocol.encode(message)) is not None  # what decodes re-encodes


@FUZZ
@given(mutated_frames(trajectories()))
def test_every_trajectory_that_decodes_can_be_trained_on(frame):
    try:
        episode = protocol.decode(frame, Trajectory)
    except ProtocolError:
        return
    lease = TaskLease("l0", "g0", "keydoor-v0", "1", 0, episode.group_size, episode.turn_cap, 4096, 3, 1.5e9)
    batch = collate([Group(lease, [episode])])
    assert policy_lag(episode, 5) >= 0
    rollout_scalars([episode], 5)
    if batch is not None:
        assert batch.token_ids.shape[1] == len(episode.token_ids)
        assert int(batch.loss_mask.sum()) == int(episode.loss_mask.sum())


# ---------------------------------------------------------------------------------- what decodes


REASONS = {"not_msgpack", "bad_envelope", "schema_version", "unknown_type", "unexpected_type", "bad_field",
           "bad_array", "out_of_range"}
"""Every reason a frame can be refused for before its meaning is checked (``common/wire_decoder.py``)."""


def decided(frame: bytes) -> tuple[str, str | bytes]:
    """What ``decode`` made of a frame: the message re-encoded, or the error's reason and text."""
    try:
        return "message", protocol.encode(protocol.decode(frame))
    except ProtocolError as exc:
        return exc.reason, str(exc)


def assert_of_its_declared_types(message: Any) -> None:
    """Every field of ``message`` holds what its hint declares, checked here independently of the
    decoder: what the learner and the actors read off a message never surprises them."""
    hints = typing.get_type_hints(type(message))
    for f in dataclasses.fields(message):
        value, where = getattr(message, f.name), f"{type(message).__name__}.{f.name}"
        if f.metadata.get("dtype") is not None:
            assert isinstance(value, np.ndarray) and value.dtype == f.metadata["dtype"] and value.ndim in (1, 2), where
        else:
            assert_of_type(value, hints[f.name], where)


def assert_of_type(value: Any, hint: Any, where: str) -> None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        assert type(value) is hint, where
        assert_of_its_declared_types(value)
    elif origin is typing.Literal:
        assert value in args, where
    elif origin in (typing.Union, types.UnionType):
        assert any(_is_of_type(value, a) for a in args), where
    elif origin is list:
        assert type(value) is list, where
        for item in value:
            assert_of_type(item, args[0], where)
    elif origin is dict:
        assert type(value) is dict and all(type(k) is str for k in value), where
        if args[1] is not Any:
            for item in value.values():
                assert_of_type(item, args[1], where)
    elif hint is float:
        assert type(value) is float and math.isfinite(value), where
    else:
        assert type(value) is hint, where  # type, not isinstance: a bool is no int


def _is_of_type(value: Any, hint: Any) -> bool:
    try:
        assert_of_type(value, hint, "")
        return True
    except AssertionError:
        return False


@FUZZ
@given(mutated_frames())
def test_what_decodes_is_of_its_declared_types_and_what_does_not_says_why_briefly(frame):
    try:
        message = protocol._decode_unchecked(frame, None)
    except ProtocolError as exc:
        assert exc.reason in REASONS and len(str(exc)) < 1000  # counted and logged: never a peer's megabytes
        return
    assert_of_its_declared_types(message)


def long_episodes() -> st.SearchStrategy[Trajectory]:
    """Valid episodes whose token arrays are kilobytes long, as a long context makes them."""
    return st.builds(lambda episode, context: dataclasses.replace(
        episode, token_ids=np.concatenate([np.full(context, 7, np.int32), episode.token_ids]),
        loss_mask=np.concatenate([np.zeros(context, np.uint8), episode.loss_mask]),
        behavior_logprobs=np.concatenate([np.zeros(context, np.float32), episode.behavior_logprobs]),
        token_versions=np.concatenate([np.full(context, -1, np.int32), episode.token_versions]),
        turn_spans=episode.turn_spans + context), trajectories(), st.integers(64, 600))


@FUZZ
@given(mutated_frames(long_episodes()))
def test_a_decoded_episode_leaves_its_arrays_in_the_frame(frame):
    try:
        episode = protocol.decode(frame)
    except ProtocolError:
        return
    if isinstance(episode, Trajectory) and episode.token_ids.size:
        assert np.shares_memory(episode.token_ids, np.frombuffer(frame, np.uint8))
        assert not episode.token_ids.flags.writeable


@FUZZ
@given(mutated_frames(trajectories()))
def test_the_array_screen_passes_only_episodes_the_array_rules_pass(frame):
    try:
        episode = protocol._decode_unchecked(frame, Trajectory)
    except ProtocolError:  # not even well typed: never reaches the meaning checks
        return
    if wire_checks._arrays_plainly_valid(episode):
        wire_checks._check_token_arrays(episode)  # none of these may raise
        wire_checks._check_turn_spans(episode)
        wire_checks._check_turn_arrays(episode)


@FUZZ
@given(trajectories())
def test_a_valid_episode_passes_the_array_screen(episode):
    """The property above holds for a screen that is never passed, too: valid episodes pass it."""
    assert wire_checks._arrays_plainly_valid(protocol.decode(protocol.encode(episode)))


@FUZZ
@given(st.lists(mutated_frames(trajectories()) | trajectories().map(protocol.encode), min_size=2, max_size=6))
def test_frames_decoded_together_are_decided_as_each_alone(frames):
    """``decode_many`` screens the episodes' arrays together: only how fast, never what, it decides."""
    together = [(r.reason, str(r)) if isinstance(r, ProtocolError) else ("message", protocol.encode(r))
                for r in protocol.decode_many(frames)]
    assert together == [decided(frame) for frame in frames]


@FUZZ
@given(st.lists(trajectories(), min_size=2, max_size=6))
def test_valid_episodes_pass_the_batch_screen(episodes):
    assert wire_checks.batch_plainly_valid([protocol.decode(protocol.encode(e)) for e in episodes])


def long_episode(n: int) -> Trajectory:
    """A valid episode of ``n`` tokens: a short reply, then a long one."""
    return dataclasses.replace(make_trajectory(n), turn_spans=np.array([[2, 4], [6, n]], np.int32),
                               loss_mask=np.isin(np.arange(n), [2, 3, *range(6, n)]).astype(np.uint8))


def map_of(pairs: list[tuple[str, Any]]) -> bytes:
    """A msgpack map of ``pairs`` as they are, a key twice if it is there twice."""
    return msgpack.Packer().pack_map_header(len(pairs)) + b"".join(map(msgpack.packb, itertools.chain(*pairs)))


def episode_frame(*extra_pairs: tuple[str, Any], **changes) -> bytes:
    """A long valid episode with the wire body ``changes``, then ``extra_pairs`` appended to the body's
    map as they are (a key twice, as a peer could send it)."""
    envelope = msgpack.unpackb(protocol.encode(long_episode(3000)))
    body = map_of([*{**envelope["body"], **changes}.items(), *extra_pairs])
    head = [msgpack.packb(value) for value in ("type", envelope["type"], "schema", envelope["schema"], "body")]
    return b"".join([msgpack.Packer().pack_map_header(3), *head, body])


@pytest.mark.parametrize("frame, decision", [
    (episode_frame(), "message"),
    # The bytes of a "data" key and a bin header, inside a string before the arrays.
    (episode_frame(lease_id="\u00a4data\u0150A"), "message"),
    (episode_frame(env_info={"data": bytes(5000)}), "message"),  # a large bin after a "data" key, but no array's
    (episode_frame(env_info={"room": {1: "attic"}}), "bad_field"),  # a key msgpack-python would refuse to read
    (episode_frame(env_info={"room": msgpack.ExtType(0x55, bytes(8))}), "not_msgpack"),  # no message has one
    (episode_frame(env_info={"s": "x", "i": -3, "u": 2**64 - 1, "f": 0.5, "b": True, "n": None, "raw": b"\0"}),
     "message"),
    (episode_frame(env_info={"nested": {"steps": [1, 2], "room": {"name": "attic"}}}), "message"),
    (episode_frame(env_info={"at": msgpack.Timestamp(1, 0)}), "bad_field"),  # msgspec would make it a datetime
    (episode_frame(env_info={b"room": "attic"}), "bad_field"),
    (episode_frame(timings={"episode_s": 3}), "message"),  # an int for a float: made 3.0
    (episode_frame(reward=float("nan")), "out_of_range"),
    (episode_frame(("reward", 0.0)), "message"),  # a key twice: the last one counts
    (episode_frame(("actor_id", True)), "bad_field"),
    (episode_frame(("actor_id", 1), actor_id=True), "bad_field"),  # each value is checked, the first too
])
def test_frames_a_decoder_could_misread_are_decided_as_meant(frame, decision):
    assert decided(frame)[0] == decision
    if decision == "message":
        episode = protocol.decode(frame)
        assert_of_its_declared_types(episode)
        assert np.shares_memory(episode.token_ids, np.frombuffer(frame, np.uint8))  # in place, never copied


def test_a_key_sent_twice_counts_once_as_the_last():
    assert protocol.decode(episode_frame(("reward", 0.0), reward=1.0)).reward == 0.0
    assert protocol.decode(episode_frame(("timings", {"episode_s": 3}))).timings == {"episode_s": 3.0}


def test_encoded_payloads_are_aligned_and_any_msgpack_reader_sees_the_same_message():
    episode = long_episode(6000)
    frame = protocol.encode(episode)
    plain = msgpack.packb({"type": "Trajectory", "schema": protocol.SCHEMA_VERSION, "body": protocol._to_wire(episode)})
    assert msgpack.unpackb(frame) == msgpack.unpackb(plain)
    decoded = protocol.decode(frame)
    assert np.shares_memory(decoded.token_ids, np.frombuffer(frame, np.uint8))
    for name in ("token_ids", "loss_mask", "behavior_logprobs", "token_versions", "turn_spans", "turn_observations"):
        array = getattr(decoded, name)
        assert array.flags.aligned and np.array_equal(array, getattr(episode, name)), name


# ---------------------------------------------------------------------------------- the head


@pytest.fixture(scope="module")
def head():
    sampler = TaskSampler({"keydoor-v0": ["1", "2", "3"]}, group_size=2, groups_per_step=1, max_policy_lag=2,
                          lease_timeout_s=600.0, max_episode_tokens=4096, seed=0)
    server = HeadServer(sampler, vocab_size=256)  # never started: frames are handed in directly
    server.set_policy(3, 4)
    yield server
    server.stop()


def open_lease(server: HeadServer) -> TaskLease:
    """A lease the head holds open, as if granted to an actor (a new version each time keeps the
    staleness admission open however many examples run)."""
    server.set_policy(server.sampler.version + 1, 4)
    with server._lock:
        lease = server.sampler.issue()
        server._open[lease.lease_id] = Group(lease)
    return lease


@FUZZ
@given(data=st.data())
def test_no_frame_breaks_the_heads_ingest(head, data):
    lease = open_lease(head)
    valid = data.draw(trajectories(lease, episode_index=0))
    mutants = [data.draw(mutated_frames(st.just(valid) | MESSAGES)) for _ in range(3)]
    # Taken together, as the head takes what it drained: the mutants must not raise nor spoil the rest.
    head._on_pushes([[frame] for frame in [*mutants, protocol.encode(dataclasses.replace(valid, episode_index=1)),
                                           protocol.encode(valid)]])
    group = head._open.get(lease.lease_id)
    if group is None:  # completed: its two episodes, one per index, and nothing a mutant slipped in
        done = head.groups.get_nowait()
        assert sorted(e.episode_index for e in done.episodes) == [0, 1]
        assert all(len(e.token_ids) == len(e.loss_mask) for e in done.episodes)
        head.consume(1)
    else:  # a mutant that still made sense took index 0 or 1 first: the other is still missing
        assert len(group.episodes) == 1
        with head._lock:
            head._open.pop(lease.lease_id)
            head.sampler.expire([lease.lease_id])


def test_the_head_rejects_episodes_that_contradict_their_lease_or_model():
    sampler = TaskSampler({"keydoor-v0": ["1"]}, group_size=2, groups_per_step=1, max_policy_lag=2,
                          lease_timeout_s=600.0, max_episode_tokens=4096, seed=0)
    server = HeadServer(sampler, vocab_size=100)
    try:
        server.set_policy(3, 4)
        lease = open_lease(server)
        valid = dataclasses.replace(make_trajectory(), lease_id=lease.lease_id, group_id=lease.group_id,
                                    task_id=lease.task_id, episode_index=0, group_size=2,
                                    token_versions=np.full(7, 3, np.int32))
        future = server.sampler.version + 1
        cases = {
            "not_the_lease": dataclasses.replace(valid, task_id="2"),
            "bad_token_ids": dataclasses.replace(valid, token_ids=np.full_like(valid.token_ids, 100)),
            "version_from_the_future": dataclasses.replace(
                valid, token_versions=np.where(valid.loss_mask.astype(bool), future, -1).astype(np.int32)),
        }
        for reason, episode in cases.items():
            server._on_pushes([[protocol.encode(episode)]])
            assert server.ledger().get(f"rejected/{reason}") == 1, reason
        assert server._open[lease.lease_id].episodes == []
        server._on_pushes([[protocol.encode(episode)] for episode in cases.values()])  # decoded together
        for reason in cases:
            assert server.ledger().get(f"rejected/{reason}") == 2, reason
        assert server._open[lease.lease_id].episodes == []
        server.expect_version(future)  # those weights went out: now it is an honest episode
        server._on_pushes([[protocol.encode(cases["version_from_the_future"])]])
        assert len(server._open[lease.lease_id].episodes) == 1
        # Decoded together with a valid one, a contradicting episode is still found out.
        server._on_pushes([[protocol.encode(dataclasses.replace(cases["bad_token_ids"], episode_index=1))],
                           [protocol.encode(dataclasses.replace(valid, episode_index=1))]])
        assert server.ledger().get("rejected/bad_token_ids") == 3
        assert sorted(e.episode_index for e in server.groups.get_nowait().episodes) == [0, 1]
    finally:
        server.stop()


def test_a_message_of_several_frames_is_rejected_and_the_rest_of_its_batch_taken(head):
    lease = open_lease(head)
    episodes = [protocol.encode(make_trajectory_for(lease, index)) for index in (0, 1)]
    rejected = head.ledger().get("rejected/bad_frames", 0)
    head._on_pushes([[episodes[0], episodes[1]], [episodes[0]], [episodes[1]]])
    assert head.ledger()["rejected/bad_frames"] == rejected + 1
    assert sorted(e.episode_index for e in head.groups.get_nowait().episodes) == [0, 1]
    head.consume(1)


def make_trajectory_for(lease: TaskLease, episode_index: int) -> Trajectory:
    return dataclasses.replace(make_trajectory(), lease_id=lease.lease_id, group_id=lease.group_id,
                               env_id=lease.env_id, task_id=lease.task_id, episode_index=episode_index,
                               group_size=lease.group_size, turn_cap=lease.turn_cap,
                               token_versions=np.full(7, lease.policy_version, np.int32))


def test_a_dead_ingest_thread_fails_the_training_loop_saying_why():
    """Before, the thread died with nothing reported and the run hung at its next step."""
    sampler = TaskSampler({"keydoor-v0": ["1"]}, group_size=2, groups_per_step=1, max_policy_lag=2,
                          lease_timeout_s=600.0, max_episode_tokens=4096, seed=0)
    server = HeadServer(sampler, poll_ms=5)

    def broken_ledger(*args, **kwargs):
        raise RuntimeError("ledger exploded")

    sampler.expire_overdue = broken_ledger  # a bug outside message handling
    server.start()
    try:
        with pytest.raises(HeadFailed, match="ledger exploded"):
            for _ in range(20):
                server.get(timeout_s=0.1)
    finally:
        server.stop()


def test_a_handler_bug_drops_one_message_and_counts_it(monkeypatch):
    sampler = TaskSampler({"keydoor-v0": ["1"]}, group_size=2, groups_per_step=1, max_policy_lag=2,
                          lease_timeout_s=600.0, max_episode_tokens=4096, seed=0)
    server = HeadServer(sampler, poll_ms=5)
    calls = []

    def flaky_stats(*message):
        calls.append(message)
        if len(calls) == 1:
            raise KeyError("a bug one message exposed")
        return HeadServer._on_message(server, *message)

    monkeypatch.setattr(server, "_on_message", flaky_stats)
    server.start()
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(server.trajectory_address)
    try:
        stats = ActorStats(0, 3, 2, 10, 1, 55.5, 0.7, {})
        push.send(protocol.encode(stats))
        push.send(protocol.encode(stats))
        deadline = time.monotonic() + 5
        while 0 not in server.actor_stats and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.actor_stats[0] == stats  # the second message went through
        assert server.ledger()["rejected/handler_error/KeyError"] == 1
        server.check_alive()
    finally:
        push.close(linger=0)
        server.stop()


def failed_before_its_opening(lease: TaskLease, episode_index: int) -> Trajectory:
    """What an actor sends when the opening outgrew max_episode_tokens: no tokens, no turns."""
    empty = {"token_ids": np.zeros(0, np.int32), "loss_mask": np.zeros(0, np.uint8),
             "behavior_logprobs": np.zeros(0, np.float32), "token_versions": np.zeros(0, np.int32),
             "turn_spans": np.zeros((0, 2), np.int32), "turn_rewards": np.zeros(0, np.float32),
             "turn_observations": np.zeros(0, np.uint64), "turn_action_parsed": np.zeros(0, np.uint8),
             "turn_action_accepted": np.zeros(0, np.uint8)}
    return dataclasses.replace(make_trajectory_for(lease, episode_index), **empty, status="actor_error",
                               finish_reason="actor_error", error="ValueError: the opening is 1805 tokens",
                               reward=0.0, success=False, terminated=False, truncated=False, num_turns=0,
                               score=None)


def test_episodes_that_failed_with_no_tokens_are_taken_together_and_their_group_accounted(head):
    # Seen in a user run (TextCraft's opening past max_episode_tokens on every episode): two such
    # episodes drained together were dropped as a decoding error, their lease never answered.
    lease = open_lease(head)
    before = head.ledger()
    head._on_pushes([[protocol.encode(failed_before_its_opening(lease, index))] for index in (0, 1)])
    after = head.ledger()
    assert not any(key.startswith("rejected/") and after[key] != before.get(key) for key in after), after
    assert lease.lease_id not in head._open  # both episodes answered it
