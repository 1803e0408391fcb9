"""Task sampling, task leases and staleness admission on the learner head.

Every task draw becomes a *group* (``group_size`` episodes of one task, one GRPO group) with a
unique ``group_id``; the head hands it to an actor as a ``TaskLease`` with a deadline. A group's
life: drawn -> leased -> (expired -> re-leased)* -> completed -> consumed (trained on) or released
(dropped by the learner). A group whose lease expires after ``max_group_reissues`` re-issues (a
task no actor finishes in time) is *abandoned* instead: dropped, counted, never leased again, its
admission slot freed. The ledger counts every transition, so no group is lost and none is counted
twice; ``check_ledger`` states the invariants.

Staleness admission (AReaL, arXiv 2505.24298): with ``G = groups_per_step`` and lag bound
``S = max_policy_lag``, a new group is admitted only while

    admitted = (completed - released) + outstanding + awaiting_reissue < (version + S + 1) * G

``admitted`` is cumulative (consumed groups still count), so the k-th admitted group (k >= 1)
enters at a version >= ceil(k / G) - S - 1 and, consumed in order at G groups per step, is
trained at version ceil(k / G) - 1: at most S versions behind. Re-issuing an expired group
needs no admission: the group already holds its slot, and the re-leased data is fresher.

Lease ids are ``f"{group_id}-r{attempt}"`` with ``group_id = f"g{draw_index}"``, so a completion
can be classified (late / duplicate) from the id without remembering every lease ever issued.

Eval groups (validation rounds, ``learner/evaluation.py``) are scheduled by the learner, not drawn:
``group_id = f"e{index}"``, leases with ``purpose="eval"``. They are issued ahead of new draws and
outside the staleness admission (they are never trained on), expire and re-issue like training
groups (one lifecycle, ``learner/lease_book.py``, one book each; an eval group is never abandoned),
and have their own ``eval_*`` counters and invariants. They are not checkpointed: a
restore drops the eval groups in flight (the learner starts a fresh round when one is due).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
import time
from collections import deque
from typing import Any, Callable

from common.protocol import LeasePurpose, TaskLease
from learner.lease_book import LeaseBook, LeasedGroup, LedgerNames

STATE_FORMAT = 1
_LEASE_ID = re.compile(r"g(\d+)-r(\d+)")
_EVAL_LEASE_ID = re.compile(r"e(\d+)-r(\d+)")
_EVAL_COUNTERS = ("eval_scheduled", "eval_issued", "eval_reissued", "eval_completed", "eval_expired",
                  "eval_discarded")
_COUNTERS = ("drawn", "issued", "reissued", "completed", "expired", "late", "duplicate",
             "released", "consumed", "lost_on_restore", "abandoned")


class LedgerError(RuntimeError):
    """A sampler invariant is broken: a lease or group was lost or counted twice."""


def _stable_seed(*parts: object) -> int:
    """A 31-bit seed from ``parts``, identical across processes (unlike ``hash``)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class _TaskCursor:
    """Walks one env's tasks in a seeded shuffled order; a new shuffle each epoch."""

    def __init__(self, env_id: str, task_ids: list[str], run_seed: int) -> None:
        self.env_id, self.task_ids, self.run_seed = env_id, list(task_ids), run_seed
        self.epoch, self.position = 0, 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[str]:
        order = list(self.task_ids)
        random.Random(_stable_seed(self.run_seed, self.env_id, epoch)).shuffle(order)
        return order

    def next_task(self) -> str:
        if self.position == len(self._order):
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._shuffled(self.epoch)
        task = self._order[self.position]
        self.position += 1
        return task

    def seek(self, epoch: int, position: int) -> None:
        if not 0 <= position <= len(self.task_ids) or epoch < 0:
            raise ValueError(f"{self.env_id}: bad cursor epoch={epoch} position={position}")
        self.epoch, self.position = epoch, position
        self._order = self._shuffled(epoch)

    def fingerprint(self) -> str:
        return hashlib.sha256("\n".join(self.task_ids).encode()).hexdigest()[:16]


TRAIN_LEDGER = LedgerNames("lease", added="drawn", issued="issued", reissued="reissued", completed="completed",
                           expired="expired", abandoned="abandoned")
