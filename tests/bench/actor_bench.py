"""One actor's throughput: episode machinery, tiny-model episodes by concurrency, weight broadcast.

Not a test: it prints one table of figures, each as a ratio against a baseline measured in
the same run, and asserts nothing.

(a) Episode machinery: ``actors.episode.run_episode`` (chat-token buffer, action decoding,
    envhub client) with ``ScriptedEngine``, a zero-cost policy double, against keydoor-v0
    on a real envhub server, over the session channel (the actors' default transport) and over
    HTTP, at 1, 8 and 64 concurrent episodes: turns/s, as a ratio of the bare rate of the same
    env calls (create, the turn cap's steps, close) made directly with the same client at the same
    concurrency (goal >= 0.8 over the channel at 64 episodes, >= 0.5 over HTTP), with the rate of the steps alone
    beside it; the best of 3 interleaved runs of each, the server pinned to one
    core and the bench to the other, as ``envhub_bench`` runs its load. The scripted policy's
    observations all repeat, so a last row at 64 runs with nothing remembered (``TranscriptTokens``
    with empty caches), as when every observation is new. A first row, without a goal, runs the
    episodes against keydoor-v0 in this process (``InProcessEnvClient``: no server, no socket),
    against the same env's steps alone: what the actor's own loop costs a turn, with the least noise.
(b) The same episodes with the tiny model in the ``CpuEngine`` (continuous batching, prefix
    reuse): generated tokens/s at 1, 8 and 64 concurrent episodes, as a ratio of 1 at a time
    (goal >= 4x at 64).
(c) Weight broadcast of a model's parameters between two processes over gloo (the tiny model
    in fp32, and SmolLM2-135M in bf16 as the learner sends it):
    ``WeightBroadcaster``/``WeightReceiver`` (bucketed, measured on the receiver until the
    tensors are unpacked) against one raw ``ProcessGroupGloo.broadcast`` of the same bytes
    (goal >= 0.8) and against a plain memory copy (``torch.clone``) of the same bytes.
(d) Long observations: the event loop's longest stall while 8 episodes each tokenize a 20 kB web page
    (a coroutine ticking alongside measures it), inline as a transcript would (``encode_observation_delta``)
    against ``TranscriptTokens``, which hands long pages to a worker thread.

    .venv/bin/python -m tests.bench.actor_bench [--quick] [--torch-threads 1] [--json PATH]

``--json PATH`` also writes the rows as JSON for tests/bench/run_all.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist
import uvloop

from actors.conversation import ConversationStarts
from actors.cpu_engine import CpuEngine
from actors.engine_api import Generation, SamplingParams
from actors.episode import EpisodeDeps, run_episode
from actors.transcript_tokens import TranscriptTokens
from common.chat import encode_observation_delta, observation_delta
from common.config.learner import LearnerConfig
from common.models import load_model, load_tokenizer, resolve_model
from common.paths import default_cache_dir
from common.protocol import TaskLease
from common.weight_sync import WeightBroadcaster, WeightReceiver, plan_buckets
from envhub import registry
from envhub.base import ConversationStart, Environment, StepResult
from envhub.channel_client import make_env_client
from envhub.client import EnvClient, SessionHandle
from tests.bench.envhub_bench import REPO, cores, start_server
from tests.bench.run_all import write_json

ENV_ID = "keydoor-v0"
CONCURRENCY_LEVELS = (1, 8, 64)
SCRIPTED_ACTION = "look"
"""Not a keydoor command: every step answers "Unknown action", so episodes run to the turn cap."""
DEFAULT_BUCKET_MB = int(LearnerConfig().bucket_mb)
"""The learner's default ``bucket_mb``."""
TIMEOUT_S = 120.0
SCRIPTED_REPEATS = 3
GROUP_SIZE = 8
"""Episodes per task, as ``learner.group_size`` in configs/default.yaml."""


