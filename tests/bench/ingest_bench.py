"""Trajectory ingest through the learner head: trajectories/s and MB/s against raw ZeroMQ.

Not a test: it prints figures and asserts nothing. For each episode size (1k and 30k tokens) it
1. starts a sender process that builds realistic episodes (turns of observation tokens then reply
   tokens, the loss mask exactly the replies' ``turn_spans``, logprobs <= 0 and the lease's policy
   version on sampled tokens, per-turn rewards, observation fingerprints and parse flags) and
   encodes them with ``protocol.encode`` before the clock starts;
2. baseline: a bare PULL socket, configured as the head's, receives those frames on a thread, each
   as Python bytes (``recv_multipart()``, one copy out of ZeroMQ; the head decodes in place instead);
3. the head: a started ``HeadServer`` with every lease already open (as if granted to an actor,
   like ``tests/test_wire_fuzz.py``'s ``open_lease``) receives the same frames over the same
   loopback TCP: it decodes, validates, checks them against their leases and groups them; the main
   thread drains the completed groups (``server.get``) so memory stays flat;
4. prints the head's trajectories/s and MB/s as a ratio of the bare socket's (the best of
   ``--repeats`` runs of each, interleaved; goal >= 0.8);
5. a diagnostic row: the bare socket receiving as the head does and only decoding each frame into
   its message (no meaning check, no grouping): the least any head must do with a frame, so it
   bounds what the head can reach.

The clock runs from "go" to the last frame received (raw) or the last group completed (head);
a warm-up frame is received first, so the connection is made before it starts.

    .venv/bin/python -m tests.bench.ingest_bench [--quick] [--repeats 3] [--json PATH]

``--quick``: fewer episodes per run (about 15 s); ``--json PATH`` also writes the rows for run_all.py.
``--without-checks`` (a diagnostic, not the product): the head skips the meaning checks and its lease
and model checks, to show what decoding and grouping alone leave of raw.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np
import zmq

from common import protocol, wire_checks
from common.protocol import ActorStats, TaskLease, Trajectory
from common.transport import bind_random, configure
from learner.group import Group
from learner.head import HeadServer
from learner.sampler import TaskSampler
from tests.bench.run_all import write_json

VOCAB_SIZE = 151_936
"""Qwen2.5's embedding rows: the head checks every token id against it."""
GROUP_SIZE = 8
TURN_CAP = 64
MAX_EPISODE_TOKENS = 32_768
GOAL = ">= 0.8"
TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Size:
    """One episode shape and how many episodes a run sends."""

    label: str
    tokens: int
    turns: int
    episodes: int
    quick_episodes: int


SIZES = (Size("1k", 1024, 6, 32_768, 8192), Size("30k", 30_720, 30, 1024, 512))


@dataclass
class Run:
    """One receiver's run: from "go" to the last frame received or group completed."""

    wall_s: float
    episodes: int
    nbytes: int

    @property
    def per_s(self) -> float:
        return self.episodes / self.wall_s

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.wall_s / 1e6


# ---------------------------------------------------------------------------------- episodes


def make_episode(lease: TaskLease, index: int, tokens: int, turns: int, rng: np.random.Generator) -> Trajectory:
    """A finished episode of ``turns`` env turns: observation, reply, ..., final observation, as the
    actors' ``ChatTokenBuffer`` lays it out (replies are a third of the tokens)."""
    reply_tokens = tokens // (3 * turns)
    observation_tokens = (tokens - reply_tokens * turns) // (turns + 1)
    spans, cursor = [], 0
    for _ in range(turns):
        cursor += observation_tokens
        spans.append((cursor, cursor + reply_tokens))
        cursor += reply_tokens
    sampled = np.zeros(tokens, bool)
    for start, end in spans:
        sampled[start:end] = True
    success = bool(index % 2)
    return Trajectory(
        lease_id=lease.lease_id, group_id=lease.group_id, env_id=lease.env_id, task_id=lease.task_id, actor_id=0,
        episode_index=index, group_size=lease.group_size,
        token_ids=rng.integers(0, VOCAB_SIZE, tokens, dtype=np.int32), loss_mask=sampled.astype(np.uint8),
        behavior_logprobs=np.where(sampled, -rng.exponential(0.5, tokens), 0.0).astype(np.float32),
        token_versions=np.where(sampled, lease.policy_version, -1).astype(np.int32),
        turn_spans=np.array(spans, np.int32).reshape(-1, 2), reward=float(success), success=success,
        terminated=success, truncated=not success, finish_reason="terminated" if success else "turn_cap",
        status="ok", num_turns=turns, turn_cap=lease.turn_cap,
        turn_rewards=np.where(np.arange(turns) == turns - 1, float(success), 0.0).astype(np.float32),
        turn_observations=rng.integers(0, 2**63, turns, dtype=np.uint64), turn_action_parsed=np.ones(turns, np.uint8),
        timings={"episode_s": 12.5, "generate_s": 9.0, "env_s": 3.1}, env_info={"room": "attic", "steps": turns},
        purpose=lease.purpose)


