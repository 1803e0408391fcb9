"""A hostile peer for live runs: garbage, inconsistent and oversized frames at the head's sockets.

``attack(run_dir)`` waits for a starting run's ``endpoints.json`` and then, while the run trains,
sends what a buggy or hostile actor could: random bytes, frames that decode as types but whose
arrays disagree or whose shape wraps int64, an episode that contradicts the lease it names, and a
frame over ``learner.max_message_mb``. To do that it takes one real lease like an actor, and it
returns that lease like an actor whose env failed, so nothing it held is lost. The smoke run
(``tests/conftest.py``) runs under this attack; ``tests/test_smoke.py`` checks it finished and
counted every rejection.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import zmq

from common import protocol
from common.protocol import LeaseRequest, TaskLease, Trajectory

HOSTILE_ACTOR_ID = 999
GARBAGE_FRAMES = 300
OVERSIZED_BYTES = 2 << 20  # over the smoke run's ``learner.max_message_mb`` of 1


class Attack(threading.Thread):
    """``attack`` in the background; ``finish`` re-raises whatever stopped it."""

    def __init__(self, run_dir: Path, timeout_s: float = 120.0):
        super().__init__(name="hostile-peer", daemon=True)
        self.run_dir, self.timeout_s, self.error = run_dir, timeout_s, None

    def run(self) -> None:
        try:
            attack(self.run_dir, self.timeout_s)
        except BaseException as exc:
            self.error = exc

    def finish(self) -> None:
        self.join(timeout=self.timeout_s)
        assert not self.is_alive(), "the hostile peer is still running"
        if self.error is not None:
            raise self.error


def attack(run_dir: Path, timeout_s: float = 120.0) -> None:
    endpoints = _wait_for_endpoints(run_dir / "endpoints.json", timeout_s)
    ctx = zmq.Context.instance()
    push, dealer = ctx.socket(zmq.PUSH), ctx.socket(zmq.DEALER)
    for sock in (push, dealer):
        sock.setsockopt(zmq.LINGER, 2000)
    push.connect(endpoints["trajectories"])
    dealer.connect(endpoints["lease"])
    try:
        rng = np.random.default_rng(0)
        for _ in range(GARBAGE_FRAMES):
            push.send(rng.bytes(int(rng.integers(0, 200))))
            dealer.send(rng.bytes(int(rng.integers(0, 50))))
        lease = _take_lease(dealer)
        for frame in _lying_episodes(lease):
            push.send(frame)
        for index in range(lease.group_size):  # give the lease back: an actor whose env failed
            push.send(protocol.encode(_failed_episode(lease, index)))
        time.sleep(0.5)  # let those land on this connection before it is dropped
        push.send(b"\x00" * OVERSIZED_BYTES)
    finally:
        push.close()
        dealer.close()


def _wait_for_endpoints(path: Path, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)
    time.sleep(0.1)  # written in one call, but give the writer a moment to finish
    return json.loads(path.read_text())


def _take_lease(dealer: zmq.Socket) -> TaskLease:
    dealer.send(protocol.encode(LeaseRequest(actor_id=HOSTILE_ACTOR_ID, max_leases=1)))
    while True:  # the head answers garbage with nothing, so the first answer is the lease
        if not dealer.poll(60_000):
            raise TimeoutError("the head granted the hostile peer no lease")
        return protocol.decode(dealer.recv(), TaskLease)


def _failed_episode(lease: TaskLease, index: int) -> Trajectory:
    tokens = np.array([1, 2, 3, 4], np.int32)
    return Trajectory(
        lease_id=lease.lease_id, group_id=lease.group_id, env_id=lease.env_id, task_id=lease.task_id,
        actor_id=HOSTILE_ACTOR_ID,
        episode_index=index, group_size=lease.group_size, token_ids=tokens, loss_mask=np.zeros(4, np.uint8),
        behavior_logprobs=np.zeros(4, np.float32), token_versions=np.full(4, -1, np.int32),
        turn_spans=np.zeros((0, 2), np.int32), reward=0.0, success=False, terminated=False, truncated=False,
        finish_reason="env_error", status="env_error", error="hostile peer: no env", turn_cap=lease.turn_cap,
        purpose=lease.purpose)


def _lying_episodes(lease: TaskLease) -> list[bytes]:
    """Frames for ``lease`` that must each be rejected, and never reach a batch."""
    honest = dataclasses.replace(_failed_episode(lease, 0), status="ok", finish_reason="turn_cap", truncated=True)
    body = msgpack.unpackb(protocol.encode(honest))

    def with_body(**changes) -> bytes:
        return msgpack.packb({**body, "body": {**body["body"], **changes}})

    def array(dtype: str, shape: list[int], data: bytes) -> dict:
        return {"dtype": dtype, "shape": shape, "data": data}

    return [
        with_body(loss_mask=array("|u1", [19], b"\x01" * 19)),  # 19 mask entries for 4 tokens
        with_body(token_ids=array("<i4", [2**32, 2**32], b"")),  # wraps to 0 elements in int64
        with_body(behavior_logprobs=array("<f4", [4], np.full(4, np.nan, np.float32).tobytes())),
        protocol.encode(dataclasses.replace(honest, task_id=lease.task_id + "-not")),  # not this lease's task
    ]
