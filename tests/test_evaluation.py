"""Validation during training: the held-out subset, pass@n, rounds, and the train/eval separation."""

import dataclasses
import queue
import time

import numpy as np
import pytest
import zmq

from common import protocol
from common.config import load_config
from common.protocol import LeaseRequest, TaskLease, Trajectory
from common.recording import Recorder
from envhub.registry import task_ids
from learner.batching import collate
from learner.evaluation import EvalRounds, build_eval_rounds, eval_scalars, eval_task_subset, held_out_tasks
from learner.group import Group
from learner.head import HeadServer
from learner.replay import recorded_groups
from learner.sampler import TaskSampler

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)


def episode(lease: TaskLease, index: int, success: bool = False, num_turns: int = 2, status: str = "ok",
            purpose: str | None = None) -> Trajectory:
    n = 6
    return Trajectory(
        lease_id=lease.lease_id, group_id=lease.group_id, env_id=lease.env_id, task_id=lease.task_id, actor_id=0,
        episode_index=index, group_size=lease.group_size, token_ids=np.arange(n, dtype=np.int32),
        loss_mask=np.array([0, 1, 1, 0, 1, 1], np.uint8), behavior_logprobs=np.full(n, -1.0, np.float32),
        token_versions=np.array([-1, 0, 0, -1, 0, 0], np.int32), turn_spans=np.array([[1, 3], [4, 6]], np.int32),
        reward=float(success), success=success, terminated=success, truncated=not success,
        finish_reason="terminated" if success else "turn_cap", status=status, num_turns=num_turns, turn_cap=4,
        purpose=purpose or lease.purpose,
    )


def eval_lease(group_id: str, env_id: str = "keydoor-v0", task_id: str = "1", group_size: int = 2) -> TaskLease:
    return TaskLease(f"{group_id}-r0", group_id, env_id, task_id, 0, group_size, 4, 512, 0, 0.0, purpose="eval")


def group_of(lease: TaskLease, successes: list[bool], **kwargs) -> Group:
    return Group(lease, [episode(lease, i, s, **kwargs) for i, s in enumerate(successes)])


def keydoor_tasks(split: str) -> dict[str, list[str]]:
    """What envhub lists for the smoke config's one env (``GET /envs/keydoor-v0/tasks``), without a server."""
    return {"keydoor-v0": task_ids("keydoor-v0", split)}


# ---------------------------------------------------------------------------- held-out tasks


def test_held_out_subset_is_evenly_spaced_deterministic_and_from_the_test_split():
    tasks = [str(i) for i in range(100)]
    assert eval_task_subset(tasks, 4) == ["0", "25", "50", "75"]
    assert eval_task_subset(tasks[:3], 5) == ["0", "1", "2"]
    first = held_out_tasks(keydoor_tasks("test"), 8)
    assert first == held_out_tasks(keydoor_tasks("test"), 8)
    held_out = first["keydoor-v0"]
    assert len(set(held_out)) == 8 and set(held_out) <= set(task_ids("keydoor-v0", "test"))
    assert not set(held_out) & set(task_ids("keydoor-v0", "train"))


def test_too_many_samples_is_a_clear_error_and_no_eval_builds_nothing():
    # A missing eval split is envhub's answer: tests/test_learner_task_lists.py.
    cfg = load_config("configs/smoke.yaml", ["--learner.eval_samples", "9", "--actors.max_concurrent_episodes", "8"])
    with pytest.raises(ValueError, match="max_concurrent_episodes"):
        build_eval_rounds(cfg, keydoor_tasks)
    no_eval = ["--learner.eval_every", "0", "--learner.eval_at_end", "false", "--learner.eval_at_start", "false"]
    assert build_eval_rounds(load_config("configs/smoke.yaml", no_eval), keydoor_tasks) is None
    final_only = build_eval_rounds(load_config("configs/smoke.yaml", ["--learner.eval_every", "0"]), keydoor_tasks)
    assert not any(final_only.due(step) for step in range(5))  # eval_at_end alone: only the final round


# ---------------------------------------------------------------------------- metrics


def test_pass_at_n_and_means_from_hand_made_groups():
    groups = [
        group_of(eval_lease("e0", task_id="1"), [False, True, False]),
        group_of(eval_lease("e1", task_id="2"), [False, False, False], num_turns=4),
        group_of(eval_lease("e2", task_id="3"), [True, True, True]),
        group_of(eval_lease("e3", env_id="maze-v0"), [False, False, False]),
    ]
    scalars = eval_scalars(groups)
    assert scalars["eval/keydoor-v0/pass@n"] == pytest.approx(2 / 3)
    assert scalars["eval/keydoor-v0/success"] == pytest.approx(4 / 9)
    assert scalars["eval/keydoor-v0/reward"] == pytest.approx(4 / 9)
    assert scalars["eval/keydoor-v0/num_turns"] == pytest.approx((6 * 2 + 3 * 4) / 9)
    assert scalars["eval/maze-v0/pass@n"] == 0.0 and scalars["eval/maze-v0/success"] == 0.0


def test_errored_episodes_count_in_error_frac_not_in_success():
    lease = eval_lease("e0")
    group = Group(lease, [episode(lease, 0, success=True), episode(lease, 1, status="env_error")])
    scalars = eval_scalars([group])
    assert scalars["eval/keydoor-v0/success"] == 1.0 and scalars["eval/keydoor-v0/error_frac"] == 0.5
    assert scalars["eval/keydoor-v0/pass@n"] == 1.0


