"""The learner head's network side: lease service and trajectory ingest on one thread.

It owns two ZeroMQ sockets so the training loop never touches them:
- ROUTER: actors send ``LeaseRequest``; a request is answered with ``TaskLease``s only when the
  sampler admits them (staleness bound), so an actor simply waits for work.
- PULL: actors push ``Trajectory`` and ``ActorStats``. Episodes are collected per lease; a lease
  whose ``group_size`` episodes all arrived completes once in the sampler and its group goes to
  the training queue, or for an eval lease to ``eval_groups``, so validation episodes never
  reach a training batch. Episodes of expired or unknown leases, or whose purpose differs from
  their lease's, are discarded and counted.

Nothing a peer sends can stop the thread: ``protocol.decode`` rejects what is malformed or
meaningless on its own (``common/wire_checks.py``), ``_on_trajectory`` rejects what contradicts
the lease or the model (a token id past the vocabulary, a version the learner has not made yet),
and any other error while handling one message drops that message and counts it. An error
outside message handling (a broken ledger) stops the thread and is raised by the next ``get``,
so the learner fails saying why instead of waiting forever.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from common import protocol
from common.protocol import ActorStats, GroupJoin, LeaseRequest, TaskLease, Trajectory
from common.recording import Recorder
from common.transport import Inbox, bind_random, channel_guard, configure
from common.wire_checks import concatenated, sampled_mask
from learner.group import Group
from learner.sampler import LedgerError, TaskSampler
from learner.service_metrics import actor_scalars

log = logging.getLogger(__name__)

_MAX_REQUEST_BYTES = 1 << 16
"""A ``LeaseRequest`` is a few dozen bytes."""
_PUSH_BATCH = 64
"""Pushed messages decoded together, and handled between two wake-ups of a consumer waiting for
groups (``_wake_consumers``)."""


class HeadServer:
    """Runs the lease/ingest loop in a background thread; the training loop reads ``groups``."""

    def __init__(self, sampler: TaskSampler, host: str = "127.0.0.1", record_dir: Path | None = None,
                 poll_ms: int = 20, vocab_size: int | None = None, max_message_bytes: int = 64 << 20):
        self.sampler = sampler
        self.vocab_size = vocab_size  # the model's embedding rows: larger token ids are rejected
        self.groups: queue.Queue[Group] = queue.Queue()
        self.eval_groups: queue.Queue[Group] = queue.Queue()  # completed eval leases, never trained on
        self.actor_stats: dict[int, ActorStats] = {}
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()  # guards sampler against set_policy from the train loop
        self._ctx = zmq.Context.instance()
        self._router = configure(self._ctx.socket(zmq.ROUTER))
        self._pull = configure(self._ctx.socket(zmq.PULL))
        # ZeroMQ drops a peer that sends more, before taking memory for it: the monitor counts it.
        self._router.setsockopt(zmq.MAXMSGSIZE, _MAX_REQUEST_BYTES)
        self._pull.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self.lease_address = bind_random(self._router, host)
        self.trajectory_address = bind_random(self._pull, host)
        self._inbox = Inbox("head")
        self._waiting: deque[tuple[bytes, int, int]] = deque()  # (identity, leases still wanted, actor id)
        self._holder: dict[str, int] = {}  # open lease id -> actor id
        self._open: dict[str, Group] = {}  # lease id -> episodes so far
        self._join_requests: dict[int, int] = {}  # actor id -> the newest generation it had heard of
        self._poll_ms = poll_ms
        self._record = _open_record(record_dir)
        self._stop = threading.Event()
        self.failure: BaseException | None = None  # what stopped the thread, raised by ``get``
        self._newest_version = 0  # the newest weights actors may hold: later versions are lies
        self._thread = threading.Thread(target=self._run, name="head-server", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._router.close()
        self._pull.close()
        if self._record is not None:
            self._record.close()

    def set_policy(self, version: int, turn_cap: int) -> None:
        with self._lock:
            self.sampler.set_version(version)
            self.sampler.set_turn_cap(turn_cap)
            self._newest_version = max(self._newest_version, version)

    def expect_version(self, version: int) -> None:
        """Weights of ``version`` are going out: episodes may carry it from now on (in sync mode
        before the sampler moves to it)."""
        with self._lock:
            self._newest_version = max(self._newest_version, version)

    def release(self, group: Group) -> None:
        """The trainer dropped this group: free its admission slot."""
        with self._lock:
            self.sampler.release(group.lease.group_id)

    def consume(self, n_groups: int) -> None:
        with self._lock:
            self.sampler.consume(n_groups)

    def schedule_eval(self, tasks: list[tuple[str, str]], group_size: int) -> list[str]:
        """Queue eval groups (``TaskSampler.schedule_eval``); they arrive on ``eval_groups``."""
        with self._lock:
            return self.sampler.schedule_eval(tasks, group_size)

    def join_requests(self) -> dict[int, int]:
        """The actors that asked to join the weight group since the last take, each with the newest
        generation it had heard announced (``GroupJoin.generation_seen``)."""
        with self._lock:
            return dict(self._join_requests)

    def take_join_requests(self) -> dict[int, int]:
        """``join_requests()``, forgotten here: the weight publisher acts on them."""
        with self._lock:
            joins, self._join_requests = self._join_requests, {}
        return joins

    def get(self, timeout_s: float) -> Group | None:
        """The next completed group, or None if none arrived within ``timeout_s``; raises
        ``HeadFailed`` once the server thread has died (no group can come any more)."""
        self.check_alive()
        try:
            return self.groups.get(timeout=timeout_s)
        except queue.Empty:
            self.check_alive()
            return None

    def check_alive(self) -> None:
        if self.failure is not None:
            raise HeadFailed(f"the head's lease and ingest thread died: {self.failure!r}") from self.failure

    @property
    def exhausted_is_final(self) -> bool:
        return False  # live actors: no group yet just means wait

    @property
    def max_policy_lag(self) -> int:
        """The staleness bound the sampler admits under; the loop masks tokens past it."""
        return self.sampler.max_policy_lag

    def scalars(self) -> dict[str, float]:
        """``async/`` scalars of the leases and ingest, and the actors' own stats."""
        ledger = self.ledger()
        return {"async/queue_groups": self.groups.qsize(), "async/leases_outstanding": ledger.get("outstanding", 0),
                "async/episodes_discarded_late": ledger.get("episodes_discarded_late", 0),
                "async/groups_abandoned": ledger.get("abandoned", 0),
                "async/rejected_messages": ledger.get("rejected_messages", 0),
                **actor_scalars(dict(self.actor_stats))}

    def state_dict(self) -> dict:
        with self._lock:
            return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            self.sampler.load_state_dict(state["sampler"])
            # The actors that held the old leases are gone with the old run: re-issue them now
            # instead of waiting out their deadlines.
            self.sampler.expire_overdue(now=float("inf"))

    def ledger(self) -> dict[str, int]:
        """Lease and episode accounting; ``ledger_broken`` names a violated invariant (empty: none)."""
        with self._lock:
            try:
                self.sampler.check_ledger(within_bound=False)
                broken = ""
            except LedgerError as exc:
                broken = str(exc)
            rejected = {f"rejected/{reason}": n for reason, n in self._inbox.rejected.items()}
            # An actor that stopped, or a peer ZeroMQ dropped for a message over max_message_bytes.
            disconnects = channel_guard().disconnects(self._pull)
            return {**self.sampler.ledger(), **self.counters, "rejected_messages": self._inbox.total_rejected,
                    **rejected, "peer_disconnects": disconnects, "ledger_broken": broken}

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # raised to the training loop by ``get``
            self.failure = exc
            log.exception("the head's lease and ingest thread died")

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._pull, zmq.POLLIN)
        next_expiry_s = 0.0
        while not self._stop.is_set():
            ready = dict(poller.poll(self._poll_ms))
            if self._router in ready:
                self._drain_requests()
            if self._pull in ready:
                self._drain_pushes()
            with self._lock:
                # Once a poll interval, not once a message: the sampler looks at every open lease.
                if time.monotonic() >= next_expiry_s:
                    next_expiry_s = time.monotonic() + self._poll_ms / 1000
                    if self.sampler.expire_overdue():
                        self._drop_expired_partials()
                self._grant_waiting()

    def _drain_requests(self) -> None:
        """Hand each lease request waiting on the ROUTER socket to ``_on_request``."""
        for _ in range(1000):  # bounded so one busy socket cannot starve the other
            try:
                frames = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            self._handle_one(self._on_request, frames)

    def _handle_one(self, handler, *message) -> None:
        try:
            handler(*message)
        except Exception as exc:  # a bug one message exposed must not end ingest for everyone
            self._inbox.reject(f"handler_error/{type(exc).__name__}", repr(exc))
            log.exception("the head failed handling one message; dropped it")

    def _drain_pushes(self) -> None:
        """Take what actors pushed, ``_PUSH_BATCH`` messages at a time, decoded together (short
        episodes share their array checks, ``protocol.decode_many``), then handled one by one.
        In place: decoding keeps a 30k-token episode's 0.4 MB where ZeroMQ received it."""
        for _ in range(1000 // _PUSH_BATCH):  # bounded so one busy socket cannot starve the other
            batch = []
            for _ in range(_PUSH_BATCH):
                try:
                    batch.append(_receive_in_place(self._pull))
                except zmq.Again:
                    break
            self._on_pushes(batch)
            self._wake_consumers()
            if len(batch) < _PUSH_BATCH:
                break

    def _on_pushes(self, batch: list[list[memoryview]]) -> None:
        """Messages pushed by actors, each a list of frames (one is a message; more are rejected)."""
        single = [frames[0] for frames in batch if len(frames) == 1]
        if len(single) < len(batch):
            self._inbox.rejected["bad_frames"] += len(batch) - len(single)
        try:
            messages = self._inbox.parse_many(single, (Trajectory, ActorStats, GroupJoin))
            model_checked = self._within_the_model([m for m in messages if type(m) is Trajectory])
        except Exception as exc:  # a bug in decoding: drop and count these messages, go on with the next
            for _ in single:
                self._inbox.reject(f"handler_error/{type(exc).__name__}", repr(exc))
            log.exception("the head failed decoding %d messages; dropped them", len(single))
            return
        for frame, message in zip(single, messages):
            self._handle_one(self._on_message, frame, message, model_checked)

    def _wake_consumers(self) -> None:
        """Wake whoever waits for a group, once a drained batch rather than once a group: a thread
        woken takes this one's core for a while (~20 us an episode of 1k tokens on 2 busy cores)."""
        for groups in (self.groups, self.eval_groups):
            with groups.not_empty:
                if groups.queue:
                    groups.not_empty.notify_all()

    def _on_request(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            self._inbox.rejected["bad_frames"] += 1
            return
        request = self._inbox.parse(frames[1], LeaseRequest)
        if request is not None and request.max_leases > 0:
            with self._lock:
                self._waiting.append((frames[0], request.max_leases, request.actor_id))

    def _grant_waiting(self) -> None:
        while self._waiting:
            identity, wanted, actor_id = self._waiting[0]
            lease = self.sampler.issue()
            if lease is None:
                return
            self._open[lease.lease_id] = Group(lease)
            self._holder[lease.lease_id] = actor_id
            self._router.send_multipart([identity, protocol.encode(lease)])
            if wanted > 1:
                self._waiting[0] = (identity, wanted - 1, actor_id)
            else:
                self._waiting.popleft()

    def actor_lost(self, actor_id: int) -> int:
        """An actor died: re-issue its leases now, drop its unanswered requests; returns how many."""
        with self._lock:
            self._waiting = deque(w for w in self._waiting if w[2] != actor_id)
            lost = [lease_id for lease_id, holder in self._holder.items() if holder == actor_id]
            for lease_id in lost:
                self.counters["episodes_discarded_late"] += len(self._open.pop(lease_id).episodes)
                del self._holder[lease_id]
            self.counters["leases_reissued_actor_lost"] += self.sampler.expire(lost)
            return len(lost)

    def _on_message(self, frame: memoryview, message: Any | None, model_checked: bool) -> None:
        """``message``: decoded from ``frame`` (None: rejected); ``model_checked``: if it is an
        episode, its token ids and versions fit the model (``_within_the_model``)."""
        if isinstance(message, Trajectory):
            with self._lock:
                if self._on_trajectory(message, model_checked) and self._record is not None:
                    self._record.write(frame)  # the stream as received, replayable into the learner
        elif isinstance(message, ActorStats):
            self.actor_stats[message.actor_id] = message
        elif isinstance(message, GroupJoin):
            with self._lock:
                seen = self._join_requests.get(message.actor_id, 0)
                self._join_requests[message.actor_id] = max(seen, message.generation_seen)

    def _on_trajectory(self, episode: Trajectory, model_checked: bool = False) -> bool:
        """Take one episode; False if it was rejected (and so is not recorded either)."""
        group = self._open.get(episode.lease_id)
        if group is None:
            self.counters["episodes_discarded_late"] += 1
            return True
        contradiction = self._contradiction(episode, group.lease, model_checked)
        if contradiction is not None:
            self._inbox.reject(contradiction, f"episode {episode.episode_index} of lease {episode.lease_id}")
            return False
        if any(e.episode_index == episode.episode_index for e in group.episodes):
            self.counters["episodes_discarded_duplicate"] += 1
            return True
        if episode.purpose != group.lease.purpose:  # the lease decides what may be trained on
            self.counters["episodes_discarded_purpose"] += 1
            return True
        group.episodes.append(episode)
        if len(group.episodes) == group.lease.group_size:
            del self._open[episode.lease_id]
            self._holder.pop(episode.lease_id, None)
            if self.sampler.complete(episode.lease_id):
                group.completed_at = time.time()
                _put_quietly(self.eval_groups if group.lease.purpose == "eval" else self.groups, group)
            else:
                self.counters["groups_discarded_late"] += 1
        return True

    def _within_the_model(self, episodes: list[Trajectory]) -> bool:
        """True only when these episodes, all short (``protocol.screened_together``), hold no token
        id past the vocabulary and no version newer than the learner's (what ``_model_contradiction``
        finds), by one pass over all of them: it stays true as the learner's version grows."""
        if len(episodes) < 2 or not all(map(protocol.screened_together, episodes)):
            return False
        ids = concatenated([e.token_ids for e in episodes], "head_token_ids")
        versions = concatenated([e.token_versions for e in episodes], "head_token_versions")
        # initial=-1: episodes that failed before their opening fitted carry no tokens, and are within it.
        return (self.vocab_size is None or np.maximum.reduce(ids, initial=-1) < self.vocab_size) and \
            np.maximum.reduce(versions, initial=-1) <= self._newest_version

    def _contradiction(self, episode: Trajectory, lease: TaskLease, model_checked: bool = False) -> str | None:
        """Why this episode cannot answer this lease or train this model (a rejection reason), or
        None. The episode already passed every check it can pass alone (``wire_checks``);
        ``model_checked``: and ``_within_the_model``."""
        if (episode.group_id, episode.env_id, episode.task_id, episode.group_size, episode.turn_cap) != \
                (lease.group_id, lease.env_id, lease.task_id, lease.group_size, lease.turn_cap):
            return "not_the_lease"
        if len(episode.token_ids) > lease.max_episode_tokens:
            return "over_token_budget"
        return None if model_checked else self._model_contradiction(episode)

    def _model_contradiction(self, episode: Trajectory) -> str | None:
        """``bad_token_ids`` or ``version_from_the_future``, or None."""
        # The ufuncs' own reductions (``ndarray.max`` goes through Python first), without temporaries:
        # this runs on every episode, 1k to 30k tokens long.
        ids = episode.token_ids
        if self.vocab_size is not None and len(ids) and np.maximum.reduce(ids) >= self.vocab_size:
            return "bad_token_ids"
        # The unmasked max bounds the sampled tokens' (one pass, no branch per token); only when it is
        # too new do the sampled tokens alone decide.
        versions = episode.token_versions
        if len(versions) and np.maximum.reduce(versions) > self._newest_version and \
                np.maximum.reduce(versions, where=sampled_mask(episode), initial=-1) > self._newest_version:
            return "version_from_the_future"
        return None

    def _drop_expired_partials(self) -> None:
        now = time.time()
        for lease_id in [k for k, g in self._open.items() if g.lease.deadline_unix_s < now]:
            self.counters["episodes_discarded_late"] += len(self._open.pop(lease_id).episodes)
            self._holder.pop(lease_id, None)


def _put_quietly(groups: queue.Queue[Group], group: Group) -> None:
    """``groups.put(group)`` without waking a ``get`` waiting for it: ``HeadServer._wake_consumers``
    does, after each drained batch (``get_nowait`` and a ``get`` that finds it there see it at once)."""
    with groups.mutex:
        groups.queue.append(group)
        groups.unfinished_tasks += 1


def _receive_in_place(sock: zmq.Socket) -> list[memoryview]:
    """The frames of the next message as memoryviews of ZeroMQ's buffers (``zmq.Again`` if none).
    Not ``recv_multipart(copy=False)``: it asks the socket whether more frames follow (a
    getsockopt, 3 us) where the frame itself knows."""
    frames = [sock.recv(zmq.NOBLOCK, copy=False)]
    while frames[-1].more:  # the parts of a message arrive together
        frames.append(sock.recv(zmq.NOBLOCK, copy=False))
    return [frame.buffer for frame in frames]


class HeadFailed(RuntimeError):
    """The head's thread died: the run cannot get more groups and must fail, saying why."""


def _open_record(record_dir: Path | None) -> Recorder | None:
    return None if record_dir is None else Recorder(record_dir / "trajectories.msgpack")
