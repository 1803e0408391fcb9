"""The dry run's actor GPU memory line: parameter counts match Qwen2's published sizes, and the line adds up."""

from __future__ import annotations

import re

import pytest

from common.config import load_config
from common.model_geometry import kv_bytes_per_token, parameter_counts
from launcher.gpu_memory import actor_gpu_memory
from tests.gpu.check import SHAPES, VOCAB_SIZE
from tests.launching import REPO
from tests.test_placement import dry_run

PUBLISHED_PARAMS = {"qwen2-0.5b": 0.49e9, "qwen2-1.5b": 1.54e9, "qwen2-7b": 7.62e9}  # Qwen2 technical report


@pytest.mark.parametrize("name", list(SHAPES))
def test_parameter_counts_match_the_published_model_sizes(name):
    params, layer = parameter_counts(dict(SHAPES[name], vocab_size=VOCAB_SIZE))
    assert params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)
    assert layer * SHAPES[name]["num_hidden_layers"] < params


def test_a_7b_actor_line_adds_weights_buffers_and_kv_cache():
    cfg = load_config(REPO / "configs" / "default.yaml")
    model = dict(SHAPES["qwen2-7b"], vocab_size=VOCAB_SIZE)
    line = actor_gpu_memory(model, cfg)
    weights, receive, kv, total = (float(x) for x in re.findall(r"([\d.]+) GiB", line))
    assert weights == pytest.approx(7.62e9 * 2 / 2**30, rel=0.01)  # bf16
    tokens = cfg.actors.max_concurrent_episodes * cfg.rollout.max_episode_tokens
    assert kv == pytest.approx(kv_bytes_per_token(model, 2) * tokens / 2**30, abs=0.01)
    assert total == pytest.approx(weights + receive + kv, abs=0.02)


def test_a_model_not_downloaded_yet_is_said_not_guessed():
    cfg = load_config(REPO / "configs" / "default.yaml")
    assert "not on this machine yet" in actor_gpu_memory(None, cfg)


def test_a_gpu_dry_run_with_vllm_actors_prints_each_actor_gpus_memory(tmp_path, model_path):
    # A model directory on this machine: the dry run reads its config.json and builds nothing.
    proc = dry_run("--actors", "64", "--learner-gpus", "8", "--dry-run", "--cluster", "9x8gpu,64cpu",
                   "--actors.engine", "vllm", "--model.name", model_path, "--model.warm_start", "",
                   "--output-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "actor GPU memory (each)" in proc.stdout and "KV cache" in proc.stdout