EVAL_LEDGER = LedgerNames("eval lease", added="eval_scheduled", issued="eval_issued", reissued="eval_reissued",
                          completed="eval_completed", expired="eval_expired")


def _eval_book() -> LeaseBook:
    return LeaseBook(EVAL_LEDGER, dict.fromkeys(_EVAL_COUNTERS, 0))


def _is_eval_lease_id(lease_id: object) -> bool:
    return isinstance(lease_id, str) and _EVAL_LEASE_ID.fullmatch(lease_id) is not None


class TaskSampler:
    """Issues ``TaskLease``s round-robin across envs and keeps the lease ledger (head only)."""

    def __init__(
        self,
        env_tasks: dict[str, list[str]],
        group_size: int,
        groups_per_step: int,
        max_policy_lag: int,
        lease_timeout_s: float,
        max_episode_tokens: int,
        seed: int,
        clock: Callable[[], float] = time.time,
        max_group_reissues: int = 3,
        env_max_turns: dict[str, int] | None = None,
        draw_training: bool = True,
        eval_turn_cap: int = 0,
    ) -> None:
        _validate_args(env_tasks, group_size, groups_per_step, max_policy_lag, lease_timeout_s,
                       max_episode_tokens)
        if max_group_reissues < 0:
            raise ValueError(f"max_group_reissues must be >= 0, got {max_group_reissues}")
        self.max_group_reissues = max_group_reissues
        self.group_size, self.groups_per_step = group_size, groups_per_step
        self.max_policy_lag, self.lease_timeout_s = max_policy_lag, lease_timeout_s
        self.max_episode_tokens, self.seed, self.clock = max_episode_tokens, seed, clock
        self.env_ids = list(env_tasks)  # round-robin in the given (config) order
        self.env_max_turns = dict(env_max_turns or {})
        """Each env's own turn limit (its registry ``max_turns``): no lease of it allows more turns."""
        self.draw_training = draw_training
        self.eval_turn_cap = eval_turn_cap
        """Turn cap of eval leases instead of the schedule's (0: the schedule's)."""
        """False for a run that trains no step (an evaluation): only eval groups are leased, so the
        actors spend nothing on episodes nobody would train on."""
        self._cursors = {env: _TaskCursor(env, tasks, seed) for env, tasks in env_tasks.items()}
        self.version = 0
        self.turn_cap: int | None = None
        self._train = LeaseBook(TRAIN_LEDGER, dict.fromkeys(_COUNTERS, 0))
        self._final_attempt: dict[int, int] = {}  # draw -> completing attempt when > 0; abandoned: attempts + 1
        self._released_ids: set[str] = set()
        self._eval = _eval_book()

    # ------------------------------------------------------------------ driven by the head

    def schedule_eval(self, tasks: list[tuple[str, str]], group_size: int) -> list[str]:
        """Queue one eval group of ``group_size`` episodes per ``(env_id, task_id)``; their ids.

        Eval leases go out ahead of new draws, need no admission, and are never trained on.
        """
        unknown = sorted({env for env, _ in tasks} - set(self.env_ids))
        if unknown or group_size < 1:
            raise ValueError(f"schedule_eval: envs {unknown} not sampled here, or group_size {group_size} < 1")
        ids = []
        for env_id, task_id in tasks:
            group_id = f"e{self._eval.counts['eval_scheduled']}"
            # One fixed env seed per task: every round replays the same held-out episodes' starts.
            self._eval.add(LeasedGroup(group_id, env_id, task_id, _stable_seed("eval", env_id, task_id), attempt=0,
                                       lease_id=None, group_size=group_size), pending=True)
            ids.append(group_id)
        return ids

    def set_version(self, version: int) -> None:
        """The policy version leases are stamped with; never decreases."""
        if version < self.version:
            raise ValueError(f"policy version went back from {self.version} to {version}")
        self.version = version

    def set_turn_cap(self, cap: int) -> None:
        """Turn cap stamped on leases issued from now on (re-issues included), or the env's own
        ``max_turns`` where that is lower."""
        if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
            raise ValueError(f"turn cap must be a positive integer, got {cap!r}")
        self.turn_cap = cap

    def admission_bound(self) -> int:
        """Most groups that may have been admitted at the current version."""
        return (self.version + self.max_policy_lag + 1) * self.groups_per_step

    def admitted(self) -> int:
        """Groups holding an admission slot: completed and not released, or still owed."""
        c = self._counts
        return c["completed"] - c["released"] + len(self._train.leases) + len(self._train.reissue)

    def admissible(self) -> bool:
        """Whether one more new group fits under the staleness bound."""
        return self.admitted() < self.admission_bound()

    def issue(self, now: float | None = None) -> TaskLease | None:
        """The next lease: a re-issue of an expired group, else an eval group, else a new draw.

        Overdue leases are expired first. A re-issue needs no admission (its group already holds
        a slot), nor does an eval group (never trained on); a new draw happens only while
        ``admissible()``. Leases carry the current turn cap and policy version and a deadline
        ``now + lease_timeout_s``; returns None when none may be issued.
        """
        if self.turn_cap is None:
            raise RuntimeError("set_turn_cap must be called before the first lease is issued")
        now = self.clock() if now is None else now
        self.expire_overdue(now)
        reissue = self._train.next_group()  # training groups are drawn when leased: only re-issues wait
        if reissue is not None:
            return self._lease(self._train, reissue, now)
        eval_group = self._eval.next_group()
        if eval_group is not None:
            return self._lease(self._eval, eval_group, now, purpose="eval")
        if not (self.draw_training and self.admissible()):
            return None
        return self._lease(self._train, self._draw(), now)

    def expire_overdue(self, now: float | None = None) -> int:
        """Move leases whose deadline has come (``now >= deadline``) to the re-issue queue."""
        now = self.clock() if now is None else now
        overdue = sorted((lease.deadline_unix_s, lease.lease_id)
                         for lease in [*self._train.take_overdue(now), *self._eval.take_overdue(now)])
        return self.expire([lease_id for _, lease_id in overdue])

    def expire(self, lease_ids: list[str]) -> int:
        """Expire these outstanding leases now (their actor died): their groups are re-issued, or
        abandoned once re-issued ``max_group_reissues`` times."""
        expired = 0
        for lease_id in lease_ids:
            eval_group = self._eval.expire(lease_id)
            if eval_group is not None:
                self._eval.requeue(eval_group)  # an eval group is re-issued until it completes
                expired += 1
                continue
            group = self._train.expire(lease_id)
            if group is None:
                continue  # completed or expired already
            if group.attempt >= self.max_group_reissues:
                self._abandon(group)
            else:
                self._train.requeue(group)
            expired += 1
        return expired

    def complete(self, lease_id: str) -> bool:
        """Record a returned lease. True exactly once per outstanding lease; False otherwise.

        False means the head must discard the trajectories: ``late`` for a lease that expired
        (its group was or will be re-issued), ``duplicate`` for one already completed or unknown.
        Eval leases count as ``eval_completed`` or ``eval_discarded`` instead.
        """
        if _is_eval_lease_id(lease_id):
            if self._eval.complete(lease_id) is None:  # expired (its group re-issued), completed already, or unknown
                self._eval.counts["eval_discarded"] += 1
                return False
            return True
        group = self._train.complete(lease_id)
        if group is None:
            self._counts[self._classify_rejected(lease_id)] += 1
            return False
        if group.attempt:
            self._final_attempt[_parse_lease_id(lease_id)[0]] = group.attempt
        return True

    def release(self, group_id: str) -> None:
        """The learner dropped a completed group untrained: free its admission slot."""
        draw = _parse_group_id(group_id)
        if draw is None or draw >= self._counts["drawn"] or group_id in self._train.groups:
            raise LedgerError(f"release of {group_id!r}: not a completed group")
        if group_id in self._released_ids:
            raise LedgerError(f"release of {group_id!r}: already released")
        if self.buffered() < 1:
            raise LedgerError(f"release of {group_id!r}: every completed group is already accounted for")
        self._released_ids.add(group_id)
        self._counts["released"] += 1

    def consume(self, n_groups: int) -> None:
        """The learner trained on ``n_groups`` completed groups."""
        if n_groups < 0 or n_groups > self.buffered():
            raise LedgerError(f"consume({n_groups}) with {self.buffered()} completed groups not yet used")
        self._counts["consumed"] += n_groups

    def outstanding(self) -> list[TaskLease]:
        """Leases issued and neither expired nor completed, oldest deadline first."""
        return sorted(self._train.leases.values(), key=lambda lease: (lease.deadline_unix_s, lease.lease_id))

    def buffered(self) -> int:
        """Completed groups neither consumed nor released (waiting in the learner's buffer)."""
        c = self._counts
        return c["completed"] - c["consumed"] - c["released"]

    # ------------------------------------------------------------------ ledger

    def ledger(self) -> dict[str, int]:
        """All counters, plus the current ``outstanding``, ``awaiting_reissue``, ``buffered``;
        the ``eval_*`` ones once an eval group was scheduled."""
        evals = self._eval_ledger() if self._eval.counts["eval_scheduled"] else {}
        return {**self._counts, "outstanding": len(self._train.leases), "awaiting_reissue": len(self._train.reissue),
                "buffered": self.buffered(), "admitted": self.admitted(), **evals}

    def check_ledger(self, within_bound: bool = True) -> None:
        """Raise ``LedgerError`` naming the first broken invariant.

        ``within_bound=False`` skips the staleness-bound check, which a restore into a run with a
        smaller ``groups_per_step`` or ``max_policy_lag`` may legitimately exceed for a while.
        """
        c = self.ledger()
        checks = {
            "completed groups consumed, released or buffered": c["buffered"] >= 0,
            "admitted within the staleness bound": not within_bound or c["admitted"] <= self.admission_bound(),
        }
        broken = [*self._train.broken_invariants(), *(name for name, ok in checks.items() if not ok),
                  *self._eval.broken_invariants()]
        if broken:
            raise LedgerError(f"ledger invariant broken: {broken[0]}; ledger={c}")

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able state: cursors, counters, version, cap, outstanding and queued groups."""
        return {
            "format": STATE_FORMAT,
            "seed": self.seed,
            "version": self.version,
            "turn_cap": self.turn_cap,
            "counts": dict(self._counts),
            "cursors": {env: {"epoch": cur.epoch, "position": cur.position, "tasks": cur.fingerprint()}
                        for env, cur in self._cursors.items()},
            "groups": [dataclasses.asdict(g) for g in self._train.groups.values()],
            "leases": [dataclasses.asdict(lease) for lease in self._train.leases.values()],
            "reissue": list(self._train.reissue),
            "final_attempt": [[draw, attempt] for draw, attempt in self._final_attempt.items()],
            "released_ids": sorted(self._released_ids),
        }

    def load_state_dict(self, state: dict[str, Any], keep_buffered: bool = False) -> None:
        """Restore ``state_dict()`` output into a sampler built with the same envs and tasks.

        Completed groups that were neither consumed nor released lived only in the old head's
        memory: unless ``keep_buffered`` (the caller restored that buffer too) they are counted
        as released and ``lost_on_restore``, so their admission slots do not stay taken forever.
        Outstanding leases stay outstanding: if no actor returns them they expire and re-issue.
        """
        _check_state_header(state, self.seed, self._cursors)
        for env, cursor in self._cursors.items():
            cursor.seek(state["cursors"][env]["epoch"], state["cursors"][env]["position"])
        self.version, self.turn_cap = state["version"], state["turn_cap"]
        # older states have no "abandoned"
        self._train = LeaseBook(TRAIN_LEDGER, {name: int(state["counts"].get(name, 0)) for name in _COUNTERS})
        self._train.groups = {g["group_id"]: LeasedGroup(**g) for g in state["groups"]}
        self._train.restore(TaskLease(**lease) for lease in state["leases"])
        self._train.reissue = deque(state["reissue"])
        self._final_attempt = {int(draw): int(attempt) for draw, attempt in state["final_attempt"]}
        self._released_ids = set(state["released_ids"])
        self._eval = _eval_book()  # eval rounds are not checkpointed
        if not keep_buffered:
            lost = self.buffered()
            self._counts["released"] += lost
            self._counts["lost_on_restore"] += lost
        self.check_ledger(within_bound=False)

    # ------------------------------------------------------------------ internals

    @property
    def _counts(self) -> dict[str, int]:
        """The training ledger's counters (kept by its lease book)."""
        return self._train.counts

    def _eval_ledger(self) -> dict[str, int]:
        return {**self._eval.counts, "eval_outstanding": len(self._eval.leases),
                "eval_pending": len(self._eval.pending), "eval_awaiting_reissue": len(self._eval.reissue)}

    def _abandon(self, group: LeasedGroup) -> None:
        """Drop a group that expired after its last allowed re-issue; its admission slot is freed."""
        self._train.abandon(group)
        # Every attempt of it that comes back after all is late (``_classify_rejected``).
        self._final_attempt[_parse_group_id(group.group_id)] = group.attempt + 1

    def _draw(self) -> LeasedGroup:
        draw = self._counts["drawn"]
        env_id = self.env_ids[draw % len(self.env_ids)]
        group = LeasedGroup(group_id=f"g{draw}", env_id=env_id, task_id=self._cursors[env_id].next_task(),
                            seed=_stable_seed(self.seed, "draw", draw), attempt=0, lease_id=None)
        self._train.add(group)
        return group

    def _lease(self, book: LeaseBook, group: LeasedGroup, now: float, purpose: LeasePurpose = "train") -> TaskLease:
        assert self.turn_cap is not None
        cap = self.eval_turn_cap if purpose == "eval" and self.eval_turn_cap else self.turn_cap
        lease = TaskLease(
            lease_id=f"{group.group_id}-r{group.attempt}", group_id=group.group_id, env_id=group.env_id,
            task_id=group.task_id, seed=group.seed, group_size=group.group_size or self.group_size,
            turn_cap=min(cap, self.env_max_turns.get(group.env_id, cap)),
            max_episode_tokens=self.max_episode_tokens, policy_version=self.version,
            deadline_unix_s=now + self.lease_timeout_s, purpose=purpose,
        )
        book.issued(group, lease)
        return lease

    def _classify_rejected(self, lease_id: str) -> str:
        """``late`` if ``lease_id`` was issued and expired; ``duplicate`` if completed or unknown."""
        parsed = _parse_lease_id(lease_id)
        if parsed is None or parsed[0] >= self._counts["drawn"]:
            return "duplicate"
        draw, attempt = parsed
        group = self._train.groups.get(f"g{draw}")
        if group is not None:  # not completed: every issued attempt of it that is not live expired
            return "late" if attempt <= group.attempt else "duplicate"
        final = self._final_attempt.get(draw, 0)
        return "late" if attempt < final else "duplicate"


