"""TaskSampler: staleness admission, lease expiry and re-issue, the ledger, checkpoints."""

import json
import random
import time
from collections import Counter

import pytest
import zmq

from common import protocol
from common.config import load_config
from common.protocol import LeaseRequest, TaskLease
from common.transport import configure, connect
from learner.head import HeadServer
from learner.lease_book import LeaseBook, LeasedGroup
from learner.sampler import EVAL_LEDGER, TRAIN_LEDGER, LedgerError, TaskSampler

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

ENV_TASKS = {"keydoor-v0": [f"k{i}" for i in range(5)], "maze-v0": [f"m{i}" for i in range(3)]}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_sampler(clock=None, groups_per_step=2, max_policy_lag=1, seed=7, env_tasks=ENV_TASKS,
                 max_group_reissues=3) -> TaskSampler:
    sampler = TaskSampler(env_tasks, group_size=4, groups_per_step=groups_per_step,
                          max_policy_lag=max_policy_lag, lease_timeout_s=10.0, max_episode_tokens=512,
                          seed=seed, clock=clock or FakeClock(), max_group_reissues=max_group_reissues)
    sampler.set_turn_cap(3)
    return sampler


def issue_all(sampler: TaskSampler) -> list:
    leases = []
    while (lease := sampler.issue()) is not None:
        leases.append(lease)
    return leases


def test_an_envs_own_max_turns_caps_its_leases_below_the_schedules_cap():
    sampler = TaskSampler(ENV_TASKS, 4, 2, 1, 10.0, 512, seed=0, clock=FakeClock(), env_max_turns={"maze-v0": 2})
    sampler.set_turn_cap(3)
    sampler.schedule_eval([("maze-v0", "m0")], 2)
    caps = {(lease.env_id, lease.purpose, lease.turn_cap) for lease in issue_all(sampler)}
    assert caps == {("maze-v0", "eval", 2), ("maze-v0", "train", 2), ("keydoor-v0", "train", 3)}


def test_eval_leases_take_the_eval_turn_cap_and_training_leases_the_schedules():
    sampler = TaskSampler(ENV_TASKS, 4, 2, 1, 10.0, 512, seed=0, clock=FakeClock(), eval_turn_cap=9,
                          env_max_turns={"maze-v0": 6})
    sampler.set_turn_cap(3)
    sampler.schedule_eval([("keydoor-v0", "k1"), ("maze-v0", "m0")], 1)
    caps = {(lease.env_id, lease.purpose, lease.turn_cap) for lease in issue_all(sampler)}
    assert caps == {("keydoor-v0", "eval", 9), ("maze-v0", "eval", 6), ("keydoor-v0", "train", 3),
                    ("maze-v0", "train", 3)}


def test_a_run_that_trains_nothing_leases_only_its_eval_groups_and_accounts_for_them():
    sampler = TaskSampler(ENV_TASKS, 4, 2, 1, 10.0, 512, seed=0, clock=FakeClock(), draw_training=False)
    sampler.set_turn_cap(3)
    sampler.schedule_eval([("keydoor-v0", "k1"), ("maze-v0", "m2")], 1)
    leases = issue_all(sampler)
    assert [(lease.purpose, lease.task_id) for lease in leases] == [("eval", "k1"), ("eval", "m2")]
    for lease in leases:
        assert sampler.complete(lease.lease_id)
    ledger = sampler.ledger()
    assert ledger["drawn"] == 0 and ledger["eval_completed"] == 2
    sampler.check_ledger()


def test_admission_blocks_at_the_bound_and_opens_after_set_version():
    sampler = make_sampler(groups_per_step=2, max_policy_lag=1)
    first = issue_all(sampler)
    assert len(first) == 4  # (version 0 + lag 1 + 1) * 2 groups
    assert not sampler.admissible()
    for lease in first:  # completing does not open admission: those groups are not trained yet
        assert sampler.complete(lease.lease_id)
    assert sampler.issue() is None
    sampler.consume(2)
    sampler.set_version(1)
    second = issue_all(sampler)
    assert len(second) == 2
    assert {lease.policy_version for lease in second} == {1}
    sampler.release(first[2].group_id)  # a dropped group frees its slot
    assert len(issue_all(sampler)) == 1
    sampler.check_ledger()


