"""The actor's control thread and the learner's weight publisher over real parts: ZeroMQ PUB/PUSH,
gloo weight groups, the CPU engine over a tiny random Qwen2, and a real actor process killed."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import zmq
from transformers import Qwen2ForCausalLM

from actors.cpu_engine import CpuEngine
from actors.weights import ControlThread
from common import protocol
from common.protocol import Control, GroupJoin
from common.tiny_model import load_tiny_tokenizer, tiny_qwen2_config
from common.transport import bind_random, configure
from common.weight_sync import WeightBroadcaster
from learner.weight_publisher import WeightPublisher

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 20.0
"""Bound on every wait below, so a broken build fails instead of hanging."""

WIDE = {"hidden_size": 384, "intermediate_size": 1536}
"""A wider tiny Qwen2 (~45 MB of float32 weights): more than loopback socket buffers hold, so a
member that stops reading holds the sender up."""

ACTOR_PROCESS = """
import json, sys, time
import torch
from transformers import Qwen2ForCausalLM
from actors.cpu_engine import CpuEngine
from actors.weights import ControlThread
from common.tiny_model import load_tiny_tokenizer, tiny_qwen2_config
actor_id, control, trajectories, weights = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
config = tiny_qwen2_config(load_tiny_tokenizer())
for key, value in json.loads(sys.argv[5]).items():
    setattr(config, key, value)
torch.manual_seed(0)
engine = CpuEngine(Qwen2ForCausalLM(config).eval())
engine.start()
thread = ControlThread(engine, actor_id, {"control": control, "trajectories": trajectories, "weights": weights},
                       5.0, lambda message: print("control", message.command, flush=True), join_retry_s=0.2)
thread.start()
served = engine.version
while True:  # the test kills this process
    if engine.version != served:
        served = engine.version
        print("serving", served, flush=True)
    time.sleep(0.02)
"""


def tiny_model(seed: int, **config_changes) -> Qwen2ForCausalLM:
    config = tiny_qwen2_config(load_tiny_tokenizer())
    for key, value in config_changes.items():
        setattr(config, key, value)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(config).eval()


def tiny_weights(seed: int, **config_changes) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in tiny_model(seed, **config_changes).named_parameters()}


def tiny_engine(**config_changes) -> CpuEngine:
    return CpuEngine(tiny_model(0, **config_changes))


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class Head:
    """The learner head's sockets the control thread talks to: PUB (control, announces) and PULL
    (``GroupJoin``, collected as ``HeadServer`` does), plus the weight broadcaster."""

    def __init__(self, broadcast_timeout_s: float = 5.0, bucket_nbytes: int = 1 << 20):
        ctx = zmq.Context.instance()
        self.pub = configure(ctx.socket(zmq.PUB))
        self.pull = configure(ctx.socket(zmq.PULL))
        self.addresses = {"control": bind_random(self.pub, "127.0.0.1"),
                          "trajectories": bind_random(self.pull, "127.0.0.1")}
        self.broadcaster = WeightBroadcaster("127.0.0.1", bucket_nbytes=bucket_nbytes, timeout_s=broadcast_timeout_s)
        self.addresses["weights"] = self.broadcaster.address
        self.join_requests: dict[int, int] = {}  # actor id -> the newest generation it had heard of

    def take_join_requests(self) -> dict[int, int]:
        self._drain()
        joins, self.join_requests = self.join_requests, {}
        return joins

    def wait_for_joins(self, actor_ids: set[int], timeout_s: float = TIMEOUT_S) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._drain()
            if actor_ids <= self.join_requests.keys():
                return True
            time.sleep(0.02)
        return False

    def _drain(self) -> None:
        while self.pull.poll(0):
            message = protocol.decode(self.pull.recv(), (GroupJoin,))
            seen = self.join_requests.get(message.actor_id, 0)
            self.join_requests[message.actor_id] = max(seen, message.generation_seen)

    def publish(self, message) -> None:
        self.pub.send(protocol.encode(message))

    def close(self) -> None:
        self.pub.close()
        self.pull.close()


class ActorProcess:
    """A real actor control thread with its own CPU engine in a process of its own, so it can die
    as a process dies (SIGKILL); what it prints is read line by line in the background."""

    def __init__(self, actor_id: int, head: Head, config_changes: dict):
        env = {**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"}
        self.proc = subprocess.Popen([sys.executable, "-c", ACTOR_PROCESS, str(actor_id), head.addresses["control"],
                                      head.addresses["trajectories"], head.addresses["weights"],
                                      json.dumps(config_changes)],
                                     stdout=subprocess.PIPE, env=env, cwd=REPO, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def said(self, line: str, timeout_s: float = 0.0) -> bool:
        """Whether it printed ``line`` (waiting up to ``timeout_s``); earlier lines are skipped."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self.lines.get(timeout=max(deadline - time.monotonic(), 0.001)) == line:
                    return True
            except queue.Empty:
                return False

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=TIMEOUT_S)


