"""Wire protocol: round trips, and malformed or truncated messages rejected with ProtocolError."""

import dataclasses

import msgpack
import numpy as np
import pytest

from common import protocol
from common.protocol import (
    ActorStats,
    Control,
    GroupJoin,
    LeaseRequest,
    ProtocolError,
    TaskLease,
    TensorSlot,
    Trajectory,
    WeightsAnnounce,
    decode,
    encode,
)


def make_trajectory(n=7) -> Trajectory:
    return Trajectory(
        lease_id="g1-r0", group_id="g1", env_id="keydoor-v0", task_id="3", actor_id=1, episode_index=2, group_size=4,
        token_ids=np.arange(n, dtype=np.int32), loss_mask=((np.arange(n) % 4) >= 2).astype(np.uint8),
        behavior_logprobs=np.linspace(-3, 0, n, dtype=np.float32), token_versions=np.full(n, 4, np.int32),
        turn_spans=np.array([[2, 4], [6, n]], np.int32), reward=1.0, success=True, terminated=True, truncated=False,
        finish_reason="terminated", status="ok", num_turns=2, turn_cap=4,
        timings={"episode_s": 0.5}, env_info={"room": "attic", "nested": [1, {"a": None}]},
    )


def test_trajectory_round_trip_keeps_arrays_exact():
    original = make_trajectory()
    decoded = decode(encode(original), Trajectory)
    for name in ("token_ids", "loss_mask", "behavior_logprobs", "token_versions", "turn_spans"):
        got, want = getattr(decoded, name), getattr(original, name)
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert decoded.reward == 1.0 and decoded.status == "ok" and decoded.env_info == original.env_info


def test_per_turn_rewards_and_observation_fingerprints_round_trip_and_may_be_absent():
    fingerprints = np.array([2**64 - 1, 12345], np.uint64)  # full 64-bit range, exact
    original = dataclasses.replace(make_trajectory(), turn_rewards=np.array([0.2, 0.8], np.float32),
                                   turn_observations=fingerprints)
    decoded = decode(encode(original), Trajectory)
    assert np.array_equal(decoded.turn_observations, fingerprints) and decoded.turn_observations.dtype == np.uint64
    assert np.array_equal(decoded.turn_rewards, original.turn_rewards)
    envelope = msgpack.unpackb(encode(original))
    for name in ("turn_rewards", "turn_observations"):  # as an older actor or recording sends it
        del envelope["body"][name]
    older = decode(msgpack.packb(envelope), Trajectory)
    assert older.turn_rewards.size == 0 and older.turn_observations.size == 0


def test_arrays_travel_as_raw_bytes_not_lists():
    body = msgpack.unpackb(encode(make_trajectory(1000)))["body"]
    assert body["token_ids"]["dtype"] == "<i4" and isinstance(body["token_ids"]["data"], bytes)
    assert len(body["token_ids"]["data"]) == 4000


@pytest.mark.parametrize("message", [
    LeaseRequest(actor_id=0, max_leases=2),
    TaskLease("l", "g", "keydoor-v0", "1", 7, 4, 3, 1024, 2, 1.5e9),
    WeightsAnnounce(3, [128], [TensorSlot("w", [2, 3], "bfloat16", 0, 0, 12)]),
    Control(command="stop"),
    Control(command="regroup", generation=3, members=[0, 2]),
    GroupJoin(actor_id=2, weight_version=7, generation_seen=3),
    ActorStats(0, 3, 2, 10, 1, 55.5, 0.7, {"env_error": 1}),
])
def test_every_message_round_trips(message):
    assert decode(encode(message)) == message