def test_in_order_training_is_never_more_than_max_policy_lag_behind_and_the_bound_is_reached():
    groups_per_step, lag = 3, 2
    sampler = make_sampler(groups_per_step=groups_per_step, max_policy_lag=lag)
    admitted_at, lags, pipeline = {}, [], []
    for version in range(12):
        sampler.set_version(version)
        for lease in issue_all(sampler):
            admitted_at[lease.group_id] = lease.policy_version
            pipeline.append(lease)
        batch, pipeline = pipeline[:groups_per_step], pipeline[groups_per_step:]
        for lease in batch:  # complete in admission order, train at the current version
            assert sampler.complete(lease.lease_id)
            lags.append(version - admitted_at[lease.group_id])
        sampler.consume(len(batch))
    assert max(lags) == lag


def test_expired_lease_is_reissued_and_only_the_reissue_completes():
    clock = FakeClock()
    sampler = make_sampler(clock)
    original = sampler.issue()
    clock.now += 10.0
    sampler.set_turn_cap(5)
    sampler.set_version(1)
    reissue = sampler.issue()
    assert (reissue.group_id, reissue.task_id, reissue.env_id, reissue.seed) == (
        original.group_id, original.task_id, original.env_id, original.seed)
    assert reissue.lease_id != original.lease_id
    assert (reissue.turn_cap, reissue.policy_version, reissue.deadline_unix_s) == (5, 1, clock.now + 10.0)
    assert not sampler.complete(original.lease_id)  # late: its group was handed to someone else
    assert sampler.complete(reissue.lease_id)
    assert not sampler.complete(reissue.lease_id)  # duplicate
    assert not sampler.complete(original.lease_id)  # still late, not a duplicate
    ledger = sampler.ledger()
    assert {k: ledger[k] for k in ("issued", "reissued", "expired", "completed", "late", "duplicate")} == {
        "issued": 2, "reissued": 1, "expired": 1, "completed": 1, "late": 2, "duplicate": 1}
    sampler.check_ledger()


def test_expired_lease_returned_before_its_reissue_is_late_and_the_group_still_reissues():
    clock = FakeClock()
    sampler = make_sampler(clock)
    lease = sampler.issue()
    clock.now += 10.0
    assert sampler.expire_overdue() == 1
    assert sampler.expire_overdue() == 0
    assert not sampler.complete(lease.lease_id)
    assert sampler.ledger()["late"] == 1
    assert sampler.issue().group_id == lease.group_id


def test_a_group_past_max_group_reissues_is_dropped_counted_and_never_issued_again():
    clock = FakeClock()
    sampler = make_sampler(clock, groups_per_step=1, max_policy_lag=0, max_group_reissues=2)
    attempts = [sampler.issue()]
    for _ in range(2):  # its two re-issues
        clock.now += 10.0
        attempts.append(sampler.issue())
    assert [lease.lease_id for lease in attempts] == ["g0-r0", "g0-r1", "g0-r2"]
    assert sampler.issue() is None  # the group holds the only admission slot
    clock.now += 10.0
    assert sampler.expire_overdue() == 1
    ledger = sampler.ledger()
    assert (ledger["abandoned"], ledger["awaiting_reissue"], ledger["admitted"]) == (1, 0, 0)
    fresh = sampler.issue()  # its slot is free, and it is not re-issued
    assert fresh.group_id == "g1"
    clock.now += 10.0
    assert sampler.issue().lease_id == "g1-r1" and sampler.issue() is None  # g1 re-issued, g0 never again
    for lease in attempts:  # results that come back after all are late
        assert not sampler.complete(lease.lease_id)
    assert sampler.ledger()["late"] == 3 and sampler.ledger()["duplicate"] == 0
    sampler.check_ledger()
    restored = make_sampler(clock, groups_per_step=1, max_policy_lag=0, max_group_reissues=2)
    restored.load_state_dict(json.loads(json.dumps(sampler.state_dict())), keep_buffered=True)
    assert restored.ledger() == sampler.ledger()
    with pytest.raises(ValueError, match="max_group_reissues"):
        make_sampler(max_group_reissues=-1)


