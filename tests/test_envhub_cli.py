"""``python -m envhub``: check, tasks and list as a user runs them (subprocesses), and exit codes."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from common.config.command_line import split_overrides
from envhub import cli, fidelity

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

REPO = Path(__file__).resolve().parents[1]


def envhub_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envhub", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("mode", [[], ["--http"]], ids=["in-process", "over-http"])
def test_check_passes_keydoor_and_reports_the_win(mode: list[str]) -> None:
    result = envhub_cli("check", "keydoor-v0", "--task", "10003", "--seed", "2", *mode)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("PASS keydoor-v0") and "task 10003, seed 2" in result.stdout
    assert "success=True" in result.stdout


def test_check_fails_with_exit_1_when_the_env_raises() -> None:
    with socket.socket() as closed_port:  # bound, never listening: the AgentGym server is unreachable
        closed_port.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed_port.getsockname()[1]}"
        result = envhub_cli("check", "agentgym-v0", "--envhub.env_options",
                            f"{{agentgym-v0: {{url: '{url}', num_tasks: 3}}}}")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("FAIL agentgym-v0") and "/create failed" in result.stdout


def test_tasks_prints_counts_per_split_including_option_dependent_ones() -> None:
    keydoor = envhub_cli("tasks", "keydoor-v0")
    assert keydoor.returncode == 0, keydoor.stderr
    assert "train           10000 tasks  0..9999" in keydoor.stdout
    assert "test             1000 tasks  10000..10999" in keydoor.stdout
    agentgym = envhub_cli("tasks", "agentgym-v0", "--envhub.env_options",
                          "{agentgym-v0: {url: 'http://127.0.0.1:9', splits: {train: [0, 400], test: [400, 450]}}}")
    assert agentgym.returncode == 0, agentgym.stderr
    assert "train             400 tasks" in agentgym.stdout and "test               50 tasks" in agentgym.stdout


@pytest.mark.parametrize("args, message", [
    (["check", "nosuch-v0"], "unknown env id 'nosuch-v0'; registered envs: "),
    (["tasks", "nosuch-v0"], "unknown env id 'nosuch-v0'; registered envs: "),
    (["check", "keydoor-v0", "--task", "99999"], "keydoor-v0 has no task '99999'; tasks: train: 0..9999"),
    (["tasks", "agentgym-v0"], "agentgym-v0: cannot list its tasks"),
    (["check", "--dialect", "agentgym", "keydoor-v0"], "keydoor-v0 has no AgentGym fidelity cases"),
    (["check", "keydoor-v0", "textcraft-v0"], "check takes one ENV_ID"),
    (["check", "--dialect", "agentgym", "textcraft-v0", "--http"], "--http, --task and --action do not apply"),
    (["tasks", "keydoor-v0", "--envhub.no_such_key", "1"], "unknown config key 'envhub.no_such_key'"),
])
def test_usage_errors_exit_2_with_a_clear_message(args: list[str], message: str) -> None:
    result = envhub_cli(*args)
    assert result.returncode == 2 and message in result.stderr, result.stdout + result.stderr
    if "registered envs" in message:
        assert "keydoor-v0" in result.stderr


def test_list_names_every_registered_env() -> None:
    result = envhub_cli("list")
    assert result.returncode == 0, result.stderr
    assert any(line.startswith("keydoor-v0") and "train 10000" in line for line in result.stdout.splitlines())
    assert "agentgym-v0" in result.stdout


def test_serve_starts_a_server_that_answers_health() -> None:
    server = subprocess.Popen([sys.executable, "-m", "envhub", "serve", "--port", "0"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready_line = server.stdout.readline()
        assert ready_line.startswith("envhub listening on http://127.0.0.1:"), server.stderr.read()
        url = ready_line.split()[-1]
        health = httpx.get(f"{url}/health", timeout=10, trust_env=False).json()
        assert health["status"] == "ok" and health["sessions"] == 0
    finally:
        server.terminate()
        server.wait(30)


def test_overrides_are_split_from_the_cli_flags() -> None:
    own, overrides = split_overrides(["check", "a-v0", "--envhub.env_options", "{a-v0: {}}", "--seed", "3",
                                      "--run.seed=4"])
    assert own == ["check", "a-v0", "--seed", "3"]
    assert overrides == ["--envhub.env_options", "{a-v0: {}}", "--run.seed=4"]


def test_check_dialect_agentgym_plays_the_fidelity_cases_and_reports_each() -> None:
    result = envhub_cli("check", "--dialect", "agentgym", "textcraft-v0")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("PASS textcraft-v0 ") for line in lines), result.stdout


def test_check_dialect_agentgym_fails_naming_the_step_that_differs(monkeypatch, capsys) -> None:
    case = fidelity.cases_for("textcraft-v0")[0]
    wrong = dataclasses.replace(case.steps[0], observation="not what the env says", score=7.0)
    monkeypatch.setattr(fidelity, "cases_for", lambda env_id: [dataclasses.replace(case, steps=(wrong,))])
    assert cli.main(["check", "--dialect", "agentgym", "textcraft-v0"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"FAIL textcraft-v0 {case.name}") and "step 1" in out
    assert "AgentGym's 'not what the env says'" in out and "AgentGym's 7.0" in out


def test_an_agentgym_server_named_in_env_options_is_an_env_of_its_own() -> None:
    servers = ("{agentgym-shop-v0: {url: 'http://127.0.0.1:9', family: webshop, num_tasks: 7}, "
               "agentgym-craft-v0: {url: 'http://127.0.0.1:9', family: textcraft, num_tasks: 3}}")
    result = envhub_cli("list", "--envhub.env_options", servers)
    assert result.returncode == 0, result.stderr
    assert "agentgym-shop-v0" in result.stdout and "train 7" in result.stdout and "agentgym-craft-v0" in result.stdout
    bad = envhub_cli("list", "--envhub.env_options", "{agentgym-shop-v0: {url: 'http://127.0.0.1:9'}}")
    assert bad.returncode == 2 and "needs at least url and family" in bad.stderr
