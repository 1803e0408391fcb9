"""envhub's TextCraft steps/s on one core, against AgentGym's own TextCraft server on the same load.

Not a test: it prints figures and asserts nothing. It
1. pins each server to one core and itself (the load generator) to another (``os.sched_setaffinity``);
2. for each server, envhub ``textcraft-v0`` over the session channel, the same over HTTP, and
   AgentGym's unmodified ``agentenv-textcraft`` server when its source can be found (the mirror at
   ``$AGENTGYM_REPO``, default /work/.mirror/WooooDyy+AgentGym/repo; skipped with a message if not),
   and for 1, 16, 64 and 256 concurrent sessions, runs the same workload for ``--seconds``: each
   session plays a random policy over the observation's crafting commands (every ``craft`` line,
   ``get`` of each ingredient, ``inventory``), at most 20 steps an episode, then a new episode;
3. reports steps/s and p50/p99 step latency (client side) and the server's CPU per step, each as
   a ratio of AgentGym's rate at the same concurrency (of GET /health when AgentGym is skipped);
4. measures envhub's GET /health rate (the HTTP floor) at 64 concurrent clients;
5. plays ``--memory-episodes`` short episodes (create, 2 steps, close) over the channel, then as
   many again, and reports the server's RSS growth over the second lot (a leak per session would
   show there; the first lot fills the server's bounded memory of the last 65,536 closed ids).

    .venv/bin/python -m tests.bench.envhub_bench [--quick] [--seconds 12] [--sessions 1,16,64,256]
        [--memory-episodes 100000] [--json PATH]

``--quick``: 3 s per run and 10,000 memory episodes; ``--json PATH`` writes the rows for run_all.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp

from envhub.channel_client import make_env_client
from envhub.client import EnvClientError
from tests.bench.run_all import write_json

REPO = Path(__file__).resolve().parents[2]
ENV_ID = "textcraft-v0"
MAX_EPISODE_STEPS = 20
AGENTGYM_REPO = Path(os.environ.get("AGENTGYM_REPO", "/work/.mirror/WooooDyy+AgentGym/repo"))
ROUNDS = 3
"""Turns round the servers per concurrency level (see `interleaved`)."""
_INGREDIENT = re.compile(r"(\d+) ([a-z0-9 _]+)")


@dataclass
class Run:
    """One server at one concurrency: client-side step latencies, the wall time, the server's CPU."""

    server: str
    sessions: int
    latencies_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    episodes: int = 0
    errors: int = 0

    def rate(self) -> float:
        return len(self.latencies_s) / self.wall_s

    def percentile_ms(self, fraction: float) -> float:
        ordered = sorted(self.latencies_s)
        return 1000 * ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")

    def cpu_us_per_step(self) -> float:
        return 1e6 * self.server_cpu_s / max(1, len(self.latencies_s))


def crafting_actions(observation: str) -> list[str]:
    """The random policy's choices: each crafting command, a get of each ingredient, inventory."""
    commands = [line.strip() for line in observation.splitlines() if line.startswith("craft ")]
    ingredients = {f"get {count} {name.strip()}" for command in commands
                   for count, name in _INGREDIENT.findall(command.split(" using ", 1)[1])}
    return commands + sorted(ingredients) + ["inventory"]


# ---------------------------------------------------------------------------------------- servers

def pinned(core: int | None):
    """A Popen ``preexec_fn`` that pins the child to `core` (None: no pinning)."""
    return None if core is None else (lambda: os.sched_setaffinity(0, {core}))


def start_server(overrides: list[str], max_sessions: int, core: int | None = None) -> tuple[subprocess.Popen, str]:
    """An envhub with config overrides, pinned to `core` (None: unpinned; actor_bench and
    webnav_bench use it too)."""
    # A long idle timeout: no session may be reaped while the others are being stepped.
    command = [sys.executable, "-m", "envhub", "serve", "--port", "0", "--max_sessions", str(max_sessions),
               "--session_idle_timeout_s", "600", *overrides]
    server = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=pinned(core))
    ready_line = server.stdout.readline()
    if not ready_line.startswith("envhub listening on "):
        server.kill()
        raise RuntimeError(f"envhub did not start: {ready_line}{server.stderr.read()[-2000:]}")
    return server, ready_line.split()[-1]