def test_the_head_ledger_counts_abandoned_groups_and_its_invariants_hold():
    sampler = TaskSampler(ENV_TASKS, group_size=2, groups_per_step=1, max_policy_lag=0, lease_timeout_s=0.2,
                          max_episode_tokens=512, seed=0, max_group_reissues=1)
    head = HeadServer(sampler, poll_ms=5)
    head.set_policy(0, 3)
    head.start()
    dealer = connect(configure(zmq.Context.instance().socket(zmq.DEALER)), head.lease_address)
    try:
        leases = []
        for _ in range(2):  # an actor that takes the lease and its re-issue, and never answers
            dealer.send(protocol.encode(LeaseRequest(actor_id=0, max_leases=1)))
            assert dealer.poll(5000)
            leases.append(protocol.decode(dealer.recv(), TaskLease))
        assert [lease.lease_id for lease in leases] == ["g0-r0", "g0-r1"]
        deadline = time.monotonic() + 5
        while head.ledger()["abandoned"] < 1:
            assert time.monotonic() < deadline, head.ledger()
            time.sleep(0.02)
        ledger = head.ledger()
        assert ledger["ledger_broken"] == "" and ledger["awaiting_reissue"] == 0
    finally:
        dealer.close()
        head.stop()


def test_a_dead_actors_leases_are_reissued_at_once_and_the_others_keep_theirs():
    sampler = TaskSampler(ENV_TASKS, group_size=2, groups_per_step=2, max_policy_lag=1, lease_timeout_s=600.0,
                          max_episode_tokens=512, seed=0)
    head = HeadServer(sampler, poll_ms=5)
    head.set_policy(0, 3)
    head.start()
    dealer = connect(configure(zmq.Context.instance().socket(zmq.DEALER)), head.lease_address)

    def lease_for(actor_id: int) -> TaskLease:
        dealer.send(protocol.encode(LeaseRequest(actor_id=actor_id, max_leases=1)))
        assert dealer.poll(5000)
        return protocol.decode(dealer.recv(), TaskLease)

    try:
        dead, also_dead, alive = lease_for(3), lease_for(3), lease_for(4)
        assert head.actor_lost(3) == 2  # both of actor 3's, long before their deadline
        reissued = [lease_for(5), lease_for(5)]
        assert sorted(lease.group_id for lease in reissued) == sorted([dead.group_id, also_dead.group_id])
        assert all(lease.lease_id.endswith("-r1") for lease in reissued)
        ledger = head.ledger()
        assert ledger["leases_reissued_actor_lost"] == 2 and ledger["ledger_broken"] == ""
        assert alive.lease_id in {lease.lease_id for lease in sampler.outstanding()}  # actor 4 keeps its own
    finally:
        dealer.close()
        head.stop()


def test_max_group_reissues_is_a_validated_learner_setting():
    assert load_config().learner.max_group_reissues == 3
    assert load_config(None, ["--learner.max_group_reissues", "0"]).learner.max_group_reissues == 0
    with pytest.raises(ValueError, match="max_group_reissues"):
        load_config(None, ["--learner.max_group_reissues", "-1"])


def test_lease_before_its_deadline_does_not_expire():
    clock = FakeClock()
    sampler = make_sampler(clock)
    lease = sampler.issue()
    clock.now += 9.99
    assert sampler.expire_overdue() == 0
    assert sampler.complete(lease.lease_id)


def test_unknown_and_malformed_lease_ids_are_rejected_and_counted():
    sampler = make_sampler()
    lease = sampler.issue()
    for bogus in ("g999-r0", "nonsense", f"{lease.group_id}-r7"):
        assert not sampler.complete(bogus)
    assert sampler.ledger()["duplicate"] == 3
    assert sampler.complete(lease.lease_id)