@dataclass(frozen=True)
class BenchSizes:
    """How much work each part does (``--quick`` shrinks it)."""

    scripted_turn_cap: int
    """Turns per scripted episode (a)."""
    scripted_turns_per_level: int
    """Turns (and bare steps) at least, per run at one episode at a time (a); slots run episodes back
    to back. At higher concurrency a run does ``1 + concurrency // 8`` times as many, so that each
    lasts about as long: at 64 episodes, 2,048 turns took 50 ms, which every hiccup of a shared
    machine moved (single rows read 0.37 and 0.68 of bare in two runs an hour apart)."""
    model_turn_cap: int
    """Turns per tiny-model episode (b)."""
    model_new_tokens: int
    """max_new_tokens per turn (b); the random tiny model rarely samples its eos."""
    model_episodes_per_level: int
    """Episodes at least, per concurrency level (b); slots run episodes back to back."""
    broadcast_rounds: int
    """Timed rounds per broadcast kind (c); the median counts."""


QUICK = BenchSizes(8, 256, 6, 16, 4, 9)
FULL = BenchSizes(16, 2048, 8, 32, 128, 20)


class ScriptedEngine:
    """Test double of the InferenceEngine protocol: answers every request at once with one action."""

    def __init__(self, action_token_ids: list[int]):
        self._generation = Generation(list(action_token_ids), [0.0] * len(action_token_ids),
                                      [0] * len(action_token_ids), "stop")
        self.version = 0
        self.queue_depth = 0

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams) -> Generation:
        return self._generation

    def stage_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.version = version


def lease(index: int, turn_cap: int) -> TaskLease:
    # Each task and seed is played GROUP_SIZE times, as a lease of the learner's is (so openings repeat
    # as in a run: 99 % of the default job's did).
    group = index // GROUP_SIZE
    return TaskLease(lease_id=f"bench-{index}", group_id=f"bench-{group}", env_id=ENV_ID, task_id=str(group % 1000),
                     seed=group, group_size=1, turn_cap=turn_cap, max_episode_tokens=1_000_000, policy_version=0,
                     deadline_unix_s=time.time() + 3600)


async def run_episodes(deps: EpisodeDeps, concurrency: int, episodes_per_slot: int,
                       turn_cap: int) -> tuple[float, list]:
    """Run ``concurrency`` slots of back-to-back episodes; return the wall time and the trajectories."""

    async def slot(slot_index: int) -> list:
        return [await run_episode(lease(slot_index * episodes_per_slot + i, turn_cap), 0, deps)
                for i in range(episodes_per_slot)]

    started_s = time.perf_counter()
    per_slot = await asyncio.gather(*(slot(i) for i in range(concurrency)))
    trajectories = [t for slot_trajectories in per_slot for t in slot_trajectories]
    bad = [t.error or t.status for t in trajectories if t.status != "ok"]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes failed, e.g. {bad[0]}")
    return time.perf_counter() - started_s, trajectories


async def bare_episodes_turns_per_s(env: EnvClient, concurrency: int, episodes_per_slot: int, turn_cap: int) -> float:
    """Turns/s of the env calls the scripted episodes make (create, ``turn_cap`` steps, close), made
    directly: what an actor whose own work cost nothing would reach."""

    async def slot(slot_index: int) -> None:
        for i in range(episodes_per_slot):
            task = lease(slot_index * episodes_per_slot + i, turn_cap)
            session = await env.create(task.env_id, task.task_id, task.seed)
            for _ in range(turn_cap):
                await env.step(session.session_id, SCRIPTED_ACTION)
            await env.close(session.session_id)

    started_s = time.perf_counter()
    await asyncio.gather(*(slot(i) for i in range(concurrency)))
    return concurrency * episodes_per_slot * turn_cap / (time.perf_counter() - started_s)


async def bare_steps_per_s(env: EnvClient, concurrency: int, steps: int) -> float:
    """Steps/s of ``concurrency`` sessions each stepped ``steps`` times directly (steps timed only)."""
    sessions = await asyncio.gather(*(env.create(ENV_ID, str(i), i) for i in range(concurrency)))

    async def step_all(session_id: str) -> None:
        for _ in range(steps):
            await env.step(session_id, SCRIPTED_ACTION)

    started_s = time.perf_counter()
    await asyncio.gather(*(step_all(s.session_id) for s in sessions))
    elapsed_s = time.perf_counter() - started_s
    await asyncio.gather(*(env.close(s.session_id) for s in sessions))
    return concurrency * steps / elapsed_s


