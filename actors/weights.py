"""The actor's control thread: weight-group membership, weight reception, control commands.

Collectives block, so they live here, off the event loop:
1. at start (and whenever it is out of a group) the actor sends ``GroupJoin`` to the head, with the
   newest generation it has heard announced (a request sent just before a regroup naming it is
   then known to the head as stale);
2. ``Control(regroup)`` naming it: join that generation's group (bounded by the deadline);
3. ``WeightsAnnounce`` of its generation: the engine's ``WeightGroupMember`` takes part in the
   broadcast (``actors/weight_member.py``: received here and staged in the CPU engine, or received
   inside vLLM's workers); a version already staged or served (the learner resends the current one
   while a join is pending) is received, ignored and counted;
4. any failure (a dead peer, a missed deadline) drops it out of the group: back to 1.
Other ``Control`` messages are handed to ``on_control``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import zmq

from actors.engine_api import InferenceEngine
from common import protocol
from common.protocol import Control, GroupJoin, WeightsAnnounce
from common.transport import Inbox, configure, connect
from common.weight_sync import BroadcastFailed

log = logging.getLogger(__name__)


class ControlThread(threading.Thread):
    def __init__(self, engine: InferenceEngine, actor_id: int, addresses: dict[str, str], timeout_s: float,
                 on_control: Callable[[Control], None], join_retry_s: float = 2.0):
        super().__init__(name="actor-control", daemon=True)
        self.engine, self.actor_id, self.on_control = engine, actor_id, on_control
        self.versions_applied: list[int] = []  # staged, in order (the engine applies the newest)
        self.failures = 0
        self.resends_ignored = 0
        ctx = zmq.Context.instance()
        self._sub = configure(ctx.socket(zmq.SUB))
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        connect(self._sub, addresses["control"])
        self._push = configure(ctx.socket(zmq.PUSH))  # its own socket: zmq sockets are per thread
        connect(self._push, addresses["trajectories"])
        # The learner names the device: NCCL into GPU memory next to vLLM, gloo into CPU memory.
        self._member = engine.weight_group_member(addresses["weights"], timeout_s,
                                                  addresses.get("weights_device", "cpu"))
        self._inbox = Inbox("actor-control")
        self._join_retry_s = join_retry_s
        self._last_join = 0.0
        self._generation_seen = 0  # the newest regroup heard, named or not
        self._stopping = threading.Event()  # not ``_stop``: that name is threading.Thread's own method
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self._stopping.is_set():
                if self._member.generation is None and time.monotonic() - self._last_join > self._join_retry_s:
                    self._ask_to_join()
                if self._sub.poll(100):
                    self._handle(self._sub.recv())
        except BaseException as exc:  # surfaced by the actor loop, which then fails loudly
            self.error = exc
            log.exception("control thread failed")
            self.on_control(Control(command="stop"))
        finally:
            self._sub.close()
            self._push.close()

    def _ask_to_join(self) -> None:
        join = GroupJoin(actor_id=self.actor_id, weight_version=self.engine.version,
                         generation_seen=self._generation_seen)
        self._push.send(protocol.encode(join))
        self._last_join = time.monotonic()

    def _handle(self, frame: bytes) -> None:
        message = self._inbox.parse(frame, (WeightsAnnounce, Control))
        if isinstance(message, WeightsAnnounce):
            if message.generation == self._member.generation:
                self._receive(message)
        elif isinstance(message, Control) and message.command == "regroup":
            self._regroup(message)
        elif isinstance(message, Control):
            self.on_control(message)

    def _regroup(self, message: Control) -> None:
        self._generation_seen = max(self._generation_seen, message.generation or 0)
        members = message.members or []
        if self.actor_id not in members:
            self._member.leave()  # a newer generation without us: ask again
            return
        try:
            self._member.join(message.generation, members.index(self.actor_id) + 1, len(members) + 1)
            log.info("joined weight group generation %d as rank %d", message.generation,
                     members.index(self.actor_id) + 1)
        except BroadcastFailed as exc:
            self._failed(exc)

    def _receive(self, announce: WeightsAnnounce) -> None:
        try:
            taken = self._member.receive(announce)
        except BroadcastFailed as exc:
            self._failed(exc)
            return
        if not taken:
            self.resends_ignored += 1
            log.info("version %d again (serving %d): received and ignored", announce.version, self.engine.version)
            return
        self.versions_applied.append(announce.version)

    def _failed(self, exc: BroadcastFailed) -> None:
        self.failures += 1
        log.warning("out of the weight group (%s); asking to join again", exc)
        self._last_join = 0.0

    def stop(self) -> None:
        self._stopping.set()
