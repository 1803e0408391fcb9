"""Every benchmark of the project in one run, and one table of their ratios.

Not a test: it asserts nothing. It
1. runs each bench of ``tests/bench/`` as its own subprocess, one after another
   (``python -m tests.bench.<name> [--quick] --json <tmpfile>``, from the repo root), printing a
   progress line with its wall time;
2. reads the rows each bench wrote (every figure as a ratio against a baseline measured in the
   same bench run) and prints them as one table: bench | figure | value | baseline | ratio | goal | met?;
   a bench that fails or times out is a "failed" row with its last stderr lines, and the others still run;
3. prints the machine it ran on (CPU model, cores, memory, load, Python, torch, date).

``--quick`` runs every bench's small mode (a few minutes on a quiet 2-core machine) and leaves out
the ones with none (``FULL_ONLY``);
``--markdown`` prints the table as markdown (the README's performance section).

    .venv/bin/python tests/bench/run_all.py [--quick] [--only envhub_bench,actor_bench] [--markdown]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

REPO = Path(__file__).resolve().parents[2]
BENCHES = ("envhub_bench", "actor_bench", "memory_growth_bench", "engine_bench", "learner_bench",
           "learner_memory_bench", "async_bench", "ingest_bench", "webnav_bench", "format_bench", "learning_bench")
FULL_ONLY = ("learning_bench",)
"""Benches with no small mode (two learning runs take ~9 minutes): left out of ``--quick``."""
COLUMNS = ("bench", "figure", "value", "baseline", "ratio", "goal", "met?")
STDERR_LINES = 3
"""Last stderr lines of a failed bench shown in its table row."""
BENCH_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "GLOO_SOCKET_IFNAME": "lo",
             "TOKENIZERS_PARALLELISM": "false"}
"""As tests/conftest.py: every service on loopback, Ray kept local."""


def write_json(path: str | None, bench: str, rows: list[tuple]) -> None:
    """Write a bench's rows, each (figure, value, baseline, ratio, goal), as the JSON list run_all reads."""
    if not path:
        return
    records = [{"bench": bench, "figure": " ".join(str(figure).split()), "value": " ".join(str(value).split()),
                "baseline": " ".join(str(baseline).split()), "ratio": float(ratio), "goal": goal}
               for figure, value, baseline, ratio, goal in rows]
    Path(path).write_text(json.dumps(records, indent=1) + "\n")


@dataclass
class BenchRun:
    """One bench subprocess: its rows, or why it has none."""

    name: str
    wall_s: float
    cpu_s: float
    """CPU seconds of the bench and the descendants it waited for (less sensitive to other load than wall_s)."""
    rows: list[dict]
    failure: str = ""
    """Empty when the bench ran; else what went wrong."""
    stderr_tail: str = ""
    """The last stderr lines of a failed bench."""


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_in_own_group(command: list[str], timeout_s: float) -> tuple[int | None, str]:
    """Exit code (None on timeout) and stderr of a bench run in its own process group, so that a timeout
    or Ctrl-C also ends what it started (envhub servers, browsers, Ray)."""
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **BENCH_ENV}, start_new_session=True)
    try:
        stderr = proc.communicate(timeout=timeout_s)[1]
        return proc.returncode, stderr
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return None, proc.communicate(timeout=30)[1]
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def run_bench(name: str, quick: bool, timeout_s: float) -> BenchRun:
    cpu_before_s = children_cpu_s()
    with tempfile.TemporaryDirectory() as tmp:
        json_path = Path(tmp) / f"{name}.json"
        command = [sys.executable, "-m", f"tests.bench.{name}", *(["--quick"] if quick else []),
                   "--json", str(json_path)]
        started_s = time.perf_counter()

        def ran(rows: list[dict], failure: str = "", stderr: str = "") -> BenchRun:
            tail = [line.strip() for line in stderr.splitlines() if line.strip()][-STDERR_LINES:]
            return BenchRun(name, time.perf_counter() - started_s, children_cpu_s() - cpu_before_s, rows,
                            failure, " / ".join(tail))

        returncode, stderr = run_in_own_group(command, timeout_s)
        if returncode is None:
            return ran([], f"timed out after {timeout_s:.0f} s", stderr)
        if returncode != 0:
            return ran([], f"exit code {returncode}", stderr)
        if not json_path.exists():
            return ran([], "wrote no rows", stderr)
        return ran(json.loads(json_path.read_text()))