class InProcessEnvClient:
    """The calls an episode makes of its ``EnvClient``, answered by the env itself in this process:
    no server, no socket, so the rows it serves show what the actor's own loop costs a turn."""

    def __init__(self) -> None:
        self._sessions: dict[str, Environment] = {}
        self._session_numbers = itertools.count()

    async def create(self, env_id: str, task_id: str, seed: int) -> SessionHandle:
        env = registry.make(env_id)
        observation, info = await env.reset(task_id, seed)
        session_id = f"in-process-{next(self._session_numbers)}"
        self._sessions[session_id] = env
        return SessionHandle(session_id, observation, info)

    async def step(self, session_id: str, action: str) -> StepResult:
        await asyncio.sleep(0)  # as a real call waits for its answer, the loop runs the other episodes meanwhile
        return await self._sessions[session_id].step(action)

    async def close(self, session_id: str) -> None:
        await self._sessions.pop(session_id).close()

    async def conversation_start(self, env_id: str) -> ConversationStart:
        return registry.conversation_start(env_id)


async def part_a(url: str, tokenizer, sizes: BenchSizes) -> list[tuple]:
    # The episode loop alone first: a diagnostic without a goal (the server and the transport are what
    # the goals are about), the least noisy figure of what a turn costs the actor itself.
    loop_alone = scripted_deps(InProcessEnvClient(), tokenizer, TranscriptTokens(tokenizer, None))
    await run_episodes(loop_alone, 4, 1, 2)
    rows = [await scripted_row(loop_alone, "keydoor in process (no server)", "", CONCURRENCY_LEVELS[-1], sizes)]
    # The goals: issue 20's at 64 episodes over the channel, issue 5's at every level over HTTP.
    for transport, goal, goal_levels in (("channel", ">= 0.8", (64,)), ("http", ">= 0.5", CONCURRENCY_LEVELS)):
        async with make_env_client(url, TIMEOUT_S, transport) as env:
            rows += await scripted_rows(env, transport, goal, goal_levels, tokenizer, sizes)
    return rows


async def scripted_rows(env: EnvClient, transport: str, goal: str, goal_levels: tuple[int, ...], tokenizer,
                        sizes: BenchSizes) -> list[tuple]:
    deps = scripted_deps(env, tokenizer, TranscriptTokens(tokenizer, None))
    await run_episodes(deps, 4, 1, 2)  # warm-up: connections, template caches
    rows = []
    for concurrency in CONCURRENCY_LEVELS:
        rows.append(await scripted_row(deps, transport, goal if concurrency in goal_levels else "", concurrency, sizes))
    rows[-1] = with_hit_rates(rows[-1], deps.tokens)
    # The scripted policy's observations all repeat; one row with nothing remembered, as on web pages (a
    # diagnostic without a goal: the Rust tokenizer alone then costs ~45 us a turn).
    forgetful = scripted_deps(env, tokenizer, TranscriptTokens(tokenizer, None, cache_entries=0, opening_entries=0))
    row = await scripted_row(forgetful, transport, "", CONCURRENCY_LEVELS[-1], sizes)
    rows.append(with_hit_rates((*row[:1], f"{row[1]}, nothing remembered", *row[2:]), forgetful.tokens))
    return rows


def scripted_deps(env: EnvClient, tokenizer, tokens: TranscriptTokens) -> EpisodeDeps:
    action_ids = tokenizer.encode(SCRIPTED_ACTION, add_special_tokens=False) + [tokenizer.eos_token_id]
    return EpisodeDeps(0, ScriptedEngine(action_ids), env, tokenizer, SamplingParams(8), None,
                       ConversationStarts(env, lambda env_id: (True, None)), tokens=tokens)


