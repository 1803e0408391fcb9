"""envhub under N concurrent sessions: steps/s, step latency and memory per session.

Not a test: it prints figures and asserts nothing. For each env it
1. starts one envhub server as a subprocess (``python -m envhub serve --port 0``);
2. warms it up (one session: loads shared data such as recipe or level tables);
3. measures the HTTP floor: N concurrent clients calling GET /health, `steps` times each;
4. opens N sessions concurrently and reads the server's RSS before and after
   (memory per session = RSS delta / N);
5. steps every session `steps` times with the env's example actions (a session whose episode
   ends is replaced by a fresh one), timing every step on the client;
6. prints steps/s, p50/p99 step latency, the server's own p50/p99 env time, and steps/s as a
   ratio of the /health floor measured in the same run.

    .venv/bin/python -m tests.bench.envhub_bench [--env textcraft-v0 --env babyai-v0] [--sessions 256]
        [--steps 20] [--quick] [--json PATH] [--envhub.env_options '{textcraft-v0: {...}}']

``--quick``: 64 sessions x 10 steps; ``--json PATH`` also writes the ratios for tests/bench/run_all.py.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from common.config import load_config
from envhub import registry
from envhub.cli import split_overrides
from envhub.client import EnvClient, EnvClientError
from tests.bench.run_all import write_json

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ENVS = ("textcraft-v0", "babyai-v0")


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
        return 1000 * ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def start_server(overrides: list[str], max_sessions: int) -> tuple[subprocess.Popen[str], str]:
    # A long idle timeout: no session may be reaped while the others are being stepped.
    command = [sys.executable, "-m", "envhub", "serve", "--port", "0", "--max_sessions", str(max_sessions),
               "--session_idle_timeout_s", "600", *overrides]
    server = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready_line = server.stdout.readline()
    if not ready_line.startswith("envhub listening on "):
        server.kill()
        raise RuntimeError(f"envhub did not start: {ready_line}{server.stderr.read()[-2000:]}")
    return server, ready_line.split()[-1]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


async def health_floor(client: EnvClient, sessions: int, steps: int) -> Timings:
    async def worker() -> list[float]:
        latencies = []
        for _ in range(steps):
            started_s = time.perf_counter()
            await client.health()
            latencies.append(time.perf_counter() - started_s)
        return latencies

    started_s = time.perf_counter()
    results = await asyncio.gather(*(worker() for _ in range(sessions)))
    return Timings(list(itertools.chain(*results)), time.perf_counter() - started_s)


class SessionSlot:
    """One of the N concurrent sessions; reopens a fresh episode when one ends or fails."""

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
            started_s = time.perf_counter()
            try:
                result = await self.client.step(self.session_id, next(self.actions))
            except EnvClientError as error:
                timings.errors[f"{error.status_code}: {error.message[:120]}"] += 1
                self.session_id = None
                continue
            timings.latencies_s.append(time.perf_counter() - started_s)
            if result.terminated or result.truncated:
                timings.episodes_ended += 1
                await self.close()

    async def close(self) -> None:
        if self.session_id is not None:
            await self.client.close(self.session_id)
            self.session_id = None


async def bench_env(env_id: str, url: str, server_pid: int, options: dict, sessions: int, steps: int) -> tuple:
    splits = registry.task_splits(env_id, **options)
    tasks = [str(n) for n in (splits.get("train") or next(iter(splits.values())))]
    actions = registry.load_env_class(env_id).example_actions or ("look",)
    async with EnvClient(url, timeout_s=120.0, max_connections=sessions) as client:
        warm = SessionSlot(client, env_id, tasks, 0, actions)
        await warm.run(2, Timings([], 1.0))
        await warm.close()
        floor = await health_floor(client, sessions, steps)
        slots = [SessionSlot(client, env_id, tasks, i, actions) for i in range(sessions)]
        rss_before = rss_mib(server_pid)
        await asyncio.gather(*(slot.open() for slot in slots))
        rss_open = rss_mib(server_pid)
        timings = Timings([], 0.0)
        started_s, server_cpu_s, client_cpu_s = time.perf_counter(), cpu_s(server_pid), time.process_time()
        await asyncio.gather(*(slot.run(steps, timings) for slot in slots))
        timings.wall_s = time.perf_counter() - started_s
        timings.server_cpu_s = cpu_s(server_pid) - server_cpu_s
        timings.client_cpu_s = time.process_time() - client_cpu_s
        server_stats = (await client.health())["stats"]["step_latency_s"]
        await asyncio.gather(*(slot.close() for slot in slots))
    return report(env_id, sessions, steps, floor, timings, server_stats, rss_before, rss_open)


def report(env_id: str, sessions: int, steps: int, floor: Timings, timings: Timings, server_stats: dict,
           rss_before: float, rss_open: float) -> tuple:
    """Print the env's figures; return its row (figure, value, baseline, ratio, goal)."""
    print(f"\n{env_id}: {sessions} concurrent sessions x {steps} steps "
          f"({len(timings.latencies_s)} steps, {timings.episodes_ended} episodes ended, "
          f"{sum(timings.errors.values())} errors)")
    for error, count in timings.errors.most_common():
        print(f"  error x{count}: {error}")
    print(f"  env steps       {timings.rate():9.0f} steps/s   p50 {timings.percentile_ms(0.5):7.1f} ms"
          f"   p99 {timings.percentile_ms(0.99):7.1f} ms   (client-side)")
    print(f"  env time        {'':9}           p50 {1000 * server_stats['p50']:7.2f} ms"
          f"   p99 {1000 * server_stats['p99']:7.2f} ms   (server-side, inside env.step)")
    print(f"  GET /health     {floor.rate():9.0f} req/s     p50 {floor.percentile_ms(0.5):7.1f} ms"
          f"   p99 {floor.percentile_ms(0.99):7.1f} ms   (HTTP floor, same concurrency)")
    print(f"  ratio           {timings.rate() / floor.rate():9.2f} x the HTTP floor")
    print(f"  CPU per step    {1e6 * timings.server_cpu_s / len(timings.latencies_s):9.0f} us server, "
          f"{1e6 * timings.client_cpu_s / len(timings.latencies_s):.0f} us client (busy "
          f"{timings.server_cpu_s / timings.wall_s:.0%} / {timings.client_cpu_s / timings.wall_s:.0%} of one core)")
    print(f"  server RSS      {rss_before:9.1f} MiB idle -> {rss_open:.1f} MiB with {sessions} open: "
          f"{1024 * (rss_open - rss_before) / sessions:.1f} KiB per session")
    errors = sum(timings.errors.values())
    return (f"{env_id} steps/s, {sessions} sessions x {steps} steps",
            f"{timings.rate():.0f} steps/s, p50 {timings.percentile_ms(0.5):.1f} ms"
            f"{f', {errors} errors' if errors else ''}",
            f"GET /health {floor.rate():.0f} req/s", timings.rate() / floor.rate(), "")


