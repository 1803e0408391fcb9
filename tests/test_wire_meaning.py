"""Messages that decode as types but mean nothing valid are rejected with a reason to count by.

Each case is one way a peer (a buggy or hostile actor, a corrupted recording) can send a message
whose fields are well typed: before these checks several of them crashed the learner or stopped
the head's ingest thread (``learner/batching.py`` indexing with a mask of another length, a
shape whose product wraps to 0 in int64)."""

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
    WeightsAnnounce,
    decode,
    encode,
)
from tests.test_protocol import make_trajectory


def reason_of(data: bytes) -> str:
    with pytest.raises(ProtocolError) as caught:
        decode(data)
    return caught.value.reason


def rebuilt(message, **changes) -> bytes:
    """``message`` with fields replaced, encoded without running any check (as a peer could)."""
    envelope = msgpack.unpackb(encode(message))
    envelope["body"].update({k: protocol._to_wire(v) for k, v in changes.items()})
    return msgpack.packb(envelope)


def test_a_shape_whose_product_wraps_int64_is_rejected_not_reshaped():
    body = {"dtype": "<i4", "shape": [2**32, 2**32], "data": b""}
    assert reason_of(rebuilt(make_trajectory(), token_ids=body)) == "bad_array"
    huge = {"dtype": "<i4", "shape": [2**63, 2], "data": b""}
    assert reason_of(rebuilt(make_trajectory(), turn_spans=huge)) == "bad_array"


@pytest.mark.parametrize("changes, reason", [
    ({"loss_mask": np.ones(19, np.uint8)}, "inconsistent_arrays"),  # the learner's IndexError
    ({"behavior_logprobs": np.zeros(3, np.float32)}, "inconsistent_arrays"),
    ({"token_ids": np.full(7, -5, np.int32)}, "bad_token_ids"),
    ({"behavior_logprobs": np.full(7, np.nan, np.float32)}, "bad_logprobs"),
    ({"behavior_logprobs": np.full(7, 0.5, np.float32)}, "bad_logprobs"),
    ({"token_versions": np.full(7, -1, np.int32)}, "bad_versions"),
    ({"turn_spans": np.array([[6, 7], [2, 4]], np.int32)}, "bad_turn_spans"),  # out of order
    ({"turn_spans": np.array([[2, 4], [6, 9]], np.int32)}, "bad_turn_spans"),  # past the tokens
    ({"turn_spans": np.array([[2, 4], [5, 7]], np.int32)}, "bad_turn_spans"),  # over an env token
    ({"turn_spans": np.array([2, 4, 6, 7], np.int32)}, "bad_turn_spans"),  # not [n, 2]
    ({"num_turns": 4}, "bad_turn_spans"),  # 4 env turns, 2 replies
    ({"turn_rewards": np.zeros(5, np.float32)}, "inconsistent_arrays"),
    ({"turn_action_parsed": np.array([1, 7], np.uint8)}, "out_of_range"),
    ({"turn_action_accepted": np.array([1, 7], np.uint8)}, "out_of_range"),
    ({"reward": 3.0}, "out_of_range"),
    ({"reward": float("nan")}, "out_of_range"),
    ({"episode_index": 4}, "out_of_range"),  # group of 4: indices 0..3
    ({"num_turns": 9}, "out_of_range"),  # past its turn cap
    ({"finish_reason": "bored"}, "bad_field"),
    ({"status": "env_error"}, "inconsistent_outcome"),  # with finish_reason "terminated"
    ({"terminated": False}, "inconsistent_outcome"),
    ({"lease_id": ""}, "empty_text"),
])
def test_a_trajectory_that_contradicts_itself_is_rejected_with_its_reason(changes, reason):
    assert reason_of(rebuilt(make_trajectory(), **changes)) == reason


@pytest.mark.parametrize("field", ["status", "finish_reason", "terminated", "truncated", "reward", "success"])
def test_outcome_fields_are_required(field):
    envelope = msgpack.unpackb(encode(make_trajectory()))
    del envelope["body"][field]
    with pytest.raises(ProtocolError, match="missing fields"):
        decode(msgpack.packb(envelope))


def test_a_failed_episode_says_so_in_both_status_and_finish_reason():
    failed = dataclasses.replace(make_trajectory(), status="timeout", finish_reason="deadline", success=False,
                                 terminated=False, truncated=False)
    assert decode(encode(failed)).finish_reason == "deadline"
    crashed = dataclasses.replace(failed, status="actor_error", finish_reason="actor_error")
    assert decode(encode(crashed)).status == "actor_error"
    assert reason_of(encode(dataclasses.replace(failed, status="engine_error"))) == "inconsistent_outcome"


def test_msgpack_extension_types_are_refused():
    envelope = msgpack.unpackb(encode(make_trajectory()))
    envelope["body"]["env_info"] = {"when": msgpack.ExtType(5, b"xx")}
    assert reason_of(msgpack.packb(envelope)) == "not_msgpack"


LEASE = TaskLease("l", "g", "keydoor-v0", "1", 7, 4, 3, 1024, 2, 1.5e9)
ANNOUNCE = WeightsAnnounce(3, [128], [TensorSlot("w", [2, 3], "bfloat16", 0, 0, 12)])


@pytest.mark.parametrize("message, changes, reason", [
    (LeaseRequest(actor_id=0, max_leases=2), {"max_leases": 0}, "out_of_range"),
    (LeaseRequest(actor_id=0, max_leases=2), {"actor_id": -1}, "out_of_range"),
    (LEASE, {"group_size": 0}, "out_of_range"),
    (LEASE, {"deadline_unix_s": float("inf")}, "out_of_range"),
    (LEASE, {"env_id": ""}, "empty_text"),
    (ANNOUNCE, {"slots": [TensorSlot("w", [2, 3], "object", 0, 0, 12)]}, "bad_slots"),  # getattr(torch, ...)
    (ANNOUNCE, {"slots": [TensorSlot("w", [2, 3], "bfloat16", 0, 120, 12)]}, "bad_slots"),  # past the bucket
    (ANNOUNCE, {"slots": [TensorSlot("w", [2, 3], "bfloat16", 1, 0, 12)]}, "bad_slots"),  # no bucket 1
    (ANNOUNCE, {"slots": [TensorSlot("w", [2, 3], "bfloat16", 0, 0, 10)]}, "bad_slots"),  # size disagrees
    (Control(command="regroup", generation=3, members=[0, 2]), {"generation": -1}, "out_of_range"),
    (Control(command="regroup", generation=3, members=[0, 2]), {"members": [0, -2]}, "out_of_range"),
    (Control(command="regroup", generation=3, members=[0, 2]), {"members": [2, 2]}, "bad_regroup"),
    (Control(command="regroup", generation=3, members=[0, 2]), {"generation": None}, "bad_regroup"),
    (GroupJoin(actor_id=2, weight_version=7, generation_seen=3), {"weight_version": -3}, "out_of_range"),
    (GroupJoin(actor_id=2, weight_version=7, generation_seen=3), {"generation_seen": -1}, "out_of_range"),
    (ActorStats(0, 3, 2, 10, 1, 55.5, 0.7, {"env_error": 1}), {"tokens_per_s": -1.0}, "out_of_range"),
    (ActorStats(0, 3, 2, 10, 1, 55.5, 0.7, {"env_error": 1}), {"errors": {"x": -4}}, "out_of_range"),
])
def test_every_message_type_checks_its_meaning(message, changes, reason):
    assert decode(encode(message)) == message  # valid as it is
    assert reason_of(rebuilt(message, **changes)) == reason