async def scripted_row(deps: EpisodeDeps, transport: str, goal: str, concurrency: int, sizes: BenchSizes) -> tuple:
    """Scripted episodes at ``concurrency`` against the same env calls made bare at the same concurrency
    (the goal's baseline: an episode's create and close cost the server ~4 steps' worth, so against
    the steps alone, shown beside it, even a free actor would reach only ~0.82 with 16-turn episodes):
    the best of ``SCRIPTED_REPEATS`` runs of each, interleaved (at 64 calls in flight one run of
    either moves by up to 1.6x from the next, as the pipelined frames happen to batch)."""
    turns = sizes.scripted_turns_per_level * (1 + concurrency // 8)
    cap = sizes.scripted_turn_cap
    episodes_per_slot = -(-turns // (concurrency * cap))
    bare_steps, bare, turns_per_s = 0.0, 0.0, 0.0
    for _ in range(SCRIPTED_REPEATS):
        bare_steps = max(bare_steps, await bare_steps_per_s(deps.env, concurrency, cap * episodes_per_slot))
        bare = max(bare, await bare_episodes_turns_per_s(deps.env, concurrency, episodes_per_slot, cap))
        wall_s, trajectories = await run_episodes(deps, concurrency, episodes_per_slot, cap)
        turns_per_s = max(turns_per_s, sum(t.num_turns for t in trajectories) / wall_s)
    return (f"(a) scripted episodes, {transport}", f"{concurrency} concurrent",
            f"{turns_per_s:8.0f} turns/s ({1e6 / turns_per_s:.1f} us a turn)",
            f"{bare:8.0f} turns/s bare {transport} episodes ({1e6 / bare:.1f} us a turn; steps alone "
            f"{bare_steps:.0f}/s, {turns_per_s / bare_steps:.2f} of it)", turns_per_s / bare, goal)


def with_hit_rates(row: tuple, tokens: TranscriptTokens) -> tuple:
    stats = tokens.stats()
    return (*row[:3], f"{row[3]}; tokenizer cache: openings {hit_rate(stats, 'opening')}, "
            f"observations {hit_rate(stats, 'observation')}", *row[4:])


def hit_rate(stats: dict[str, int], kind: str) -> str:
    hits, misses = stats[f"{kind}_hits"], stats[f"{kind}_misses"]
    return f"{hits / max(hits + misses, 1):.0%} hits"


WEB_PAGE = "\n".join(f"[{i}] link 'Stainless kettle {i}, 1.7 l, 2200 W' [{i + 1}] button 'Add to cart'"
                     for i in range(300))
"""About 20 kB: a web page's accessibility tree."""
PAGES = 8


async def longest_stall_s(tokenize_all) -> float:
    """The longest gap between two ticks of a coroutine running beside ``tokenize_all()``."""
    gaps, done = [0.0], asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await tokenize_all()
    done.set()
    await ticking
    return max(gaps)


async def part_d(tokenizer) -> list[tuple]:
    pages = [f"{WEB_PAGE}\n[page {i}]" for i in range(PAGES)]  # distinct: nothing remembered

    delta = observation_delta(tokenizer, None)

    async def inline() -> None:
        for page in pages:
            await asyncio.sleep(0)  # each episode's own step reply came in
            encode_observation_delta(tokenizer, delta, page)  # what a transcript does on the loop

    tokens = TranscriptTokens(tokenizer, None)
    try:
        inline_s = await longest_stall_s(inline)
        offloaded_s = await longest_stall_s(lambda: asyncio.gather(*(tokens.delta_ids(p) for p in pages)))
    finally:
        tokens.close()
    return [("(d) 8 episodes tokenize a 20 kB page", "event loop's longest stall",
             f"{1000 * offloaded_s:6.2f} ms off the loop", f"{1000 * inline_s:6.2f} ms inline",
             inline_s / offloaded_s, "")]


async def part_b(env: EnvClient, tokenizer, model, sizes: BenchSizes) -> list[tuple]:
    sampling = SamplingParams(sizes.model_new_tokens, 1.0, (tokenizer.eos_token_id,))
    engine = CpuEngine(model, max_batch_size=max(CONCURRENCY_LEVELS))
    engine.start()
    try:
        starts = ConversationStarts(env, lambda env_id: (True, None))
        deps = EpisodeDeps(0, engine, env, tokenizer, sampling, None, starts)
        await run_episodes(deps, 2, 1, 2)  # warm-up
        rates = {}
        for concurrency in CONCURRENCY_LEVELS:
            prefill_before, reused_before, cpu_before = engine.prefill_tokens, engine.reused_tokens, engine.busy_cpu_s
            episodes_per_slot = -(-sizes.model_episodes_per_level // concurrency)
            wall_s, trajectories = await run_episodes(deps, concurrency, episodes_per_slot, sizes.model_turn_cap)
            tokens = sum(int(t.loss_mask.sum()) for t in trajectories)
            rates[concurrency] = tokens / wall_s
            prefill = engine.prefill_tokens - prefill_before
            reused = engine.reused_tokens - reused_before
            cpu_us = 1e6 * (engine.busy_cpu_s - cpu_before) / tokens
            rates[(concurrency, "prefix")] = (f"engine CPU {cpu_us:4.0f} us/token; prompt tokens "
                                              f"prefilled {prefill}, reused {reused}")
    finally:
        engine.stop()
    return [("(b) tiny model episodes", f"{n} concurrent", f"{rates[n]:8.0f} tokens/s",
             f"x 1 at a time; {rates[(n, 'prefix')]}", rates[n] / rates[1], ">= 4" if n == 64 else "")
            for n in CONCURRENCY_LEVELS]


def weights_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach() for name, p in model.named_parameters()}


def raw_group(address: str, rank: int) -> dist.ProcessGroup:
    host, port = address.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), 2, is_master=False, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    return dist.ProcessGroupGloo(dist.PrefixStore("raw", store), rank, 2, datetime.timedelta(seconds=TIMEOUT_S))


def raw_broadcast(group: dist.ProcessGroup, buf: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([buf], options).wait()


def receive_weights(weights_address: str, raw_address: str, rounds: int, model_name: str, bucket_mb: int) -> None:
    """The child process: rank 1 of both groups; prints its timings as one JSON line."""
    # The sender's first regroup() forms generation 1 of rank 0 (itself) and rank 1 (this process).
    announce = plan_buckets(weights_of(bench_model(model_name)).items(), bucket_mb * 2**20, version=1)
    announce = dataclasses.replace(announce, generation=1)
    receiver = WeightReceiver(weights_address, TIMEOUT_S)
    receiver.join(generation=1, rank=1, world_size=2)
    group = raw_group(raw_address, 1)
    buf = torch.empty(sum(announce.bucket_nbytes), dtype=torch.uint8)
    bucketed_s, raw_s = [], []
    for _ in range(rounds + 1):  # the first round warms up
        group.barrier().wait()
        started_s = time.perf_counter()
        receiver.receive(announce, reuse_buffers=True)  # as an actor whose engine applied the last one
        bucketed_s.append(time.perf_counter() - started_s)
        group.barrier().wait()
        started_s = time.perf_counter()
        raw_broadcast(group, buf)
        raw_s.append(time.perf_counter() - started_s)
    print(json.dumps({"bucketed_s": bucketed_s[1:], "raw_s": raw_s[1:]}), flush=True)


def send_weights(rounds: int, model_name: str, bucket_mb: int) -> dict[str, float]:
    """Rank 0: start the receiver process, broadcast ``rounds`` times each way; median seconds."""
    tensors = weights_of(bench_model(model_name))
    broadcaster = WeightBroadcaster("127.0.0.1", bucket_mb * 2**20, TIMEOUT_S)
    raw_store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=TIMEOUT_S))
    command = [sys.executable, "-m", "tests.bench.actor_bench", "--receive-weights", broadcaster.address,
               f"127.0.0.1:{raw_store.port}", "--rounds", str(rounds), "--broadcast-model", model_name,
               "--bucket-mb", str(bucket_mb)]
    child = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        broadcaster.regroup([1])
        group = dist.ProcessGroupGloo(dist.PrefixStore("raw", raw_store), 0, 2, datetime.timedelta(seconds=TIMEOUT_S))
        announce = broadcaster.plan(tensors, version=1)
        buf = torch.zeros(sum(announce.bucket_nbytes), dtype=torch.uint8)
        for _ in range(rounds + 1):
            group.barrier().wait()
            broadcaster.send(announce, tensors)
            group.barrier().wait()
            raw_broadcast(group, buf)
        timings = json.loads(child.communicate(timeout=TIMEOUT_S)[0].strip().splitlines()[-1])
    finally:
        child.kill()
    copy_s = []
    for _ in range(rounds):
        started_s = time.perf_counter()
        buf.clone()
        copy_s.append(time.perf_counter() - started_s)
    return {"bytes": buf.numel(), "bucketed_s": statistics.median(timings["bucketed_s"]),
            "raw_s": statistics.median(timings["raw_s"]), "copy_s": statistics.median(copy_s)}