def agentgym_source(into: Path) -> Path | None:
    """AgentGym's agentenv-textcraft package extracted from its git mirror into `into`; None if absent."""
    if not (AGENTGYM_REPO / "HEAD").exists():
        return None
    archive = subprocess.run(["git", f"--git-dir={AGENTGYM_REPO}", "archive", "HEAD", "agentenv-textcraft"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "agentenv-textcraft"


def start_agentgym(package_dir: Path, core: int | None) -> tuple[subprocess.Popen, str]:
    """AgentGym's TextCraft server as its ``textcraft`` launcher runs it (uvicorn, one process);
    from its package folder, since it loads ``agentenv_textcraft/recipes`` relative to the cwd."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "uvicorn", "agentenv_textcraft:app", "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(command, cwd=package_dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(package_dir)}, preexec_fn=pinned(core))
    return server, f"http://127.0.0.1:{port}"


async def wait_ready(url: str, server: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline_s:
            if server.poll() is not None:
                raise RuntimeError(f"server at {url} exited: {server.stderr.read()[-2000:]}")
            try:
                async with http.get(url + "/") as response:
                    await response.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.2)
    raise RuntimeError(f"server at {url} not ready after {timeout_s} s")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


# ---------------------------------------------------------------------------------------- drivers

class EnvhubDriver:
    """Episodes on envhub's textcraft-v0 through `EnvClient` (channel or HTTP)."""

    def __init__(self, url: str, transport: str, sessions: int) -> None:
        self.client = make_env_client(url, 120.0, transport)
        self.client._max_connections = max(sessions, 16)  # HTTP: one connection per concurrent session

    async def create(self, task: int) -> tuple[str, str]:
        handle = await self.client.create(ENV_ID, str(task), seed=task)
        return handle.session_id, handle.observation

    async def step(self, session_id: str, command: str) -> bool:
        result = await self.client.step(session_id, f"Action: {command}")
        return result.terminated or result.truncated

    async def close(self, session_id: str) -> None:
        await self.client.close(session_id)

    async def aclose(self) -> None:
        await self.client.aclose()


class AgentGymDriver:
    """Episodes on AgentGym's TextCraft server through its own routes (agentenv_textcraft/server.py:
    POST /create {}, /step {id, action}, /close {id}); its goal is chosen by the env id it assigns."""

    def __init__(self, url: str, sessions: int) -> None:
        self.url = url
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max(sessions, 16)))

    async def _post(self, route: str, body: dict) -> dict:
        async with self.http.post(self.url + route, json=body) as response:
            answer = await response.json()
        if response.status != 200 or (isinstance(answer, dict) and "error" in answer):
            raise EnvClientError(response.status, f"{route}: {answer}")
        return answer

    async def create(self, task: int) -> tuple[int, str]:
        answer = await self._post("/create", {})
        return answer["id"], answer["observation"]

    async def step(self, session_id: int, command: str) -> bool:
        return bool((await self._post("/step", {"id": session_id, "action": command}))["done"])

    async def close(self, session_id: int) -> None:
        await self._post("/close", {"id": session_id})

    async def aclose(self) -> None:
        await self.http.close()


async def play(driver, slot: int, until_s: float, run: Run) -> None:
    """Episodes back to back until `until_s`: random crafting commands, at most 20 steps each."""
    rng, episode = random.Random(slot), 0
    while time.perf_counter() < until_s:
        session_id, observation = await driver.create((slot * 37 + episode) % 500)
        actions, episode = crafting_actions(observation), episode + 1
        try:
            for _ in range(MAX_EPISODE_STEPS):
                started_s = time.perf_counter()
                done = await driver.step(session_id, rng.choice(actions))
                run.latencies_s.append(time.perf_counter() - started_s)
                if done or time.perf_counter() >= until_s:
                    break
        except EnvClientError:
            run.errors += 1
        run.episodes += 1
        await driver.close(session_id)


async def measure(driver, pid: int, seconds: float, run: Run) -> None:
    """Add `seconds` of the workload at ``run.sessions`` concurrent sessions to `run`."""
    cpu_before_s, client_before_s, started_s = cpu_s(pid), time.process_time(), time.perf_counter()
    await asyncio.gather(*(play(driver, slot, started_s + seconds, run) for slot in range(run.sessions)))
    run.wall_s += time.perf_counter() - started_s
    run.server_cpu_s += cpu_s(pid) - cpu_before_s
    run.client_cpu_s += time.process_time() - client_before_s


