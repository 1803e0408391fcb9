"""The learner head's network side: lease service and trajectory ingest on one thread.

It owns two ZeroMQ sockets so the training loop never touches them:
- ROUTER: actors send ``LeaseRequest``; a request is answered with ``TaskLease``s only when the
  sampler admits them (staleness bound), so an actor simply waits for work.
- PULL: actors push ``Trajectory`` and ``ActorStats``. Episodes are collected per lease; a lease
  whose ``group_size`` episodes all arrived completes once in the sampler and its group goes to
  the training queue. Episodes of expired or unknown leases are discarded and counted.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import zmq

from common import protocol
from common.protocol import ActorStats, LeaseRequest, TaskLease, Trajectory
from common.transport import Inbox, bind_random, configure
from learner.sampler import TaskSampler

log = logging.getLogger(__name__)


@dataclass
class Group:
    """All episodes of one completed lease (one GRPO group)."""

    lease: TaskLease
    episodes: list[Trajectory] = field(default_factory=list)
    completed_at: float = 0.0


class HeadServer:
    """Runs the lease/ingest loop in a background thread; the training loop reads ``groups``."""

    def __init__(self, sampler: TaskSampler, host: str = "127.0.0.1", record_dir: Path | None = None,
                 poll_ms: int = 20):
        self.sampler = sampler
        self.groups: queue.Queue[Group] = queue.Queue()
        self.actor_stats: dict[int, ActorStats] = {}
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()  # guards sampler against set_policy from the train loop
        self._ctx = zmq.Context.instance()
        self._router = configure(self._ctx.socket(zmq.ROUTER))
        self._pull = configure(self._ctx.socket(zmq.PULL))
        self.lease_address = bind_random(self._router, host)
        self.trajectory_address = bind_random(self._pull, host)
        self._inbox = Inbox("head")
        self._waiting: deque[tuple[bytes, int]] = deque()  # (actor identity, leases still wanted)
        self._open: dict[str, Group] = {}  # lease id -> episodes so far
        self._poll_ms = poll_ms
        self._record = _open_record(record_dir)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="head-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._router.close()
        self._pull.close()
        if self._record is not None:
            self._record.close()

    def set_policy(self, version: int, turn_cap: int) -> None:
        with self._lock:
            self.sampler.set_version(version)
            self.sampler.set_turn_cap(turn_cap)

    def release(self, group: Group) -> None:
        """The trainer dropped this group: free its admission slot."""
        with self._lock:
            self.sampler.release(group.lease.group_id)

    def consume(self, n_groups: int) -> None:
        with self._lock:
            self.sampler.consume(n_groups)

    def ledger(self) -> dict[str, int]:
        with self._lock:
            return {**self.sampler.ledger(), **self.counters, "rejected_messages": self._inbox.total_rejected}

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(self._poll_ms))
            if self._router in ready:
                self._drain(self._router, self._on_request)
            if self._pull in ready:
                self._drain(self._pull, self._on_push)
            with self._lock:
                if self.sampler.expire_overdue():
                    self._drop_expired_partials()
                self._grant_waiting()

    def _drain(self, sock: zmq.Socket, handler) -> None:
        for _ in range(1000):  # bounded so one busy socket cannot starve the other
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            handler(frames)

    def _on_request(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            self._inbox.rejected["bad_frames"] += 1
            return
        request = self._inbox.parse(frames[1], LeaseRequest)
        if request is not None and request.max_leases > 0:
            self._waiting.append((frames[0], request.max_leases))

    def _grant_waiting(self) -> None:
        while self._waiting:
            identity, wanted = self._waiting[0]
            lease = self.sampler.issue()
            if lease is None:
                return
            self._open[lease.lease_id] = Group(lease)
            self._router.send_multipart([identity, protocol.encode(lease)])
            if wanted > 1:
                self._waiting[0] = (identity, wanted - 1)
            else:
                self._waiting.popleft()

    def _on_push(self, frames: list[bytes]) -> None:
        if len(frames) != 1:
            self._inbox.rejected["bad_frames"] += 1
            return
        message = self._inbox.parse(frames[0], (Trajectory, ActorStats))
        if isinstance(message, ActorStats):
            self.actor_stats[message.actor_id] = message
        elif isinstance(message, Trajectory):
            if self._record is not None:
                self._record.write(frames[0])  # the stream as received, replayable into the learner
            with self._lock:
                self._on_trajectory(message)

    def _on_trajectory(self, episode: Trajectory) -> None:
        group = self._open.get(episode.lease_id)
        if group is None:
            self.counters["episodes_discarded_late"] += 1
            return
        if any(e.episode_index == episode.episode_index for e in group.episodes):
            self.counters["episodes_discarded_duplicate"] += 1
            return
        group.episodes.append(episode)
        if len(group.episodes) == group.lease.group_size:
            del self._open[episode.lease_id]
            if self.sampler.complete(episode.lease_id):
                group.completed_at = time.time()
                self.groups.put(group)
            else:
                self.counters["groups_discarded_late"] += 1

    def _drop_expired_partials(self) -> None:
        now = time.time()
        for lease_id in [k for k, g in self._open.items() if g.lease.deadline_unix_s < now]:
            self.counters["episodes_discarded_late"] += len(self._open.pop(lease_id).episodes)


def _open_record(record_dir: Path | None) -> BinaryIO | None:
    if record_dir is None:
        return None
    record_dir.mkdir(parents=True, exist_ok=True)
    return open(record_dir / "trajectories.msgpack", "ab", buffering=1 << 16)
