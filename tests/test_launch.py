"""The launcher fails fast and says where, and Ctrl-C stops a run cleanly."""

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

REPO = Path(__file__).resolve().parents[1]


def launch(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "launch.py", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)


def test_unknown_config_key_fails_before_starting_anything(tmp_path):
    proc = launch("--config", "configs/smoke.yaml", "--output-dir", str(tmp_path), "--learner.learning_rate", "1")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "learner.learning_rate" in out and "groups_per_step" in out
    assert not any(tmp_path.iterdir()), "no run folder for a config that does not load"


def test_a_dying_role_stops_the_run_and_points_at_its_log(tmp_path):
    proc = launch("--config", "configs/smoke.yaml", "--output-dir", str(tmp_path), "--run-name", "bad",
                  "--rollout.envs", "[no-such-env-v0]")
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 1, out
    log_path = tmp_path / "bad" / "logs" / "learner-0.log"
    assert "FAILED: learner-0" in out and str(log_path) in out, out
    assert "no-such-env-v0" in out, out  # the log's last lines name the cause
    assert "no-such-env-v0" in log_path.read_text(), out


def test_an_actor_that_dies_of_its_config_fails_the_run_without_restarts(tmp_path):
    proc = launch("--config", "configs/smoke.yaml", "--output-dir", str(tmp_path), "--run-name", "examples",
                  "--rollout.num_examples", "99")
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 1, out
    assert "FAILED: actor-" in out and "99 asked for" in out, out
    assert "restarting" not in out, out  # it would die the same way every time


def launch_as_background_job(*args: str) -> subprocess.Popen:
    """As ``nohup python launch.py ... &`` starts it: a shell starts background jobs with SIGINT
    ignored, which Python keeps unless the program sets it (a suite started that way once hung here)."""
    command = " ".join(shlex.quote(a) for a in (sys.executable, "launch.py", *args))
    return subprocess.Popen(["sh", "-c", f"trap '' INT; exec {command}"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.fixture
def killed_at_teardown():
    """Register a run started in its own session: one a failed test left running is killed."""
    procs: list[subprocess.Popen] = []
    yield procs.append
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_ctrl_c_saves_and_shuts_everything_down(tmp_path, killed_at_teardown):
    # A terminal's Ctrl-C reaches the whole process group: simulate exactly that.
    proc = launch_as_background_job("--config", "configs/smoke.yaml", "--output-dir", str(tmp_path),
                                    "--run-name", "int", "--max-steps", "1000")
    killed_at_teardown(proc)
    lines = []
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("step ") or not line:
            break
    assert any(ln.startswith("step ") for ln in lines), "".join(lines)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(lines) + out
    assert "stopped at step" in out
    checkpoints = list((tmp_path / "int" / "checkpoints").glob("step_*/COMPLETE"))
    assert checkpoints, "the learner saves a checkpoint on Ctrl-C"


def test_kill_stops_a_stalled_run_within_the_graceful_timeout(tmp_path, killed_at_teardown):
    """Leases that expire before any episode can finish: no group ever trains, the run stalls
    (its log says why: every group dropped untrained), and a plain ``kill`` (SIGTERM, to the
    launcher alone) still stops it cleanly."""
    proc = launch("--config", "configs/smoke.yaml", "--output-dir", str(tmp_path), "--run-name", "stall",
                  "--max-steps", "1000", "--learner.lease_timeout_s", "1.0", "--learner.eval_at_start", "false",
                  "--learner.eval_every", "0", "--learner.eval_at_end", "false", start_new_session=True)
    killed_at_teardown(proc)
    lines = []
    while not any("waiting for the first batch" in ln for ln in lines):
        line = proc.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
    learner_log = tmp_path / "stall" / "logs" / "learner-0.log"
    deadline = time.monotonic() + 120
    while "no ok episode" not in learner_log.read_text():  # stalled, and saying why
        assert time.monotonic() < deadline and proc.poll() is None, learner_log.read_text()
        time.sleep(0.5)
    proc.terminate()
    interrupted = time.monotonic()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, "".join(lines) + out
    assert "interrupted (SIGTERM)" in out and "stopped at step 0" in out, out
    assert time.monotonic() - interrupted < 60, out