async def warm_up(driver) -> None:
    """Connections made, recipe tables loaded, before anything is timed."""
    await asyncio.gather(*(play(driver, slot, time.perf_counter() + 0.5, Run("warm-up", 0)) for slot in range(8)))


async def health_rate(url: str, clients: int, seconds: float) -> float:
    client = make_env_client(url, 60.0, "http")
    client._max_connections = clients
    count, until_s = 0, time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < until_s:
            await client.health()
            count += 1

    started_s = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    rate = count / (time.perf_counter() - started_s)
    await client.aclose()
    return rate


async def memory_growth(url: str, pid: int, episodes: int, concurrency: int = 64) -> tuple[float, float]:
    """The server's RSS (MiB) before and after `episodes` short channel episodes (create, 2 steps,
    close), measured after as many again: the server remembers the last 65,536 closed session ids
    (to answer 410 rather than 404), a bounded table (~12 MiB) that the first ones fill."""
    client = make_env_client(url, 120.0, "channel")

    async def play(numbers) -> None:
        for number in numbers:
            handle = await client.create(ENV_ID, str(number % 500), seed=number)
            actions = crafting_actions(handle.observation)
            for step in range(2):
                await client.step(handle.session_id, f"Action: {actions[(number + step) % len(actions)]}")
            await client.close(handle.session_id)

    warm_up = iter(range(episodes))
    await asyncio.gather(*(play(warm_up) for _ in range(concurrency)))
    rss_before = rss_mib(pid)
    measured = iter(range(episodes, 2 * episodes))
    await asyncio.gather(*(play(measured) for _ in range(concurrency)))
    await client.aclose()
    return rss_before, rss_mib(pid)


# ---------------------------------------------------------------------------------------- main

def cores() -> tuple[int | None, int | None]:
    """(server core, load-generator core); None, None on a single core."""
    available = sorted(os.sched_getaffinity(0))
    return (available[0], available[-1]) if len(available) >= 2 else (None, None)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 s per run, 10,000 memory episodes")
    parser.add_argument("--seconds", type=float, help="seconds per run (default 12, --quick 3)")
    parser.add_argument("--sessions", default="1,16,64,256", help="concurrent sessions, comma-separated")
    parser.add_argument("--memory-episodes", type=int, help="episodes of the RSS check (default 100000, "
                                                            "--quick 10000; 0 skips it)")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON (for run_all.py)")
    args = parser.parse_args()
    args.seconds = args.seconds or (3.0 if args.quick else 12.0)
    args.sessions = [int(n) for n in args.sessions.split(",")]
    if args.memory_episodes is None:
        args.memory_episodes = 10_000 if args.quick else 100_000
    return args


@dataclass
class Target:
    """A server under test and how to drive it."""

    name: str
    pid: int
    connect: object
    """(sessions) -> a driver."""


async def interleaved(targets: list[Target], levels: list[int], seconds: float,
                      rounds: int) -> dict[str, list[Run]]:
    """Each level for `seconds` per target, in `rounds` turns round the targets, so that load from
    elsewhere on the machine falls on all of them alike."""
    for target in targets:
        driver = target.connect(8)
        await warm_up(driver)
        await driver.aclose()
    results: dict[str, list[Run]] = {target.name: [] for target in targets}
    for sessions in levels:
        for target in targets:
            results[target.name].append(Run(target.name, sessions))
        for _ in range(rounds):
            for target in targets:
                driver = target.connect(sessions)
                try:
                    await measure(driver, target.pid, seconds / rounds, results[target.name][-1])
                finally:
                    await driver.aclose()
        for target in targets:
            print_run(results[target.name][-1])
    return results


def print_run(run: Run) -> None:
    print(f"  {run.server:<16} {run.sessions:4d} sessions  {run.rate():8.0f} steps/s"
          f"  p50 {run.percentile_ms(0.5):7.1f} ms"
          f"  p99 {run.percentile_ms(0.99):7.1f} ms  CPU/step server {run.cpu_us_per_step():5.0f} us, client "
          f"{1e6 * run.client_cpu_s / max(1, len(run.latencies_s)):5.0f} us (busy {run.server_cpu_s / run.wall_s:.0%}"
          f" / {run.client_cpu_s / run.wall_s:.0%})"
          f"  ({run.episodes} episodes{f', {run.errors} errors' if run.errors else ''})", flush=True)