def goal_met(goal: str, ratio: float) -> str:
    """Whether the ratio meets a goal such as ">= 0.5": "yes", "no", or empty when there is no goal."""
    match = re.fullmatch(r"\s*(>=|<=|>|<)\s*([0-9.]+)\s*x?\s*", goal or "")
    if not match:
        return ""
    op, bound = match.group(1), float(match.group(2))
    met = {">=": ratio >= bound, "<=": ratio <= bound, ">": ratio > bound, "<": ratio < bound}[op]
    return "yes" if met else "no"


def table_cells(runs: list[BenchRun]) -> list[tuple[str, ...]]:
    cells = []
    for run in runs:
        if run.failure:
            cells.append((run.name, f"FAILED ({run.failure})", run.stderr_tail, "", "", "", ""))
        for row in run.rows:
            ratio = row["ratio"]
            cells.append((run.name, row["figure"], row["value"], row["baseline"],
                          f"{ratio:.2f}" if abs(ratio) >= 0.1 else f"{ratio:.2g}", row["goal"],
                          goal_met(row["goal"], ratio)))
    return cells


def print_table(cells: list[tuple[str, ...]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "|".join("---:" if column == "ratio" else "---" for column in COLUMNS) + "|")
        for line in cells:
            print("| " + " | ".join(cell.replace("|", "\\|") for cell in line) + " |")
        return
    lines = [COLUMNS, *cells]
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    for line in lines:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


def machine_description() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    models = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    cpu = models[0].strip() if models else platform.processor() or platform.machine()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    mem_kib = re.search(r"^MemTotal:\s*(\d+)", meminfo, re.MULTILINE)
    memory = f"{int(mem_kib.group(1)) / 2**20:.0f} GiB" if mem_kib else "unknown"
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "not installed"
    load = " ".join(f"{value:.1f}" for value in os.getloadavg())
    return (f"{cpu}, {cores} cores, {memory} memory, load average {load} at the start; "
            f"Python {platform.python_version()}, torch {torch_version}, "
            f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every bench's small mode (a few minutes)")
    parser.add_argument("--only", type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
                        default=list(BENCHES), metavar="NAME[,NAME]", help=f"benches to run, of {', '.join(BENCHES)}")
    parser.add_argument("--markdown", action="store_true", help="print the combined table as markdown")
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="wall-clock limit per bench")
    args = parser.parse_args()
    # Once each, in the order given: `--only webnav,webnav_bench` must not run a bench (and print its rows) twice.
    args.only = list(dict.fromkeys(name if name.endswith("_bench") else f"{name}_bench" for name in args.only))
    unknown = sorted(set(args.only) - set(BENCHES))
    if unknown:
        parser.error(f"unknown bench {', '.join(unknown)}; known: {', '.join(BENCHES)}")
    return args


def main() -> None:
    args = parse_args()
    machine = machine_description()  # the load average before the benches add to it
    runs, started_s = [], time.perf_counter()
    for name in args.only:
        if args.quick and name in FULL_ONLY:
            print(f"{name:<14} not run with --quick (no small mode)", flush=True)
            continue
        print(f"{name:<14} ...", end="", flush=True)
        run = run_bench(name, args.quick, args.timeout_s)
        runs.append(run)
        print(f" {run.wall_s:6.1f} s wall, {run.cpu_s:6.1f} s CPU  "
              f"{'FAILED' if run.failure else f'{len(run.rows)} rows'}", flush=True)
    print(f"total {time.perf_counter() - started_s:.1f} s wall, {sum(run.cpu_s for run in runs):.1f} s CPU"
          f"{' (--quick)' if args.quick else ''}\n")
    print_table(table_cells(runs), args.markdown)
    print(f"\n{'Measured on: ' if args.markdown else 'machine: '}{machine}")
    if any(run.failure for run in runs):
        sys.exit(1)


if __name__ == "__main__":
    main()
