"""``launch.py --evaluate MODEL``: a trained checkpoint scored on held-out tasks, with no training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from common.protocol import Trajectory
from common.recording import read_messages
from launch import parse_args
from tests.launching import run_launch

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

HELD_OUT_TASKS = 6


def evaluate(model: Path, out: Path, name: str, *extra: str) -> tuple[str, dict, dict[str, list[int]]]:
    """One greedy evaluation; its stdout, summary and each held-out task's token ids."""
    proc = run_launch("--config", "configs/smoke.yaml", "--evaluate", str(model), "--output-dir", str(out),
                      "--run-name", name, "--rollout.eval_greedy", "true", "--learner.eval_samples", "1",
                      "--learner.eval_tasks_per_env", str(HELD_OUT_TASKS), *extra)
    episodes = [m for m in read_messages(out / name / "trajectories" / "trajectories.msgpack")
                if isinstance(m, Trajectory)]
    assert {e.turn_cap for e in episodes} == {5}  # the smoke schedule's longest cap (3, then 5)
    tokens = {e.task_id: e.token_ids.tolist() for e in episodes}
    return proc.stdout, json.loads((out / name / "summary.json").read_text()), tokens


def test_evaluate_scores_a_checkpoint_on_held_out_tasks_only_and_greedy_scores_repeat(smoke_run, tmp_path):
    checkpoint = smoke_run[0] / "checkpoints" / "step_4" / "hf"
    stdout, summary, tokens = evaluate(checkpoint, tmp_path, "first")

    assert summary["step"] == 0 and summary["ledger"]["drawn"] == 0  # no training task was rolled out
    assert summary["ledger"]["eval_completed"] == HELD_OUT_TASKS == len(tokens)
    [held_out] = summary["eval"]
    assert held_out["step"] == 0 and held_out["eval/keydoor-v0/tasks"] == HELD_OUT_TASKS
    assert "held-out keydoor-v0 at step 0: success" in stdout and "AgentGym Avg" in stdout
    resolved = yaml.safe_load((tmp_path / "first" / "config.yaml").read_text())
    assert resolved["model"]["name"] == str(checkpoint.resolve())
    assert not (tmp_path / "first" / "checkpoints").exists()

    # Greedy: another run seed (another actor sampling seed) replays every held-out episode token for token.
    _, again, tokens_again = evaluate(checkpoint, tmp_path, "again", "--run.seed", "5")
    assert tokens_again == tokens
    assert again["eval"][0]["eval/keydoor-v0/success"] == held_out["eval/keydoor-v0/success"]


@pytest.mark.parametrize("flag", [["--max-steps", "3"], ["--resume", "--run-name", "r"], ["--replay", "x"]])
def test_evaluate_refuses_the_flags_of_a_training_run(flag, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--evaluate", "tiny", *flag])
    assert "--evaluate trains nothing" in capsys.readouterr().err


def test_evaluate_plays_at_the_schedules_longest_turn_cap():
    cfg, _ = parse_args(["--evaluate", "tiny", "--learner.horizon.kind", "stepwise",
                         "--learner.horizon.turn_caps", "[2, 4, 7]", "--learner.horizon.boundaries", "[3, 6]"])
    assert (cfg.learner.horizon.kind, cfg.learner.horizon.turn_caps) == ("fixed", [7])
    assert (cfg.run.max_steps, cfg.learner.eval_at_end, cfg.learner.eval_at_start) == (0, True, False)
