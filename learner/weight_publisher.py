"""The learner head's side of the weight group: who is in it, and each version's announce + broadcast.

1. Members are the previous group's, less the ones the launcher saw die, plus the actors that asked
   to join (``GroupJoin``) since the last publish; with none at all, nothing is sent
   (``actors_behind``: a later join gets a resend). A member's request sent before it had heard of
   the current generation is stale: the actor asked just before that regroup named it, and it is
   in (acting on it would re-form a working group, and resend the weights, for nothing).
2. When someone joined or left, or there is no group, ``Control(regroup)`` names generation g+1 and its
   members (actor ``members[i]`` is rank i + 1), and the group forms over the broadcaster's store.
3. ``WeightsAnnounce`` on PUB, then the buckets over the group.
4. Any failure (a member that never joins, one that dies or stalls mid-broadcast) drops the group,
   since a collective cannot go on past an error, and the learner carries on. The members that
   received everything have no reason to ask to join again, so a ``Control(regroup)`` naming
   nobody sends every actor back to step 1: the next publish reaches each live actor, no dead one.

The training loop sees a ``PolicyPublisher``: ``ActorPublisher`` for live actors (the control PUB
socket, the broadcaster, the resends when actors fall behind, ``Control(stop)``), ``NoActors``
for replay.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

import torch
import zmq

from common import protocol
from common.config import Config
from common.transport import bind_random, configure
from common.weight_sync import BroadcastFailed, WeightBroadcaster
from learner.distributed import Command, broadcast_command
from learner.model import UnshardedParameters

log = logging.getLogger(__name__)

RESEND_INTERVAL_S = 2.0
"""At most one weight resend this often: stale groups arrive in bursts, one resend serves them all."""


class WeightPublisher:
    """Publishes each new policy version to every actor in the weight group (learner head only)."""

    def __init__(self, pub: zmq.Socket, broadcaster: WeightBroadcaster,
                 take_join_requests: Callable[[], Mapping[int, int]]):
        """``take_join_requests``: actor id -> the newest generation it had heard announced, for
        the actors that asked to join since the last call."""
        self.pub, self.broadcaster, self._take_join_requests = pub, broadcaster, take_join_requests
        self.failures = 0
        """Broadcasts (or group formations) that failed; each dropped the group."""
        self.actors_behind = False
        """The last publish reached nobody or failed: some actor may lack the current weights."""
        self.stale_joins = 0
        """Join requests ignored: sent by a member before it heard of the generation it is in."""
        self._lost: set[int] = set()  # actors the launcher saw die since the last publish
        self._lost_lock = threading.Lock()  # the launcher's calls come on threads of their own

    def actor_lost(self, actor_id: int) -> None:
        """The launcher saw actor ``actor_id`` die: the next publish re-forms the group without it,
        and the request of its restarted process (which has heard of no generation yet) counts."""
        with self._lost_lock:
            self._lost.add(actor_id)

    def wants_regroup(self, join_requests: Mapping[int, int]) -> bool:
        """Whether the next publish re-forms the group: someone asked to join or a member was lost."""
        with self._lost_lock:
            lost = self._lost & set(self.broadcaster.members)
        return bool(lost or self._joining(join_requests, lost))

    def _joining(self, join_requests: Mapping[int, int], lost: set[int]) -> set[int]:
        """The requests that count: all but a member's sent before it had heard of its generation."""
        members, generation = set(self.broadcaster.members) - lost, self.broadcaster.generation
        return {actor for actor, seen in join_requests.items() if actor not in members or seen >= generation}

    def publish(self, tensors: Mapping[str, torch.Tensor] | UnshardedParameters, version: int) -> None:
        """Send ``version`` to the group, re-formed first when actors asked to join. Every wait is
        bounded by the broadcast deadline, so a dead actor never hangs the learner.

        ``UnshardedParameters`` are gathered one at a time and each bucket leaves as soon as it is
        full, so no rank ever holds the whole model; the gather is a collective, so it runs to the
        end whatever happens to the broadcast (nobody to send to, a failed group)."""
        specs = list(tensors.items()) if isinstance(tensors, Mapping) else tensors.specs()
        stream = iter(tensors.items() if isinstance(tensors, Mapping) else tensors)
        try:
            self._publish(specs, stream, version)
        finally:
            deque(stream, maxlen=0)

    def _publish(self, specs: list[tuple[str, torch.Tensor]], stream: Iterator[tuple[str, torch.Tensor]],
                 version: int) -> None:
        requests = self._take_join_requests()
        with self._lost_lock:
            lost, self._lost = self._lost & set(self.broadcaster.members), set()
        joins = self._joining(requests, lost)
        self.stale_joins += len(requests) - len(joins)
        members = sorted((set(self.broadcaster.members) - lost) | joins)
        if not members:
            if lost:  # every member died: end their group, so that none counts as in it any more
                self._call_everyone_back()
            self.actors_behind = True  # nobody to send to; actors that join later get it resent
            return
        try:
            if joins or lost or not self.broadcaster.connected:
                regroup = protocol.Control(command="regroup", generation=self.broadcaster.generation + 1,
                                           members=members)
                self.pub.send(protocol.encode(regroup))
                self.broadcaster.regroup(members)
            # buckets in the order the stream gathers them: each leaves as soon as it is full
            announce = self.broadcaster.plan(specs, version, large_first=False)
            self.pub.send(protocol.encode(announce))
            self.broadcaster.send_stream(announce, stream)
            self.actors_behind = False
        except BroadcastFailed as exc:
            self.actors_behind = True
            self.failures += 1
            log.warning("weight broadcast failed, the group is dropped and re-forms: %s", exc)
            self._call_everyone_back()

    def _call_everyone_back(self) -> None:
        """Announce a generation without members: each actor leaves its group and sends ``GroupJoin``."""
        generation = self.broadcaster.retire()
        self.pub.send(protocol.encode(protocol.Control(command="regroup", generation=generation, members=[])))