class Member:
    """An actor's control thread and CPU engine in this process, started; ``heard`` is what it was told."""

    def __init__(self, head: Head, actor_id: int, timeout_s: float, **config_changes):
        self.engine = tiny_engine(**config_changes)
        self.engine.start()
        self.heard: list[Control] = []
        self.control = ControlThread(self.engine, actor_id, head.addresses, timeout_s, self.heard.append,
                                     join_retry_s=0.2)
        self.control.start()

    def stop(self) -> None:
        self.control.stop()
        self.control.join(timeout=10)
        self.engine.stop()


def subscribed(head: Head, seen: Callable[[], bool]) -> int:
    """PUB drops what it sends before a subscriber is connected: say ``stop`` until heard (the control
    thread only hands it to its callback, which here records it); returns how many were said."""
    deadline, said = time.monotonic() + TIMEOUT_S, 0
    while not seen():
        assert time.monotonic() < deadline, "the actor never heard the control channel"
        head.publish(Control(command="stop"))
        said += 1
        time.sleep(0.05)
    return said


def test_a_resent_version_is_received_ignored_and_counted_whether_staged_or_applied():
    head = Head()
    model = tiny_model(0)
    engine = CpuEngine(model)  # not started yet: staged weights stay staged
    heard: list[Control] = []
    control = ControlThread(engine, 7, head.addresses, 5.0, heard.append, join_retry_s=0.2)
    control.start()
    try:
        assert head.wait_for_joins({7})
        probes = subscribed(head, lambda: bool(heard))
        v1, v2 = tiny_weights(1), tiny_weights(2)
        head.publish(Control(command="regroup", generation=1, members=[7]))
        head.broadcaster.regroup([7])

        def send(tensors: dict[str, torch.Tensor], version: int) -> None:
            announce = head.broadcaster.plan(tensors, version)
            head.publish(announce)
            head.broadcaster.send(announce, tensors)

        send(v1, 1)
        wait_until(lambda: control.versions_applied == [1], "version 1 staged")
        send(v1, 1)  # the learner resends the current version while a join is pending
        wait_until(lambda: control.resends_ignored == 1 or control.error is not None, "the resend handled")
        assert control.error is None and control.is_alive()
        assert len(heard) <= probes  # nobody but the probe told the actor to stop

        send(v2, 2)  # the group still works: the next version is staged and served
        wait_until(lambda: control.versions_applied == [1, 2], "version 2 staged")
        engine.start()
        wait_until(lambda: engine.version == 2, "version 2 applied")
        send(v2, 2)  # a resend of what the engine already serves
        wait_until(lambda: control.resends_ignored == 2, "the second resend handled")
        assert control.error is None and control.is_alive() and engine.version == 2
        for name, param in model.named_parameters():
            assert torch.equal(param, v2[name]), name
    finally:
        control.stop()
        control.join(timeout=5)
        engine.stop()
        head.close()