def main() -> None:
    args = parse_args()
    server_core, load_core = cores()
    if load_core is not None:
        os.sched_setaffinity(0, {load_core})
    print(f"server core {server_core}, load generator core {load_core}; {args.seconds:g} s per run "
          f"in {ROUNDS} interleaved turns")
    servers = []
    try:
        envhub, envhub_url = start_server([], max(args.sessions) + 16, server_core)
        servers.append(envhub)
        targets = [Target("envhub channel", envhub.pid, lambda n: EnvhubDriver(envhub_url, "channel", n)),
                   Target("envhub HTTP", envhub.pid, lambda n: EnvhubDriver(envhub_url, "http", n))]
        with tempfile.TemporaryDirectory() as tmp:
            package = agentgym_source(Path(tmp))
            if package is None:
                print(f"AgentGym baseline skipped: no AgentGym git mirror at {AGENTGYM_REPO} (set AGENTGYM_REPO)")
            else:
                agentgym, agentgym_url = start_agentgym(package, server_core)
                servers.append(agentgym)
                asyncio.run(wait_ready(agentgym_url, agentgym))
                targets.append(Target("AgentGym", agentgym.pid, lambda n: AgentGymDriver(agentgym_url, n)))
            results = asyncio.run(interleaved(targets, args.sessions, args.seconds, ROUNDS))
        floor = asyncio.run(health_rate(envhub_url, 64, min(args.seconds, 4.0)))
    finally:
        for server in servers:
            server.terminate()
            server.wait(30)
    memory = None
    if args.memory_episodes:
        server, url = start_server([], 256, server_core)
        try:
            memory = asyncio.run(memory_growth(url, server.pid, args.memory_episodes))
        finally:
            server.terminate()
            server.wait(30)
    write_json(args.json, "envhub_bench", table_rows(results, floor, memory, args.memory_episodes))


def table_rows(results: dict[str, list[Run]], floor: float, memory: tuple | None, episodes: int) -> list[tuple]:
    """Print and return the rows (figure, value, baseline, ratio, goal): per transport and level, the
    steps/s against AgentGym's (of GET /health without it), then the server CPU per step against
    AgentGym's, which the load elsewhere on a shared machine moves far less than wall-clock rates."""
    rows, baseline = [], results.get("AgentGym")
    for name in ("envhub channel", "envhub HTTP"):
        for index, run in enumerate(results[name]):
            base = baseline[index] if baseline else None
            goal = ">= 5" if base is not None and run.sessions == 256 and name == "envhub channel" else ""
            rows.append((f"textcraft-v0 {name}, {run.sessions} sessions: steps/s",
                         f"{run.rate():.0f} steps/s, p99 {run.percentile_ms(0.99):.1f} ms (server busy "
                         f"{run.server_cpu_s / run.wall_s:.0%})",
                         f"AgentGym {base.rate():.0f} steps/s, p99 {base.percentile_ms(0.99):.0f} ms (busy "
                         f"{base.server_cpu_s / base.wall_s:.0%})" if base else f"GET /health {floor:.0f} req/s",
                         run.rate() / (base.rate() if base else floor), goal))
            if base is not None:
                rows.append((f"textcraft-v0 {name}, {run.sessions} sessions: server CPU per step",
                              f"{run.cpu_us_per_step():.0f} us", f"AgentGym {base.cpu_us_per_step():.0f} us",
                              base.cpu_us_per_step() / run.cpu_us_per_step(), goal))
    rows.append(("envhub GET /health, 64 clients", f"{floor:.0f} req/s", "", 1.0, ""))
    if memory is not None:
        before, after = memory
        rows.append((f"envhub server RSS over {episodes} channel episodes (after {episodes} more)",
                     f"{after:.1f} MiB after", f"{before:.1f} MiB before", after / before, "<= 1.02"))
    print()
    for row in rows:
        print(f"  {row[0]:<62} {row[1]:<48} {row[2]:<48} {row[3]:6.2f} {row[4]}")
    return rows


if __name__ == "__main__":
    main()
