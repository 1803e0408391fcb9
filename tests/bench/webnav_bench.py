"""webnav-v0 under N concurrent sessions: steps/s, step and reset latency, memory per session.

Not a test: it prints figures and asserts nothing. It
1. starts one envhub server as a subprocess (``python -m envhub serve --port 0``); the browser
   (Chromium via Playwright) and the offline sites (mounted at /sites) run inside it;
2. warms it up with one scripted episode (launches Chromium, builds the sites' template);
3. measures a baseline in the same run: keydoor-v0 steps at the same concurrency (the cost of
   the HTTP path and the session machinery with a trivial env);
4. for each N in ``--sessions``: reads the proportional memory (PSS) of the server's whole
   process tree (server + Chromium processes) with no session open, opens N sessions, reads it
   again (memory per session = delta / N); then N workers each drive the scripted policy
   (envhub/envs/webnav/scripted.py) over the train tasks for ``--steps`` steps, a finished episode
   replaced by the next task; every step and reset is timed on the client;
5. prints steps/s, p50/p99 step latency, p50 reset latency, steps/s as a ratio of keydoor-v0's,
   and the per-session figures.

    .venv/bin/python -m tests.bench.webnav_bench [--sessions 1 8] [--steps 30] [--quick] [--json PATH]
        [--envhub.env_options '{webnav-v0: {viewport_only: false}}']

``--quick``: 1 and 4 sessions x 8 steps; ``--json PATH`` also writes the ratios as JSON for
tests/bench/run_all.py.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common.config import load_config
from common.config.command_line import split_overrides
from envhub import registry
from envhub.base import StepResult
from envhub.client import EnvClient, EnvClientError
from envhub.envs.webnav.scripted import ScriptedPolicy
from tests.bench.envhub_bench import cpu_s, start_server
from tests.bench.run_all import write_json
from tests.processes import process_tree

ENV_ID = "webnav-v0"


@dataclass
class Timings:
    """Client-side latencies of one phase and its wall time."""

    latencies_s: list[float]
    wall_s: float
    errors: Counter[str] = field(default_factory=Counter)
    episodes_ended: int = 0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    def rate(self) -> float:
        return len(self.latencies_s) / self.wall_s

    def percentile_ms(self, fraction: float) -> float:
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def tree_pss_mib(root: int) -> tuple[float, int]:
    """Proportional set size of the process tree (shared pages split among their users) and its size."""
    total_kib, count = 0, 0
    for pid in process_tree(root):
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        count += 1
        total_kib += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return total_kib / 1024, count


def tree_cpu_s(root: int) -> float:
    """CPU seconds of the process tree so far, reaped children included (Chromium's renderers come
    and go; their time moves into their parent's count when they exit)."""
    total = 0
    for pid in process_tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


class _Session:
    """One concurrent session of a bench: a timed step, and a close."""

    client: EnvClient
    session_id: str | None

    async def _timed_step(self, action: str, timings: Timings) -> StepResult | None:
        """The step's result, its latency counted; None (the error counted, the session dropped) on an error."""
        assert self.session_id is not None
        started_s = time.perf_counter()
        try:
            result = await self.client.step(self.session_id, action)
        except EnvClientError as error:
            timings.errors[f"{error.status_code}: {error.message[:120]}"] += 1
            self.session_id = None
            return None
        timings.latencies_s.append(time.perf_counter() - started_s)
        return result

    async def close(self) -> None:
        if self.session_id is not None:
            await self.client.close(self.session_id)
            self.session_id = None


class ScriptedWorker(_Session):
    """One concurrent session driving the scripted policy; opens the next task when an episode ends."""

    def __init__(self, client: EnvClient, tasks: list[int], index: int) -> None:
        self.client, self.tasks, self.index = client, tasks, index
        self.session_id: str | None = None
        self.observation = ""
        self.policy: ScriptedPolicy | None = None
        self.opened = 0

    async def open(self, resets: Timings) -> None:
        task_id = self.tasks[(self.index * 5 + self.opened) % len(self.tasks)]
        self.opened += 1
        started_s = time.perf_counter()
        handle = await self.client.create(ENV_ID, str(task_id), seed=0)
        resets.latencies_s.append(time.perf_counter() - started_s)
        self.session_id, self.observation, self.policy = handle.session_id, handle.observation, ScriptedPolicy(task_id)

    async def run(self, steps: int, timings: Timings, resets: Timings) -> None:
        for _ in range(steps):
            if self.session_id is None:
                await self.open(resets)
            assert self.policy is not None
            result = await self._timed_step(self.policy.act(self.observation), timings)
            if result is None:
                continue
            self.observation = result.observation
            if result.terminated:
                timings.episodes_ended += 1
                await self.close()


class SessionSlot(_Session):
    """One of the baseline's concurrent keydoor-v0 sessions, cycling the env's example actions;
    reopens a fresh episode when one ends or fails."""

    def __init__(self, client: EnvClient, env_id: str, tasks: list[str], index: int, actions: tuple[str, ...]):
        self.client, self.env_id, self.tasks, self.index = client, env_id, tasks, index
        self.actions = itertools.cycle(actions[index % len(actions):] + actions[:index % len(actions)])
        self.session_id: str | None = None
        self.opened = 0

    async def open(self) -> None:
        task_id = self.tasks[(self.index + self.opened * 7919) % len(self.tasks)]
        self.opened += 1
        self.session_id = (await self.client.create(self.env_id, task_id, seed=self.index)).session_id

    async def run(self, steps: int, timings: Timings) -> None:
        for _ in range(steps):
            if self.session_id is None:
                await self.open()
            result = await self._timed_step(next(self.actions), timings)
            if result is not None and (result.terminated or result.truncated):
                timings.episodes_ended += 1
                await self.close()


async def keydoor_baseline(client: EnvClient, sessions: int, steps: int) -> Timings:
    tasks = registry.task_ids("keydoor-v0", "train")[:1000]
    actions = registry.load_env_class("keydoor-v0").example_actions
    slots = [SessionSlot(client, "keydoor-v0", tasks, index, actions) for index in range(sessions)]
    timings, started_s = Timings([], 0.0), time.perf_counter()
    await asyncio.gather(*(slot.run(steps, timings) for slot in slots))
    timings.wall_s = time.perf_counter() - started_s
    await asyncio.gather(*(slot.close() for slot in slots))
    return timings


async def bench_round(client: EnvClient, server_pid: int, tasks: list[int], sessions: int, steps: int) -> tuple:
    workers = [ScriptedWorker(client, tasks, index) for index in range(sessions)]
    timings, resets = Timings([], 0.0), Timings([], 1.0)
    idle_mib, idle_processes = tree_pss_mib(server_pid)
    await asyncio.gather(*(worker.open(resets) for worker in workers))
    open_mib, open_processes = tree_pss_mib(server_pid)
    started_s, server_cpu_s, tree_cpu_start_s = time.perf_counter(), cpu_s(server_pid), tree_cpu_s(server_pid)
    await asyncio.gather(*(worker.run(steps, timings, resets) for worker in workers))
    timings.wall_s = time.perf_counter() - started_s
    timings.server_cpu_s = cpu_s(server_pid) - server_cpu_s
    timings.client_cpu_s = tree_cpu_s(server_pid) - tree_cpu_start_s  # here: server + browser processes
    busy_mib, _ = tree_pss_mib(server_pid)
    await asyncio.gather(*(worker.close() for worker in workers))
    baseline = await keydoor_baseline(client, sessions, steps)
    report(sessions, timings, resets, baseline, (idle_mib, open_mib, busy_mib), (idle_processes, open_processes))
    errors = sum(timings.errors.values())
    return (f"{ENV_ID} steps/s, {sessions} sessions x {steps} steps",
            f"{timings.rate():.1f} steps/s, p50 {timings.percentile_ms(0.5):.0f} ms, "
            f"reset p50 {resets.percentile_ms(0.5):.0f} ms{f', {errors} errors' if errors else ''}",
            f"keydoor-v0 {baseline.rate():.0f} steps/s", timings.rate() / baseline.rate(), "")


def report(sessions: int, timings: Timings, resets: Timings, baseline: Timings, memory_mib: tuple[float, ...],
           processes: tuple[int, int]) -> None:
    idle_mib, open_mib, busy_mib = memory_mib
    steps = len(timings.latencies_s)
    print(f"\n{ENV_ID}: {sessions} concurrent sessions ({steps} steps, {timings.episodes_ended} episodes ended, "
          f"{sum(timings.errors.values())} errors)")
    for error, count in timings.errors.most_common():
        print(f"  error x{count}: {error}")
    print(f"  env steps       {timings.rate():9.1f} steps/s   p50 {timings.percentile_ms(0.5):7.1f} ms"
          f"   p99 {timings.percentile_ms(0.99):7.1f} ms   ({timings.rate() / sessions:.1f} steps/s per session)")
    print(f"  resets          {len(resets.latencies_s):9d}           p50 {resets.percentile_ms(0.5):7.1f} ms"
          f"   p99 {resets.percentile_ms(0.99):7.1f} ms")
    print(f"  keydoor-v0      {baseline.rate():9.1f} steps/s   p50 {baseline.percentile_ms(0.5):7.1f} ms"
          f"   (same server and concurrency)")
    print(f"  ratio           {timings.rate() / baseline.rate():9.3f} x keydoor-v0's steps/s")
    tree_ms = 1000 * timings.client_cpu_s / max(steps, 1)
    print(f"  CPU per step    {tree_ms:9.1f} ms (server + browser processes; resets and evaluation included), "
          f"{1000 * timings.server_cpu_s / max(steps, 1):.1f} ms in the server process: "
          f"~{1000 / max(tree_ms, 1e-9):.0f} steps/s per busy core")
    print(f"  memory (PSS)    {idle_mib:9.0f} MiB idle ({processes[0]} processes) -> {open_mib:.0f} MiB with "
          f"{sessions} open ({processes[1]} processes) -> {busy_mib:.0f} MiB after stepping")
    print(f"  per session     {(open_mib - idle_mib) / sessions:9.1f} MiB open, "
          f"{(busy_mib - idle_mib) / sessions:.1f} MiB after stepping")


async def bench(url: str, server_pid: int, options: dict, session_counts: list[int], steps: int) -> list[tuple]:
    tasks = [int(n) for n in registry.task_ids(ENV_ID, "train", **options)]
    async with EnvClient(url, timeout_s=120.0, max_connections=max(session_counts) * 2) as client:
        warm = ScriptedWorker(client, tasks, 0)
        await warm.run(8, Timings([], 1.0), Timings([], 1.0))
        await warm.close()
        return [await bench_round(client, server_pid, tasks, sessions, steps) for sessions in session_counts]


def main() -> None:
    own, overrides = split_overrides(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+",
                        help="concurrent sessions, one round each (default 1 8, --quick 1 4)")
    parser.add_argument("--steps", type=int, help="steps per session per round (default 30, --quick 8)")
    parser.add_argument("--quick", action="store_true", help="fewer sessions and steps")
    parser.add_argument("--json", metavar="PATH", help="also write the ratios as JSON (for run_all.py)")
    args = parser.parse_args(own)
    args.sessions = args.sessions or ([1, 4] if args.quick else [1, 8])
    args.steps = args.steps or (8 if args.quick else 30)
    options = dict(load_config(None, overrides).envhub.env_options.get(ENV_ID, {}))
    server, url = start_server(["--step_timeout_s", "60", *overrides], max_sessions=max(args.sessions) + 16)
    try:
        rows = asyncio.run(bench(url, server.pid, options, args.sessions, args.steps))
    finally:
        server.terminate()
        server.wait(30)
    write_json(args.json, "webnav_bench", rows)


if __name__ == "__main__":
    main()