class PolicyPublisher(Protocol):
    """What the training loop calls to get each new policy version to the actors."""

    def publish(self, version: int) -> None:
        """Send ``version``'s weights (a collective: the followers gather with rank 0)."""

    def resend_if_behind(self, version: int, step: int) -> None:
        """Send the current weights again now if some actor lacks them."""

    def actor_lost(self, actor_id: int) -> None:
        """The launcher saw this actor die (``WeightPublisher.actor_lost``)."""

    def stop_actors(self) -> None: ...

    def scalars(self) -> dict[str, float]: ...

    def close(self) -> None: ...


class ActorPublisher:
    """Live actors: the control PUB socket (regroup, announce, stop) and the weight group."""

    def __init__(self, cfg: Config, host: str, gather: Callable[[], UnshardedParameters],
                 join_requests: Callable[[], Mapping[int, int]], take_join_requests: Callable[[], Mapping[int, int]]):
        self.gather, self._join_requests = gather, join_requests
        self.weights_device = weights_device(cfg)
        self.pub = configure(zmq.Context.instance().socket(zmq.PUB))
        self.control_address = bind_random(self.pub, host)
        self.broadcaster = WeightBroadcaster(host, int(cfg.learner.bucket_mb * 2**20),
                                             cfg.learner.broadcast_timeout_s, self.weights_device)
        self.weights = WeightPublisher(self.pub, self.broadcaster, take_join_requests)
        self.resends = 0
        self._last_resend_s = 0.0

    def publish(self, version: int) -> None:
        # gathered bucket by bucket as they are sent, a collective: the followers gather too
        self.weights.publish(self.gather(), version)

    def resend_if_behind(self, version: int, step: int) -> None:
        """Stale groups while some actor lacks the current weights (the last broadcast failed or
        reached nobody, an actor restarted on the initial weights and asked to join): send them
        again now. Waiting for the next step's broadcast could wait forever, since that step
        needs fresh groups from those very actors (a lone restarted actor stalled a run so)."""
        if not (self.weights.actors_behind or self.weights.wants_regroup(self._join_requests())):
            return
        if time.monotonic() - self._last_resend_s < RESEND_INTERVAL_S:
            return
        self._last_resend_s = time.monotonic()
        self.resends += 1
        log.info("groups too stale to train on while actors are behind: resending version %d", version)
        broadcast_command(Command.GATHER, step)
        self.publish(version)

    def actor_lost(self, actor_id: int) -> None:
        self.weights.actor_lost(actor_id)

    def stop_actors(self) -> None:
        self.pub.send(protocol.encode(protocol.Control(command="stop")))

    def scalars(self) -> dict[str, float]:
        return {"async/weight_group_size": len(self.broadcaster.members),
                "async/weight_group_generation": self.broadcaster.generation,
                "async/broadcast_failures": self.weights.failures, "async/weight_resends": self.resends,
                "async/weight_joins_stale": self.weights.stale_joins}

    def close(self) -> None:
        self.pub.close()


class NoActors:
    """Replay: nobody to publish to."""

    def publish(self, version: int) -> None:
        pass

    def resend_if_behind(self, version: int, step: int) -> None:
        pass

    def actor_lost(self, actor_id: int) -> None:
        pass

    def stop_actors(self) -> None:
        pass

    def scalars(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


def weights_device(cfg: Config) -> str:
    """Where the weight group's buffers live: GPU memory (NCCL) when vLLM actors and the learner
    have GPUs, else CPU memory (gloo). The learner decides and tells the actors, so both agree."""
    return "cuda" if cfg.actors.engine == "vllm" and torch.cuda.is_available() else "cpu"