def test_truncated_message_is_rejected():
    data = encode(make_trajectory())
    for cut in (1, len(data) // 2, len(data) - 1):
        with pytest.raises(ProtocolError):
            decode(data[:cut])


def _envelope(body, type_="Trajectory", schema=protocol.SCHEMA_VERSION):
    return msgpack.packb({"type": type_, "schema": schema, "body": body})


def _body(**changes):
    body = msgpack.unpackb(encode(make_trajectory()))["body"]
    body.update(changes)
    return body


@pytest.mark.parametrize("data, fragment", [
    (b"\xc1garbage", "msgpack"),
    (msgpack.packb([1, 2, 3]), "envelope"),
    (_envelope(_body(), schema=99), "schema version"),
    (_envelope(_body(), type_="Pickle"), "unknown message type"),
    (_envelope(_body(status="great")), "status"),
    (_envelope(_body(reward="high")), "reward"),
    (_envelope(_body(extra=1)), "unknown fields"),
    (_envelope({k: v for k, v in _body().items() if k != "lease_id"}), "missing fields"),
    (_envelope(_body(token_ids={"dtype": "<f8", "shape": [7], "data": b"\0" * 56})), "dtype"),
    (_envelope(_body(token_ids={"dtype": "<i4", "shape": [7], "data": b"\0" * 27})), "bytes of data"),
    # No elements, yet numpy cannot make it: its other dimension overflows the array's size.
    (_envelope(_body(turn_spans={"dtype": "<i4", "shape": [0, 2**61], "data": b""})), "bad shape"),
    (_envelope(_body(num_turns=True)), "num_turns"),
    (_envelope(_body(purpose="test")), "purpose"),
])
def test_malformed_messages_raise_protocol_error(data, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        decode(data)


@pytest.mark.parametrize("body", [
    _body(status="x" * (1 << 20)),  # a closed choice
    _body(score="x" * (1 << 20)),  # a union (float | None)
    _body(**{f"{i:04d}" + "k" * (1 << 12): 1 for i in range(1000)}),  # unknown fields
    # An unknown key that writes a path of its own into msgspec's words (none is written at the top).
    _body(**{"z` - at `$" + "C" * (1 << 20): 1}),
    _body(**{"z` - at `$.token_ids": 1}),  # nor does it pick the reason
])
def test_a_rejection_never_repeats_a_hostile_value(body):
    """The reason is logged and counted: megabytes a peer sent must not end up in it."""
    with pytest.raises(ProtocolError) as caught:
        decode(_envelope(body))
    assert caught.value.reason == "bad_field" and len(str(caught.value)) < 1000


def test_a_hostile_message_type_name_is_not_repeated_either():
    with pytest.raises(ProtocolError) as caught:
        decode(_envelope(_body(), type_="T" * (1 << 20)))
    assert caught.value.reason == "unknown_type" and len(str(caught.value)) < 1000


def test_a_nested_record_says_which_item_is_wrong():
    slots = [{"name": "w", "shape": [2], "dtype": "bfloat16", "bucket": 0, "offset_bytes": 0, "nbytes": 4},
             {"name": "b", "shape": [2], "dtype": "bfloat16", "bucket": 0, "offset_bytes": "4", "nbytes": 4}]
    with pytest.raises(ProtocolError, match=r"WeightsAnnounce.slots\[1\].offset_bytes: Expected `int`, got `str`"):
        decode(_envelope({"version": 1, "bucket_nbytes": [8], "slots": slots}, type_="WeightsAnnounce"))


def test_a_hostile_weight_slot_is_not_repeated():
    long_names = TensorSlot("w" * (1 << 20), [2], "x" * (1 << 20), 0, 0, 4)
    long_shape = TensorSlot("w", [2] * (1 << 16), "bfloat16", 0, 0, 4)
    for slot in (long_names, long_shape):
        with pytest.raises(ProtocolError) as caught:
            decode(encode(WeightsAnnounce(1, [8], [slot])))
        assert caught.value.reason == "bad_slots" and len(str(caught.value)) < 1000


def test_expected_type_is_enforced():
    with pytest.raises(ProtocolError, match="unexpected message type"):
        decode(encode(Control(command="stop")), Trajectory)


@pytest.mark.parametrize("command", ["pause", "resume", "set_turn_cap"])
def test_control_commands_nothing_handles_are_refused(command):
    with pytest.raises(ProtocolError, match="command") as caught:
        decode(_envelope({"command": command, "generation": None, "members": None}, type_="Control"))
    assert caught.value.reason == "bad_field"


def test_encode_refuses_non_messages():
    with pytest.raises(ProtocolError):
        encode({"type": "Trajectory"})


def test_purpose_travels_from_lease_to_trajectory_and_defaults_to_train():
    lease = TaskLease("e0-r0", "e0", "keydoor-v0", "10000", 7, 2, 3, 1024, 2, 1.5e9, purpose="eval")
    assert decode(encode(lease), TaskLease).purpose == "eval"
    assert TaskLease("l", "g", "keydoor-v0", "1", 7, 4, 3, 1024, 2, 1.5e9).purpose == "train"
    assert make_trajectory().purpose == "train"
    evaluated = decode(encode(dataclasses.replace(make_trajectory(), purpose="eval")), Trajectory)
    assert evaluated.purpose == "eval"


def test_a_field_with_a_default_may_be_absent_for_older_senders():
    body = msgpack.unpackb(encode(make_trajectory()))["body"]
    del body["purpose"], body["env_info"]
    decoded = decode(_envelope(body))
    assert decoded.purpose == "train" and decoded.env_info == {}