def warm_up_frame() -> bytes:
    return protocol.encode(ActorStats(0, 1, 0, 0, 0, 0.0, 0.0))


def sender(conn, size: Size, episodes: int) -> None:
    """The actor side, in its own process: for each run, encode the episodes of the leases it is
    sent, connect, send one warm-up frame, then on "go" push every frame as fast as it can."""
    ctx = zmq.Context()
    rng = np.random.default_rng(0)
    while True:
        command = conn.recv()
        if command is None:
            break
        address, leases = command
        frames = [protocol.encode(make_episode(lease, i, size.tokens, size.turns, rng))
                  for lease in leases for i in range(lease.group_size)][:episodes]
        push = configure(ctx.socket(zmq.PUSH))
        push.connect(address)
        push.send(warm_up_frame())
        conn.send(sum(map(len, frames)))
        conn.recv()  # go
        for frame in frames:
            push.send(frame, copy=False)
        conn.recv()  # received: with linger 0, closing earlier would drop what is still queued
        push.close()
    ctx.term()


# ---------------------------------------------------------------------------------- receivers


def open_leases(server: HeadServer, n_leases: int) -> list[TaskLease]:
    """Leases the head holds open, as if granted to an actor (``test_wire_fuzz.open_lease``)."""
    with server._lock:
        leases = [server.sampler.issue() for _ in range(n_leases)]
        for lease in leases:
            server._open[lease.lease_id] = Group(lease)
    return leases


def new_sampler() -> TaskSampler:
    """A sampler that admits every group of a run at once."""
    sampler = TaskSampler({"keydoor-v0": [str(i) for i in range(64)]}, group_size=GROUP_SIZE,
                          groups_per_step=1 << 12, max_policy_lag=0, lease_timeout_s=3600.0,
                          max_episode_tokens=MAX_EPISODE_TOKENS, seed=0)
    sampler.set_version(1)
    sampler.set_turn_cap(TURN_CAP)
    return sampler