def test_tasks_round_robin_across_envs_in_a_seeded_shuffle_per_epoch():
    sampler = make_sampler(groups_per_step=1000)
    leases = [sampler.issue() for _ in range(20)]
    assert [lease.env_id for lease in leases[:4]] == ["keydoor-v0", "maze-v0"] * 2
    keydoor = [lease.task_id for lease in leases if lease.env_id == "keydoor-v0"]
    assert sorted(keydoor[:5]) == sorted(keydoor[5:10]) == sorted(ENV_TASKS["keydoor-v0"])  # each epoch covers all
    maze = [lease.task_id for lease in leases if lease.env_id == "maze-v0"]
    assert sorted(maze[:3]) == sorted(maze[3:6]) == sorted(ENV_TASKS["maze-v0"])
    assert len({lease.group_id for lease in leases}) == 20
    assert keydoor[:5] != keydoor[5:10]  # a fresh shuffle each epoch
    replay = make_sampler(groups_per_step=1000)
    same_seed = [replay.issue().task_id for _ in range(20)]
    assert same_seed == [lease.task_id for lease in leases]
    other_seed = make_sampler(groups_per_step=1000, seed=8)
    assert [other_seed.issue().task_id for _ in range(20)] != same_seed


def test_episode_seeds_are_deterministic_per_draw_and_distinct():
    seeds = [lease.seed for lease in issue_all(make_sampler(groups_per_step=50))]
    assert seeds == [lease.seed for lease in issue_all(make_sampler(groups_per_step=50))]
    assert len(set(seeds)) == len(seeds) == 100
    assert all(0 <= seed < 2**31 for seed in seeds)


def test_ledger_invariants_hold_over_a_randomized_run_and_nothing_is_lost():
    rng = random.Random(0)
    clock = FakeClock()
    sampler = make_sampler(clock, groups_per_step=3, max_policy_lag=2, max_group_reissues=2)
    seen, buffer, accepted_groups = [], [], Counter()
    for _ in range(3000):
        op = rng.random()
        if op < 0.35:
            lease = sampler.issue()
            if lease is not None:
                assert lease.policy_version == sampler.version
                seen.append(lease)
        elif op < 0.7 and seen:
            lease = rng.choice(seen[-12:])  # mostly live leases, sometimes stale or finished ones
            if sampler.complete(lease.lease_id):
                accepted_groups[lease.group_id] += 1
                buffer.append(lease.group_id)
        elif op < 0.8:
            clock.now += rng.uniform(0.0, 6.0)
        elif op < 0.9 and buffer:
            n = rng.randint(0, len(buffer))
            if rng.random() < 0.2 and n:
                sampler.release(buffer.pop(rng.randrange(len(buffer))))
            else:
                del buffer[:n]
                sampler.consume(n)
        elif sampler.buffered() == 0 or rng.random() < 0.5:
            sampler.set_version(sampler.version + 1)
        sampler.check_ledger()
    # drain: return every owed group before its deadline
    while (ledger := sampler.ledger())["outstanding"] + ledger["awaiting_reissue"]:
        lease = sampler.issue() or sampler.outstanding()[0]
        assert sampler.complete(lease.lease_id)
        accepted_groups[lease.group_id] += 1
    sampler.check_ledger()
    ledger = sampler.ledger()
    assert set(accepted_groups.values()) == {1}  # every completed group counted exactly once
    assert len(accepted_groups) == ledger["completed"] == ledger["drawn"] - ledger["abandoned"]  # none lost
    assert ledger["expired"] > 10 and ledger["late"] > 10 and ledger["duplicate"] > 10  # the run hit them
    assert ledger["abandoned"] > 0


def test_state_dict_round_trip_continues_the_same_sequence():
    clock = FakeClock()
    original = make_sampler(clock, groups_per_step=2, max_policy_lag=3)
    leases = issue_all(original)
    assert original.complete(leases[0].lease_id) and original.complete(leases[1].lease_id)
    original.consume(1)
    clock.now += 10.0
    original.expire_overdue()  # leases[2:] now await re-issue
    state = json.loads(json.dumps(original.state_dict()))
    restored = make_sampler(clock, groups_per_step=2, max_policy_lag=3)
    restored.load_state_dict(state, keep_buffered=True)
    assert restored.ledger() == original.ledger()
    for version in (1, 2, 3):
        for sampler in (original, restored):
            sampler.set_version(version)
        continued = [issue_all(sampler) for sampler in (original, restored)]
        assert continued[0] == continued[1] and continued[0]
        for lease in continued[0]:
            assert original.complete(lease.lease_id) and restored.complete(lease.lease_id)
        original.consume(2)
        restored.consume(2)
    assert restored.ledger() == original.ledger()
    restored.check_ledger()


