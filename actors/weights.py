"""The actor's control thread: subscribes to the head's PUB channel and receives weights.

It joins the weight-broadcast group (a blocking collective, so it lives off the event loop),
then for every ``WeightsAnnounce`` receives the buckets and stages them in the engine, which
applies them between two decode steps. ``Control`` messages are handed to ``on_control``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import zmq

from actors.engine import CpuEngine
from common.protocol import Control, WeightsAnnounce
from common.transport import Inbox, configure
from common.weight_sync import WeightReceiver

log = logging.getLogger(__name__)


class ControlThread(threading.Thread):
    def __init__(self, engine: CpuEngine, control_address: str, weights_address: str, rank: int,
                 world_size: int, timeout_s: float, on_control: Callable[[Control], None]):
        super().__init__(name="actor-control", daemon=True)
        self.engine, self.on_control = engine, on_control
        self.versions_applied: list[int] = []
        self._sub = configure(zmq.Context.instance().socket(zmq.SUB))
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.connect(control_address)  # before joining, so no announce is missed
        self._receiver = WeightReceiver(weights_address, rank, world_size, timeout_s)
        self._inbox = Inbox("actor-control")
        self._stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._receiver.connect()
            log.info("joined the weight-broadcast group as rank %d", self._receiver.rank)
            while not self._stop.is_set():
                if self._sub.poll(100):
                    self._handle(self._sub.recv())
        except BaseException as exc:  # surfaced by the actor loop, which then fails loudly
            self.error = exc
            log.exception("control thread failed")
            self.on_control(Control(command="stop"))
        finally:
            self._sub.close()

    def _handle(self, frame: bytes) -> None:
        message = self._inbox.parse(frame, (WeightsAnnounce, Control))
        if isinstance(message, WeightsAnnounce):
            tensors = self._receiver.receive(message)
            self.engine.stage_weights(tensors, message.version)
            self.versions_applied.append(message.version)
        elif isinstance(message, Control):
            self.on_control(message)

    def stop(self) -> None:
        self._stop.set()