def run_head(conn, episodes: int) -> Run:
    server = HeadServer(new_sampler(), poll_ms=20, vocab_size=VOCAB_SIZE)
    server.set_policy(1, TURN_CAP)
    leases = open_leases(server, -(-episodes // GROUP_SIZE))
    server.start()
    try:
        conn.send((server.trajectory_address, leases))
        nbytes = conn.recv()
        deadline = time.monotonic() + TIMEOUT_S
        while 0 not in server.actor_stats:  # the warm-up frame: connected
            if time.monotonic() > deadline:
                raise TimeoutError("the head never received the warm-up frame")
            time.sleep(0.005)
        started_s = time.perf_counter()
        conn.send("go")
        done = 0
        while done < len(leases):
            group = server.get(timeout_s=TIMEOUT_S)
            if group is None:
                raise TimeoutError(f"{done} of {len(leases)} groups completed: {server.ledger()}")
            done += 1
            server.consume(1)
        wall_s = time.perf_counter() - started_s
        conn.send("received")
        rejected = server.ledger()["rejected_messages"]
        if rejected:
            raise RuntimeError(f"the head rejected {rejected} bench episodes: {server.ledger()}")
        return Run(wall_s, episodes, nbytes)
    finally:
        server.stop()


def receive_raw(pull: zmq.Socket) -> None:
    pull.recv_multipart()


def receive_and_decode(pull: zmq.Socket) -> None:
    """Receive as the head does (in place) and make the message of the frame, unchecked."""
    protocol._decode_unchecked(pull.recv(copy=False).buffer, Trajectory)


def run_raw(conn, episodes: int, receive_one=receive_raw) -> Run:
    """The same frames into a bare PULL socket on a thread, configured as the head's, each taken by
    ``receive_one``."""
    pull = configure(zmq.Context.instance().socket(zmq.PULL))
    pull.setsockopt(zmq.MAXMSGSIZE, 64 << 20)
    address = bind_random(pull, "127.0.0.1")
    warm, finished = threading.Event(), threading.Event()
    ended_s = [0.0]

    def receive() -> None:
        pull.recv_multipart()
        warm.set()
        for _ in range(episodes):
            receive_one(pull)
        ended_s[0] = time.perf_counter()
        finished.set()

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    try:
        conn.send((address, placeholder_leases(episodes)))
        nbytes = conn.recv()
        if not warm.wait(TIMEOUT_S):
            raise TimeoutError("the raw socket never received the warm-up frame")
        started_s = time.perf_counter()
        conn.send("go")
        if not finished.wait(TIMEOUT_S):
            raise TimeoutError("the raw socket did not receive every frame")
        conn.send("received")
        return Run(ended_s[0] - started_s, episodes, nbytes)
    finally:
        thread.join(timeout=1)
        pull.close()


def placeholder_leases(episodes: int) -> list[TaskLease]:
    """Leases like the head's (ids of the same lengths): the raw socket gets the same bytes but for the ids."""
    sampler = new_sampler()
    return [sampler.issue() for _ in range(-(-episodes // GROUP_SIZE))]


# ---------------------------------------------------------------------------------- the bench


def bench_size(size: Size, episodes: int, repeats: int) -> list[tuple]:
    """The head's row and the decoding-alone row of one episode size."""
    parent, child = mp.get_context("spawn").Pipe()
    process = mp.get_context("spawn").Process(target=sender, args=(child, size, episodes), daemon=True)
    process.start()
    try:
        raw, head, decoding = [], [], []
        for _ in range(repeats):
            raw.append(run_raw(parent, episodes))
            head.append(run_head(parent, episodes))
            decoding.append(run_raw(parent, episodes, receive_and_decode))
        parent.send(None)
        process.join(timeout=30)
    finally:
        if process.is_alive():
            process.kill()
    best_raw, best_head, best_decoding = (max(runs, key=lambda r: r.per_s) for runs in (raw, head, decoding))
    frame_mb = best_head.nbytes / best_head.episodes / 1e6
    figure = (f"{size.label}-token episodes ({size.tokens} tokens, {size.turns} turns, {frame_mb:.3g} MB), "
              f"{episodes} per run")
    baseline = f"raw PULL {best_raw.per_s:.0f} traj/s {best_raw.mb_per_s:.0f} MB/s"
    return [(figure, f"head {best_head.per_s:.0f} traj/s {best_head.mb_per_s:.0f} MB/s", baseline,
             best_head.per_s / best_raw.per_s, GOAL),
            (f"{size.label}-token episodes, decoding alone (diagnostic: a bare socket that only makes each "
             f"frame's message)", f"{best_decoding.per_s:.0f} traj/s", baseline,
             best_decoding.per_s / best_raw.per_s, "")]


def skip_checks() -> None:
    """The diagnostic of ``--without-checks``, in this process only (the sender only encodes)."""
    wire_checks.CHECKS["Trajectory"] = lambda trajectory, arrays_screened=False: None
    wire_checks.batch_plainly_valid = lambda batch: True
    HeadServer._within_the_model = lambda self, episodes: True
    HeadServer._contradiction = lambda self, episode, lease, model_checked=False: None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer episodes per run (about 15 s)")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each receiver per size, the best counts "
                        "(default 5, --quick 3)")
    parser.add_argument("--sizes", nargs="+", default=[s.label for s in SIZES], choices=[s.label for s in SIZES])
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON (for run_all.py)")
    parser.add_argument("--without-checks", action="store_true",
                        help="diagnostic: the head decodes and groups without checking what episodes mean")
    args = parser.parse_args()
    if args.without_checks:
        skip_checks()
    repeats = args.repeats or (3 if args.quick else 5)
    rows = []
    for size in SIZES:
        if size.label in args.sizes:
            head, decoding = bench_size(size, size.quick_episodes if args.quick else size.episodes, repeats)
            if args.without_checks:
                head = (f"{head[0]}, without checks (diagnostic)", *head[1:4], "")
            for row in (head, decoding):
                rows.append(row)
                print(" | ".join(f"{c:.2f}" if isinstance(c, float) else str(c) for c in row), flush=True)
    write_json(args.json, "ingest_bench", rows)


if __name__ == "__main__":
    main()