def part_c(sizes: BenchSizes, model_name: str, bucket_mb: int = DEFAULT_BUCKET_MB) -> list[tuple]:
    t = send_weights(sizes.broadcast_rounds, model_name, bucket_mb)
    mib = t["bytes"] / 2**20

    def figure(seconds: float) -> str:
        return f"{1000 * seconds:7.2f} ms {mib / seconds:7.0f} MiB/s"

    return [
        ("(c) weight broadcast", f"{model_name}: {bucket_mb} MiB buckets, {mib:.1f} MiB", figure(t["bucketed_s"]),
         f"raw broadcast {figure(t['raw_s'])}", t["raw_s"] / t["bucketed_s"], ">= 0.8"),
        ("", f"{model_name}: memory copy (clone)", figure(t["copy_s"]), "x of bucketed",
         t["copy_s"] / t["bucketed_s"], ""),
    ]


def bench_model(name: str) -> torch.nn.Module:
    """The tiny model in fp32, or a real one in bf16 (as the learner would send it)."""
    return load_model(resolve_model(name, default_cache_dir()), "float32" if name == "tiny" else "bfloat16")



def print_table(rows: list[tuple]) -> None:
    header = ("part", "setting", "figure", "baseline", "ratio", "goal")
    cells = [header] + [(*(str(c) for c in row[:4]), f"{row[4]:.2f}", row[5]) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    for line in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


async def parts_d_and_b(url: str, tokenizer, sizes: BenchSizes) -> list[tuple]:
    rows = await part_d(tokenizer)
    async with make_env_client(url, TIMEOUT_S, "channel") as env:
        return rows + await part_b(env, tokenizer, load_model(resolve_model("tiny", default_cache_dir()), "float32"),
                                   sizes)


@contextlib.contextmanager
def running_on(core: int | None):
    """This thread on ``core`` only, until the block ends (None: as it was); threads it starts
    meanwhile stay there after."""
    if core is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (about a minute)")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (as actors.torch_threads)")
    parser.add_argument("--receive-weights", nargs=2, metavar=("WEIGHTS_ADDRESS", "RAW_ADDRESS"),
                        help=argparse.SUPPRESS)  # the broadcast benchmark's child process
    parser.add_argument("--rounds", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--broadcast-model", action="append", default=None,
                        help="models whose weights part (c) broadcasts (default: tiny and smollm2-135m)")
    parser.add_argument("--bucket-mb", type=int, default=DEFAULT_BUCKET_MB, help="bucket size of part (c)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON (for run_all.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    if args.receive_weights:
        receive_weights(*args.receive_weights, args.rounds, args.broadcast_model[0], args.bucket_mb)
        return
    sizes = QUICK if args.quick else FULL
    # (a) as envhub_bench measures: the server on one core, the client on the other (unpinned, the two
    # met on one core now and then, and the bare rate alone moved between 40k and 67k steps/s). (d)
    # needs a core for the tokenizing threads besides the loop's, as actors have.
    server_core, client_core = cores()
    server, url = start_server([], max_sessions=4 * max(CONCURRENCY_LEVELS), core=server_core)
    tokenizer = load_tokenizer(resolve_model("tiny", default_cache_dir()))
    try:
        with running_on(client_core):
            rows = uvloop.run(part_a(url, tokenizer, sizes))  # the actors' own event loop
        rows += uvloop.run(parts_d_and_b(url, tokenizer, sizes))
    finally:
        server.terminate()
        server.wait(30)
    for model_name in args.broadcast_model or ["tiny", "smollm2-135m"]:
        rows += part_c(sizes, model_name, args.bucket_mb)
    print(f"torch threads {args.torch_threads}, env {ENV_ID}, tiny model float32, "
          f"{'quick' if args.quick else 'full'} sizes {sizes}")
    print_table(rows)
    write_json(args.json, "actor_bench", json_rows(rows))


def json_rows(rows: list[tuple]) -> list[tuple]:
    """(part, setting, figure, baseline, ratio, goal) -> (part and setting, figure, baseline, ratio, goal)."""
    named, part = [], ""
    for row in rows:
        part = row[0] or part  # a continuation row leaves its part empty
        named.append((f"{part}, {row[1]}", *row[2:]))
    return named


if __name__ == "__main__":
    main()
