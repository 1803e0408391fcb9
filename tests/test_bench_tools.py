"""The benches start the two ways the docs name them, and run_all's table shows each row once.

Nothing here runs a benchmark: ``--help`` proves a bench imports (the failure a user meets first:
``No module named 'actors'`` when run as a script), and run_all's table is fed rows by a stand-in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.bench import run_all

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO / "tests" / "bench"
HELPERS = {"__init__", "curves"}  # modules the benches import, not benches
BENCHES = sorted(path.stem for path in BENCH_DIR.glob("*.py") if path.stem not in HELPERS)
WAYS = ("python -m", "script")


def help_command(bench: str, way: str) -> list[str]:
    if way == "python -m":
        return [sys.executable, "-m", f"tests.bench.{bench}", "--help"]
    return [sys.executable, str(BENCH_DIR / f"{bench}.py"), "--help"]


@pytest.fixture(scope="module")
def help_runs(tmp_path_factory) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """Every bench's ``--help`` both ways, side by side (each start imports torch: seconds, not minutes).
    A script runs from another folder and without PYTHONPATH: it must find the project by itself."""
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    def run(case: tuple[str, str]) -> tuple[tuple[str, str], subprocess.CompletedProcess]:
        bench, way = case
        return case, subprocess.run(help_command(bench, way), cwd=REPO if way == "python -m" else elsewhere,
                                    env=env, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        return dict(pool.map(run, [(bench, way) for bench in BENCHES for way in WAYS]))


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("bench", BENCHES)
def test_every_bench_starts(help_runs, bench, way):
    proc = help_runs[bench, way]
    assert proc.returncode == 0, f"{' '.join(help_command(bench, way))} failed:\n{proc.stderr[-3000:]}"
    assert proc.stdout.startswith("usage:")


def test_run_all_runs_every_bench():
    assert set(run_all.BENCHES) == {bench for bench in BENCHES if bench.endswith("_bench")}


WEBNAV_ROWS = [(f"webnav-v0 steps/s, {sessions} sessions x 8 steps", f"{sessions * 2.0} steps/s, p50 400 ms",
                "keydoor-v0 150 steps/s", sessions * 2.0 / 150, "") for sessions in (1, 4)]


def rows_through_json(tmp_path: Path, name: str, rows: list[tuple]) -> list[dict]:
    """A bench's rows as run_all gets them: written by the bench with write_json, read back."""
    path = tmp_path / f"{name}.json"
    run_all.write_json(str(path), name, rows)
    return json.loads(path.read_text())


@pytest.mark.parametrize("only", ["webnav_bench", "webnav,webnav_bench"])
def test_the_markdown_table_shows_each_row_once(tmp_path, monkeypatch, capsys, only):
    ran = []

    def stand_in(name: str, quick: bool, timeout_s: float) -> run_all.BenchRun:
        ran.append(name)
        return run_all.BenchRun(name, 1.0, 1.0, rows_through_json(tmp_path, name, WEBNAV_ROWS))

    monkeypatch.setattr(run_all, "run_bench", stand_in)
    monkeypatch.setattr(sys, "argv", ["run_all.py", "--only", only, "--markdown"])
    run_all.main()
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert ran == ["webnav_bench"]
    assert table == [
        "| bench | figure | value | baseline | ratio | goal | met? |",
        "|---|---|---|---|---:|---|---|",
        "| webnav_bench | webnav-v0 steps/s, 1 sessions x 8 steps | 2.0 steps/s, p50 400 ms | keydoor-v0 150 steps/s "
        "| 0.013 |  |  |",
        "| webnav_bench | webnav-v0 steps/s, 4 sessions x 8 steps | 8.0 steps/s, p50 400 ms | keydoor-v0 150 steps/s "
        "| 0.053 |  |  |",
    ]


def test_curves_read_a_runs_tensorboard_and_draw_every_run_into_one_png(tmp_path):
    from PIL import Image

    from common.metrics import MetricsWriter
    from tests.bench.curves import plot_runs, read_run

    runs = {}
    for name, slope in (("staged", 0.03), ("long", 0.01)):
        writer = MetricsWriter(tmp_path / name / "tb")
        for step in range(1, 11):
            writer.scalars({"rollout/success": slope * step, "rollout/valid_action_frac": 0.9,
                            "time/step_s": 2.0}, step)
        for step in (0, 5, 10):
            writer.scalars({"eval/keydoor-v0/success": slope * step,
                            "eval/keydoor-v0/agentgym_avg@n": slope * step}, step)
        writer.close()
        runs[name] = read_run(tmp_path / name / "tb", "keydoor-v0")

    staged = runs["staged"]
    assert staged.steps == list(range(1, 11)) and staged.learner_s[-1] == 20.0
    assert staged.eval_steps == [0, 5, 10] and staged.eval_success == pytest.approx([0.0, 0.15, 0.3])
    assert staged.eval_learner_s() == [0.0, 10.0, 20.0]  # each round at the learner time of its step
    png = plot_runs(runs, tmp_path / "curves.png", "two runs")
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width > 1000