def test_restore_keeps_outstanding_leases_and_frees_lost_buffered_groups():
    clock = FakeClock()
    original = make_sampler(clock, groups_per_step=2, max_policy_lag=0)
    first, second = issue_all(original)
    assert original.complete(first.lease_id)
    restored = make_sampler(clock, groups_per_step=2, max_policy_lag=0)
    restored.load_state_dict(original.state_dict())
    assert restored.ledger()["lost_on_restore"] == 1  # the completed group died with the old head
    assert restored.issue() is not None  # ... so its admission slot is free again
    assert restored.complete(second.lease_id)  # an actor that survived the restart can still return
    restored.check_ledger()


def test_restore_into_changed_tasks_is_rejected():
    state = make_sampler().state_dict()
    changed = dict(ENV_TASKS, **{"maze-v0": ["m0", "m1"]})
    with pytest.raises(ValueError, match="task lists changed"):
        make_sampler(env_tasks=changed).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        make_sampler(seed=1).load_state_dict(state)


def test_misuse_is_reported():
    sampler = TaskSampler(ENV_TASKS, 4, 2, 1, 10.0, 512, seed=0, clock=FakeClock())
    with pytest.raises(RuntimeError, match="set_turn_cap"):
        sampler.issue()
    sampler.set_turn_cap(2)
    lease = sampler.issue()
    with pytest.raises(LedgerError, match="not a completed group"):
        sampler.release(lease.group_id)
    with pytest.raises(LedgerError, match="consume"):
        sampler.consume(1)
    assert sampler.complete(lease.lease_id)
    sampler.release(lease.group_id)
    with pytest.raises(LedgerError, match="already released"):
        sampler.release(lease.group_id)
    sampler.set_version(3)
    with pytest.raises(ValueError, match="went back"):
        sampler.set_version(2)
    with pytest.raises(ValueError, match="without tasks"):
        TaskSampler({"e": []}, 4, 2, 1, 10.0, 512, seed=0)


# ---------------------------------------------------------------------------- eval leases


def test_eval_leases_bypass_admission_and_go_before_new_draws_but_after_reissues():
    clock = FakeClock()
    sampler = make_sampler(clock, groups_per_step=1, max_policy_lag=0)
    train = sampler.issue()
    assert sampler.issue() is None  # the staleness bound is reached
    clock.now += 10.0  # the training lease expires: its re-issue is owed first
    eval_ids = sampler.schedule_eval([("keydoor-v0", "k1"), ("maze-v0", "m2")], group_size=3)
    leases = [sampler.issue() for _ in range(3)]
    assert leases[0].group_id == train.group_id and leases[0].purpose == "train"
    assert [lease.group_id for lease in leases[1:]] == eval_ids
    assert {(lease.purpose, lease.group_size) for lease in leases[1:]} == {("eval", 3)}
    assert [(lease.env_id, lease.task_id) for lease in leases[1:]] == [("keydoor-v0", "k1"), ("maze-v0", "m2")]
    assert sampler.issue() is None  # still no new training draw: admission unchanged by eval
    assert sampler.admitted() == 1
    ledger = sampler.ledger()
    assert (ledger["eval_scheduled"], ledger["eval_issued"], ledger["eval_outstanding"]) == (2, 2, 2)
    assert ledger["drawn"] == 1 and ledger["issued"] == 2  # eval leases are not training draws
    sampler.check_ledger()


def test_eval_leases_carry_current_cap_and_version_and_a_fixed_seed_per_task():
    sampler = make_sampler()
    sampler.set_version(3)
    sampler.set_turn_cap(6)
    first = [sampler.issue() for _ in sampler.schedule_eval([("keydoor-v0", "k1")] * 2, group_size=2)]
    assert {(lease.turn_cap, lease.policy_version) for lease in first} == {(6, 3)}
    later = make_sampler(seed=99)  # another run, another round: the same env seed for the task
    [lease] = [later.issue() for _ in later.schedule_eval([("keydoor-v0", "k1")], group_size=2)]
    assert first[0].seed == first[1].seed == lease.seed


