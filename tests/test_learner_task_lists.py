"""The learner's task lists come from envhub over HTTP (``GET /envs/{id}/tasks``), never from env code."""

from __future__ import annotations

import subprocess
import sys

import pytest

from common.config import load_config
from common.config.envhub import EnvhubConfig
from common.net import free_port
from envhub import registry
from learner.evaluation import build_eval_rounds
from learner.task_lists import EnvhubUnreachable, TaskListRefused, fetch_task_lists, task_ids_of
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

# agentgym-v0's task list exists only under its options (``num_tasks``): the server's, not the learner's.
OPTIONS = {"agentgym-v0": {"url": "http://127.0.0.1:9", "family": "textcraft", "num_tasks": 7}}


@pytest.fixture(scope="module")
def hub_url(tmp_path_factory: pytest.TempPathFactory):
    cfg = EnvhubConfig(runs_dir=str(tmp_path_factory.mktemp("runs")), env_options=OPTIONS)
    with running_hub(cfg) as url:
        yield url


def test_the_lists_are_the_registrys_under_the_servers_options_with_each_envs_turn_limit(hub_url: str):
    lists = fetch_task_lists(hub_url, ["keydoor-v0", "agentgym-v0"], "train")
    assert list(lists) == ["keydoor-v0", "agentgym-v0"] and len(lists["agentgym-v0"].task_ids) == 7
    for env_id, task_list in lists.items():
        assert task_list.task_ids == registry.task_ids(env_id, "train", **OPTIONS.get(env_id, {}))
        assert task_list.max_turns == registry.spec(env_id).max_turns
    assert task_ids_of(lists)["keydoor-v0"] == lists["keydoor-v0"].task_ids


def test_a_missing_split_or_env_is_refused_and_an_eval_split_error_says_which_setting(hub_url: str):
    with pytest.raises(TaskListRefused, match="no split 'validation'"):
        fetch_task_lists(hub_url, ["keydoor-v0"], "validation")
    with pytest.raises(TaskListRefused, match="nosuch-v0"):
        fetch_task_lists(hub_url, ["nosuch-v0"], "train")
    cfg = load_config("configs/smoke.yaml", ["--learner.eval_split", "validation"])
    with pytest.raises(ValueError, match="split 'validation'.*learner.eval_split"):
        build_eval_rounds(cfg, lambda split: task_ids_of(fetch_task_lists(hub_url, cfg.rollout.envs, split)))


def test_no_envhub_is_a_clear_error():
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    with pytest.raises(EnvhubUnreachable, match=f"keydoor-v0.*envhub at {url}"):
        fetch_task_lists(url, ["keydoor-v0"], "train", timeout_s=5.0)


def test_the_learner_imports_no_env_code():
    """Only ``envhub.client`` (and the config) may reach the learner: its node need not hold env code."""
    probe = ("import sys, learner.main, learner.evaluation, learner.sampler, learner.head; "
             "print(sorted(m for m in sys.modules if m.startswith('envhub')))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert "envhub.registry" not in loaded and "envhub.envs" not in loaded, loaded