def _parse_lease_id(lease_id: str) -> tuple[int, int] | None:
    match = _LEASE_ID.fullmatch(lease_id) if isinstance(lease_id, str) else None
    return (int(match[1]), int(match[2])) if match else None


def _parse_group_id(group_id: str) -> int | None:
    match = re.fullmatch(r"g(\d+)", group_id) if isinstance(group_id, str) else None
    return int(match[1]) if match else None


def _validate_args(env_tasks: dict[str, list[str]], group_size: int, groups_per_step: int,
                   max_policy_lag: int, lease_timeout_s: float, max_episode_tokens: int) -> None:
    if not env_tasks:
        raise ValueError("env_tasks is empty: the sampler needs at least one environment")
    empty = [env for env, tasks in env_tasks.items() if not tasks]
    if empty:
        raise ValueError(f"environments without tasks: {empty}")
    for name, value in (("group_size", group_size), ("groups_per_step", groups_per_step),
                        ("max_episode_tokens", max_episode_tokens)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if max_policy_lag < 0:
        raise ValueError(f"max_policy_lag must be >= 0, got {max_policy_lag}")
    if not lease_timeout_s > 0:
        raise ValueError(f"lease_timeout_s must be > 0, got {lease_timeout_s}")


def _check_state_header(state: dict[str, Any], seed: int, cursors: dict[str, _TaskCursor]) -> None:
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"sampler state format {state.get('format')!r}, this build reads {STATE_FORMAT}")
    if state["seed"] != seed:
        raise ValueError(f"sampler state is from seed {state['seed']}, this sampler has seed {seed}")
    if set(state["cursors"]) != set(cursors):
        raise ValueError(f"sampler state has envs {sorted(state['cursors'])}, this run has {sorted(cursors)}")
    changed = [env for env, cur in cursors.items() if state["cursors"][env]["tasks"] != cur.fingerprint()]
    if changed:
        raise ValueError(f"task lists changed since the checkpoint for envs {changed}")