def main() -> None:
    own, overrides = split_overrides(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", action="append", dest="envs", help=f"env id (repeatable; default {DEFAULT_ENVS})")
    parser.add_argument("--sessions", type=int, help="concurrent sessions (default 256, --quick 64)")
    parser.add_argument("--steps", type=int, help="steps per session (default 20, --quick 10)")
    parser.add_argument("--quick", action="store_true", help="fewer sessions and steps")
    parser.add_argument("--json", metavar="PATH", help="also write the ratios as JSON (for run_all.py)")
    args = parser.parse_args(own)
    args.sessions = args.sessions or (64 if args.quick else 256)
    args.steps = args.steps or (10 if args.quick else 20)
    rows = []
    env_options = load_config(None, overrides).envhub.env_options
    known = {env_spec.id for env_spec in registry.list_specs()}
    for env_id in args.envs or DEFAULT_ENVS:
        if env_id not in known:
            print(f"\n{env_id}: not registered here; skipped (registered: {', '.join(sorted(known))})")
            continue
        server, url = start_server(overrides, max_sessions=args.sessions + 16)
        try:
            rows.append(asyncio.run(bench_env(env_id, url, server.pid, dict(env_options.get(env_id, {})),
                                              args.sessions, args.steps)))
        finally:
            server.terminate()
            server.wait(30)
    write_json(args.json, "envhub_bench", rows)


if __name__ == "__main__":
    main()
