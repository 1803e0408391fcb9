"""One lease lifecycle for training and eval groups alike (``learner/sampler.py`` keeps one book each).

A group is added (drawn, or scheduled and pending), leased, (expired -> re-leased)*, and then
completed or abandoned. The book counts every transition under the ledger names of its kind
(``LedgerNames``), so training and eval keep their own ledger keys while sharing one lifecycle
and one set of invariants. What a kind does around the lifecycle (admission, when to abandon,
how to classify a rejected completion) stays with the sampler.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from common.protocol import TaskLease


@dataclass
class LeasedGroup:
    """A group (one task, ``group_size`` episodes) that has not completed yet."""

    group_id: str
    env_id: str
    task_id: str
    seed: int
    attempt: int
    """Attempt number of the latest lease issued for this group (0 for the first)."""
    lease_id: str | None
    """The live lease, or None while the group waits to be leased (again)."""
    group_size: int = 0
    """Episodes per lease; 0 means the sampler's ``group_size`` (eval groups set their own)."""


@dataclass(frozen=True)
class LedgerNames:
    """The ledger keys one kind of group counts its transitions under."""

    kind: str
    """How the invariants name it (``lease`` / ``eval lease``)."""
    added: str
    issued: str
    reissued: str
    completed: str
    expired: str
    abandoned: str | None = None
    """None for a kind whose groups are re-issued until they complete."""


class LeaseBook:
    """Groups not yet completed, their outstanding leases, and the queues of groups owed a lease."""

    def __init__(self, names: LedgerNames, counts: dict[str, int]) -> None:
        self.names = names
        self.counts = counts
        """Ledger counters; the book moves its own names, the sampler may keep others in it."""
        self.groups: dict[str, LeasedGroup] = {}  # not completed
        self.leases: dict[str, TaskLease] = {}  # outstanding: issued, not expired, not completed
        # (deadline, lease id) of the leases issued, soonest first: ``take_overdue`` looks at the due
        # ones only (the sampler asks on every lease it issues, with thousands outstanding).
        # Completed and expired leases leave it lazily.
        self._deadlines: list[tuple[float, str]] = []
        self.pending: deque[str] = deque()  # added, never leased
        self.reissue: deque[str] = deque()  # lease expired, awaiting re-issue, oldest first

    def add(self, group: LeasedGroup, pending: bool = False) -> None:
        """A new group; ``pending`` ones wait in line for ``next_group`` (else the caller leases it now)."""
        self.groups[group.group_id] = group
        self.counts[self.names.added] += 1
        if pending:
            self.pending.append(group.group_id)

    def next_group(self) -> LeasedGroup | None:
        """The group to lease next: a re-issue first (its attempt advanced), then a pending one."""
        if self.reissue:
            group = self.groups[self.reissue.popleft()]
            group.attempt += 1
            self.counts[self.names.reissued] += 1
            return group
        return self.groups[self.pending.popleft()] if self.pending else None

    def issued(self, group: LeasedGroup, lease: TaskLease) -> None:
        group.lease_id = lease.lease_id
        self.leases[lease.lease_id] = lease
        self.counts[self.names.issued] += 1
        heapq.heappush(self._deadlines, (lease.deadline_unix_s, lease.lease_id))
        if len(self._deadlines) > 2 * len(self.leases) + 1024:  # mostly leases long completed
            self._index_deadlines()

    def restore(self, leases: Iterable[TaskLease]) -> None:
        """Outstanding leases from a checkpoint (their groups restored already)."""
        self.leases = {lease.lease_id: lease for lease in leases}
        self._index_deadlines()

    def _index_deadlines(self) -> None:
        self._deadlines = [(lease.deadline_unix_s, lease.lease_id) for lease in self.leases.values()]
        heapq.heapify(self._deadlines)

    def expire(self, lease_id: str) -> LeasedGroup | None:
        """Expire an outstanding lease: its group, which the caller re-queues or abandons; None
        when the lease is not outstanding (completed or expired already, or not of this book)."""
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return None
        group = self.groups[lease.group_id]
        group.lease_id = None
        self.counts[self.names.expired] += 1
        return group

    def requeue(self, group: LeasedGroup) -> None:
        self.reissue.append(group.group_id)

    def abandon(self, group: LeasedGroup) -> None:
        """Drop an expired group for good: never leased again."""
        assert self.names.abandoned is not None, f"{self.names.kind} groups are never abandoned"
        del self.groups[group.group_id]
        self.counts[self.names.abandoned] += 1

    def complete(self, lease_id: str) -> LeasedGroup | None:
        """Record a returned lease: its group, done; None when the lease is not outstanding."""
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return None
        self.counts[self.names.completed] += 1
        return self.groups.pop(lease.group_id)

    def take_overdue(self, now: float) -> list[TaskLease]:
        """The outstanding leases whose deadline has come (``now >= deadline``), soonest first;
        the caller expires them (each is handed out once)."""
        due = []
        while self._deadlines and self._deadlines[0][0] <= now:
            lease = self.leases.get(heapq.heappop(self._deadlines)[1])
            if lease is not None:
                due.append(lease)
        return due

    def broken_invariants(self) -> list[str]:
        """Names of the lifecycle invariants the counters and the book's contents break."""
        n, c = self.names, self.counts
        abandoned = c[n.abandoned] if n.abandoned else 0
        outstanding, awaiting, pending = len(self.leases), len(self.reissue), len(self.pending)
        live = sum(group.lease_id is not None for group in self.groups.values())
        checks = {
            f"every {n.kind} is a first lease or a re-issue": c[n.issued] == c[n.added] - pending + c[n.reissued],
            f"every {n.kind} completed, expired or outstanding":
                c[n.issued] == c[n.completed] + c[n.expired] + outstanding,
            f"every {n.kind} group completed, abandoned or still owed":
                c[n.added] == c[n.completed] + abandoned + outstanding + awaiting + pending,
            f"every {n.kind} expiry re-issued, queued or abandoned":
                c[n.expired] == c[n.reissued] + awaiting + abandoned,
            f"uncompleted {n.kind} groups match live leases and queues":
                live == outstanding and len(self.groups) - live == awaiting + pending,
        }
        return [name for name, ok in checks.items() if not ok]