def test_expired_eval_lease_is_reissued_and_late_results_are_discarded_and_counted():
    clock = FakeClock()
    sampler = make_sampler(clock)
    [group_id] = sampler.schedule_eval([("maze-v0", "m0")], group_size=2)
    original = sampler.issue()
    clock.now += 10.0
    reissue = sampler.issue()
    assert (reissue.group_id, reissue.purpose, reissue.task_id) == (group_id, "eval", "m0")
    assert reissue.lease_id != original.lease_id
    assert not sampler.complete(original.lease_id)
    assert sampler.complete(reissue.lease_id)
    assert not sampler.complete(reissue.lease_id)
    ledger = sampler.ledger()
    assert {k: ledger[k] for k in ("eval_issued", "eval_reissued", "eval_expired", "eval_completed",
                                   "eval_discarded")} == {"eval_issued": 2, "eval_reissued": 1, "eval_expired": 1,
                                                          "eval_completed": 1, "eval_discarded": 2}
    assert (ledger["late"], ledger["duplicate"], ledger["completed"]) == (0, 0, 0)  # training untouched
    with pytest.raises(LedgerError, match="not a completed group"):
        sampler.release(group_id)  # eval groups hold no admission slot to free
    sampler.check_ledger()


def test_eval_groups_are_not_checkpointed_and_need_known_envs():
    sampler = make_sampler()
    sampler.schedule_eval([("keydoor-v0", "k0")], group_size=2)
    sampler.issue()
    restored = make_sampler()
    restored.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    assert "eval_scheduled" not in restored.ledger() and restored.issue().purpose == "train"
    with pytest.raises(ValueError, match="not sampled here"):
        sampler.schedule_eval([("other-v0", "1")], group_size=2)


# ---------------------------------------------------------------------------- the shared lease book


@pytest.mark.parametrize("names", [TRAIN_LEDGER, EVAL_LEDGER], ids=["train", "eval"])
def test_one_lease_book_keeps_either_kinds_lifecycle_and_names_a_broken_invariant(names):
    book = LeaseBook(names, Counter())

    def lease(group: LeasedGroup, deadline: float) -> TaskLease:
        return TaskLease(f"{group.group_id}-r{group.attempt}", group.group_id, "keydoor-v0", "1", 0, 2, 4, 512, 0,
                         deadline)

    group = LeasedGroup("x0", "keydoor-v0", "1", seed=0, attempt=0, lease_id=None)
    book.add(group, pending=True)
    assert book.next_group() is group and book.next_group() is None
    book.issued(group, lease(group, deadline=5.0))
    assert book.take_overdue(now=4.9) == []
    assert [expired.lease_id for expired in book.take_overdue(now=5.0)] == ["x0-r0"]
    book.requeue(book.expire("x0-r0"))
    assert book.expire("x0-r0") is None  # expired once only
    again = book.next_group()
    assert again is group and group.attempt == 1
    book.issued(group, lease(group, deadline=50.0))
    assert book.complete("x0-r0") is None and book.complete("x0-r1") is group and not book.groups
    assert (book.counts[names.issued], book.counts[names.reissued], book.counts[names.expired],
            book.counts[names.completed]) == (2, 1, 1, 1)
    assert book.broken_invariants() == []
    book.counts[names.completed] += 1  # a completion counted twice
    assert any("completed" in broken for broken in book.broken_invariants())


def test_the_lease_book_expires_only_overdue_outstanding_leases_and_forgets_the_completed_ones():
    book = LeaseBook(TRAIN_LEDGER, Counter())
    for i in range(5000):  # a long run: leases issued and completed, every 1000th left outstanding
        group = LeasedGroup(f"g{i}", "keydoor-v0", "1", seed=i, attempt=0, lease_id=None)
        book.add(group)
        book.issued(group, TaskLease(f"g{i}-r0", f"g{i}", "keydoor-v0", "1", i, 2, 4, 512, 0, float(i)))
        if i % 1000:
            book.complete(f"g{i}-r0")
    assert len(book._deadlines) <= 2 * len(book.leases) + 1025  # not one entry per lease ever issued
    assert [lease.lease_id for lease in book.take_overdue(now=2500.0)] == ["g0-r0", "g1000-r0", "g2000-r0"]
    assert [lease.lease_id for lease in book.take_overdue(now=1e9)] == ["g3000-r0", "g4000-r0"]