def test_after_a_broadcast_fails_every_surviving_actor_gets_the_next_version():
    # 6 s: the survivor must take all 45 MB before the sender gives up on the frozen member; at 3 s a
    # loaded machine once cut the survivor off too (the suite's only failure in a full run).
    head = Head(broadcast_timeout_s=6.0, bucket_nbytes=64 << 20)
    publisher = WeightPublisher(head.pub, head.broadcaster, head.take_join_requests)
    doomed = ActorProcess(1, head, WIDE)
    survivor = Member(head, 2, 6.0, **WIDE)
    engine, heard = survivor.engine, survivor.heard
    try:
        subscribed(head, lambda: bool(heard))
        assert head.wait_for_joins({1, 2}, timeout_s=60)  # the other process imports torch first
        subscribed(head, lambda: doomed.said("control stop"))

        publisher.publish(tiny_weights(1, **WIDE), 1)
        assert not publisher.actors_behind and publisher.broadcaster.members == [1, 2]
        wait_until(lambda: engine.version == 1, "the survivor serving version 1")
        assert doomed.said("serving 1", timeout_s=TIMEOUT_S)

        # One member stops reading mid-broadcast (then dies): the sender misses its deadline and
        # drops the group, while the survivor received everything and serves version 2.
        doomed.freeze()
        publisher.publish(tiny_weights(2, **WIDE), 2)
        assert publisher.failures == 1 and publisher.actors_behind
        doomed.kill()
        wait_until(lambda: engine.version == 2, "the survivor serving version 2")

        # Whoever is alive is in the group again by the next version.
        head.wait_for_joins({2}, timeout_s=5)
        publisher.publish(tiny_weights(3, **WIDE), 3)
        wait_until(lambda: engine.version == 3, "the survivor serving version 3", timeout_s=10)
        assert publisher.broadcaster.members == [2] and not publisher.actors_behind
        assert survivor.control.error is None
    finally:
        doomed.proc.kill()
        survivor.stop()
        head.close()


def test_a_join_request_a_member_sent_before_its_regroup_leaves_the_working_group_as_it_is():
    # An actor asks to join every retry interval until a regroup names it, so a request it sent
    # just before can reach the head after it joined. Re-forming on it would cost a regroup and a
    # resend for nothing, and would fail the publish outright if another member were busy then.
    head = Head()
    publisher = WeightPublisher(head.pub, head.broadcaster, head.take_join_requests)
    member = Member(head, 2, 5.0)
    engine, heard = member.engine, member.heard
    push = configure(zmq.Context.instance().socket(zmq.PUSH))
    push.connect(head.addresses["trajectories"])
    try:
        subscribed(head, lambda: bool(heard))
        assert head.wait_for_joins({2})
        publisher.publish(tiny_weights(1), 1)
        wait_until(lambda: engine.version == 1, "the member serving version 1")
        assert publisher.broadcaster.generation == 1 and publisher.broadcaster.members == [2]

        push.send(protocol.encode(GroupJoin(actor_id=2, weight_version=0, generation_seen=0)))  # sent before
        publisher.publish(tiny_weights(2), 2)
        wait_until(lambda: engine.version == 2, "the member serving version 2")
        assert publisher.broadcaster.generation == 1 and publisher.stale_joins == 1

        # A member that heard of its generation and asks again fell out of it: the group re-forms.
        push.send(protocol.encode(GroupJoin(actor_id=2, weight_version=2, generation_seen=1)))
        publisher.publish(tiny_weights(3), 3)
        wait_until(lambda: engine.version == 3, "the member serving version 3")
        assert publisher.broadcaster.generation == 2 and publisher.stale_joins == 1
        assert publisher.failures == 0 and member.control.error is None
    finally:
        push.close()
        member.stop()
        head.close()


def test_a_member_the_launcher_saw_die_is_left_out_of_the_next_group_without_a_failed_broadcast():
    head = Head()
    publisher = WeightPublisher(head.pub, head.broadcaster, head.take_join_requests)
    dead = ActorProcess(1, head, {})
    survivor = Member(head, 2, 5.0)
    engine, heard = survivor.engine, survivor.heard
    try:
        subscribed(head, lambda: bool(heard))
        assert head.wait_for_joins({1, 2}, timeout_s=60)  # the other process imports torch first
        subscribed(head, lambda: dead.said("control stop"))
        publisher.publish(tiny_weights(1), 1)
        assert dead.said("serving 1", timeout_s=TIMEOUT_S) and publisher.broadcaster.members == [1, 2]

        dead.kill()
        publisher.actor_lost(1)
        publisher.publish(tiny_weights(2), 2)
        wait_until(lambda: engine.version == 2, "the survivor serving version 2")
        assert publisher.failures == 0 and not publisher.actors_behind
        assert publisher.broadcaster.members == [2] and publisher.broadcaster.generation == 2
    finally:
        dead.proc.kill()
        survivor.stop()
        head.close()
