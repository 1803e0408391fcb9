"""The learner head's side of the weight group: who is in it, and each version's announce + broadcast.

1. Members are the previous group's plus the actors that asked to join (``GroupJoin``) since the
   last publish; with none at all, nothing is sent (``actors_behind``: a later join gets a resend).
2. When someone joined or there is no group, ``Control(regroup)`` names generation g+1 and its
   members (actor ``members[i]`` is rank i + 1), and the group forms over the broadcaster's store.
3. ``WeightsAnnounce`` on PUB, then the buckets over the group.
4. Any failure (a member that never joins, one that dies or stalls mid-broadcast) drops the group,
   since a collective cannot go on past an error, and the learner carries on. The members that
   received everything have no reason to ask to join again, so a ``Control(regroup)`` naming
   nobody sends every actor back to step 1: the next publish reaches each live actor, no dead one.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping

import torch
import zmq

from common import protocol
from common.weight_sync import BroadcastFailed, WeightBroadcaster
from learner.model import UnshardedParameters

log = logging.getLogger(__name__)


class WeightPublisher:
    """Publishes each new policy version to every actor in the weight group (learner head only)."""

    def __init__(self, pub: zmq.Socket, broadcaster: WeightBroadcaster, take_join_requests: Callable[[], set[int]]):
        self.pub, self.broadcaster, self._take_join_requests = pub, broadcaster, take_join_requests
        self.failures = 0
        """Broadcasts (or group formations) that failed; each dropped the group."""
        self.actors_behind = False
        """The last publish reached nobody or failed: some actor may lack the current weights."""

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
        joins = self._take_join_requests()
        members = sorted(set(self.broadcaster.members) | joins)
        if not members:
            self.actors_behind = True  # nobody to send to; actors that join later get it resent
            return
        try:
            if joins or not self.broadcaster.connected:
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