def test_agentgym_avg_and_pass_follow_agentgym_rls_evaluation():
    """Avg: mean over tasks of the mean final score; Pass: mean over tasks of the best one. A failed
    episode scores 0 (as AgentGym-RL's rollout does), a negative score (SciWorld's) counts as it is,
    and an env that reports no score is scored by its reward."""
    babyai, sciworld = eval_lease("b0", env_id="babyai-v0"), eval_lease("s0", env_id="sciworld-v0")
    scored = [dataclasses.replace(episode(babyai, 0, success=True), score=0.82),
              dataclasses.replace(episode(babyai, 1), score=0.0),
              episode(babyai, 2, status="env_error")]
    negative = [dataclasses.replace(episode(sciworld, i), score=-100.0) for i in range(2)]
    unscored = group_of(eval_lease("k0"), [True, False])
    scalars = eval_scalars([Group(babyai, scored), Group(sciworld, negative), unscored])
    assert scalars["eval/babyai-v0/agentgym_avg@n"] == pytest.approx(0.82 / 3)
    assert scalars["eval/babyai-v0/agentgym_pass@n"] == pytest.approx(0.82)
    assert scalars["eval/sciworld-v0/agentgym_avg@n"] == -100.0
    assert scalars["eval/sciworld-v0/agentgym_pass@n"] == -100.0
    assert scalars["eval/keydoor-v0/agentgym_avg@n"] == 0.5 and scalars["eval/keydoor-v0/agentgym_pass@n"] == 1.0


# ---------------------------------------------------------------------------- rounds


class FakeHead:
    def __init__(self) -> None:
        self.scheduled: list[tuple[list, int]] = []

    def schedule_eval(self, tasks, group_size):
        start = sum(len(t) for t, _ in self.scheduled)
        self.scheduled.append((tasks, group_size))
        return [f"e{start + i}" for i in range(len(tasks))]


def test_a_round_is_logged_at_its_start_step_once_every_group_is_back_and_overlaps_are_skipped():
    rounds = EvalRounds({"keydoor-v0": ["1", "2"]}, samples=3, every_steps=2, max_steps=6)
    head, finished = FakeHead(), queue.Queue()
    assert [rounds.due(s) for s in range(7)] == [True, False, True, False, True, False, False]
    assert rounds.maybe_start(0, head) and head.scheduled == [([("keydoor-v0", "1"), ("keydoor-v0", "2")], 3)]
    assert not rounds.maybe_start(1, head)  # not due
    finished.put(group_of(eval_lease("e0", task_id="1", group_size=3), [True, False, False]))
    assert rounds.collect(finished) == []  # half a round: nothing logged, nothing waited for
    assert not rounds.maybe_start(2, head) and rounds.rounds_skipped == 1  # due, but step 0's round runs
    finished.put(group_of(eval_lease("e1", task_id="2", group_size=3), [False, False, False]))
    [(step, scalars)] = rounds.collect(finished)
    assert step == 0 and scalars["eval/keydoor-v0/pass@n"] == 0.5 and scalars["eval/rounds_skipped"] == 1.0
    assert rounds.maybe_start(4, head) and len(head.scheduled) == 2


# ---------------------------------------------------------------------------- head: train and eval apart


@pytest.fixture
def head():
    sampler = TaskSampler({"keydoor-v0": ["1", "2", "3"]}, group_size=2, groups_per_step=1, max_policy_lag=0,
                          lease_timeout_s=60.0, max_episode_tokens=512, seed=0)
    server = HeadServer(sampler, poll_ms=5)
    server.set_policy(0, 4)
    server.start()
    ctx = zmq.Context.instance()
    dealer, push = ctx.socket(zmq.DEALER), ctx.socket(zmq.PUSH)
    dealer.connect(server.lease_address)
    push.connect(server.trajectory_address)
    yield server, dealer, push
    dealer.close(linger=0)
    push.close(linger=0)
    server.stop()


def request_lease(dealer) -> TaskLease:
    dealer.send(protocol.encode(LeaseRequest(actor_id=0, max_leases=1)))
    assert dealer.poll(5000), "the head granted no lease"
    return protocol.decode(dealer.recv(), TaskLease)


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_eval_episodes_never_reach_the_training_queue_or_batch(head):
    server, dealer, push = head
    server.schedule_eval([("keydoor-v0", "3")], group_size=3)
    evaluated, trained = request_lease(dealer), request_lease(dealer)
    assert (evaluated.purpose, evaluated.group_size, trained.purpose) == ("eval", 3, "train")
    push.send(protocol.encode(episode(trained, 0, purpose="eval")))  # an actor mislabelling a train episode
    push.send(protocol.encode(episode(evaluated, 0, purpose="train")))  # ... and an eval one
    for index in range(3):
        push.send(protocol.encode(episode(evaluated, index, success=True)))
    for index in range(2):
        push.send(protocol.encode(episode(trained, index)))
    wait_for(lambda: server.eval_groups.qsize() == 1 and server.groups.qsize() == 1)
    train_group, eval_group = server.groups.get(), server.eval_groups.get()
    assert {e.purpose for e in eval_group.episodes} == {"eval"} and len(eval_group.episodes) == 3
    batch = collate([train_group])
    assert {e.purpose for e in batch.episodes} == {"train"} and batch.token_ids.shape[0] == 2
    ledger = server.ledger()
    assert ledger["episodes_discarded_purpose"] == 2
    assert (ledger["eval_completed"], ledger["completed"], ledger["admitted"]) == (1, 1, 1)
    server.sampler.check_ledger()


def test_replay_skips_recorded_eval_episodes(tmp_path):
    train = TaskLease("g0-r0", "g0", "keydoor-v0", "1", 0, 2, 4, 512, 0, 0.0)
    recorder = Recorder(tmp_path / "trajectories.msgpack")
    for lease in (eval_lease("e0"), train):
        for index in range(2):
            recorder.write(protocol.encode(episode(lease, index)))
    recorder.close()
    assert [g.lease.group_id for g in recorded_groups(tmp_path)] == ["g0"]
