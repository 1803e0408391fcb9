"""The actor loop over real parts (head, envhub, CPU engine over a tiny random Qwen2): an actor whose
engine is dead for good stops leasing and fails its run, saying why, so the launcher restarts it."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import zmq
from transformers import Qwen2ForCausalLM

from actors.cpu_engine import CpuEngine
from actors.health import EngineDead, EngineHealth
from actors.main import Actor
from common.config import load_config
from common.config.envhub import EnvhubConfig
from common.tiny_model import build_tiny_model, load_tiny_tokenizer, tiny_qwen2_config
from common.transport import bind_random, configure
from common.weight_sync import WeightBroadcaster
from learner.head import HeadServer
from learner.sampler import TaskSampler
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

TIMEOUT_S = 30.0


def wait_until(condition, what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def live_actor(tmp_path):
    """A running ``Actor`` (in a thread) leasing from a real head; yields (actor, head, outcome, thread)."""
    model_path = build_tiny_model(tmp_path / "model")
    cfg = load_config(None, ["--rollout.group_size", "2", "--rollout.max_new_tokens", "4",
                             "--rollout.max_episode_tokens", "512", "--actors.max_concurrent_episodes", "2",
                             "--actors.stats_interval_s", "0.5"])
    sampler = TaskSampler({"keydoor-v0": [str(i) for i in range(100)]}, group_size=2, groups_per_step=1,
                          max_policy_lag=1000, lease_timeout_s=60.0, max_episode_tokens=512, seed=0)
    head = HeadServer(sampler)
    head.set_policy(0, 2)
    head.start()
    pub = configure(zmq.Context.instance().socket(zmq.PUB))
    broadcaster = WeightBroadcaster("127.0.0.1", bucket_nbytes=1 << 20, timeout_s=5.0)
    addresses = {"lease": head.lease_address, "trajectories": head.trajectory_address,
                 "control": bind_random(pub, "127.0.0.1"), "weights": broadcaster.address,
                 "model_path": str(model_path), "policy_version": "0", "weights_device": "cpu"}
    torch_threads = torch.get_num_threads()  # the actor sets the process's torch threads
    outcome: dict = {}
    with running_hub(EnvhubConfig(port=0)) as url:
        actor = Actor(cfg, 0, addresses, url)

        def run() -> None:
            try:
                outcome["result"] = actor.run()
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            yield actor, head, outcome, thread
        finally:
            actor.stop()
            thread.join(timeout=TIMEOUT_S)
            head.stop()
            pub.close()
            torch.set_num_threads(torch_threads)


def test_an_actor_whose_engine_died_stops_and_fails_its_run_saying_why(live_actor, caplog):
    actor, head, outcome, thread = live_actor
    wait_until(lambda: head.ledger()["completed"] >= 1, "the actor to return a group")
    engine = actor.engine
    # Weights that pass every check but cannot be copied in: the engine's worker thread crashes.
    shapes = Qwen2ForCausalLM(tiny_qwen2_config(load_tiny_tokenizer())).named_parameters()
    unreadable = {name: torch.empty(p.shape, device="meta") for name, p in shapes}
    engine.stage_weights(unreadable, 1)
    thread.join(timeout=TIMEOUT_S)
    assert not thread.is_alive(), "the actor kept running on a dead engine"
    error = outcome.get("error")
    assert isinstance(error, EngineDead) and "worker thread crashed" in str(error), outcome
    assert any(r.levelname == "ERROR" and "engine" in r.getMessage() and "restart" in r.getMessage()
               for r in caplog.records)


def test_engine_errors_in_a_row_mean_a_dead_engine_until_an_ok_episode_clears_them():
    health = EngineHealth(CpuEngine(Qwen2ForCausalLM(tiny_qwen2_config(load_tiny_tokenizer()))), 3)
    for status in ("engine_error", "engine_error", "env_error", "ok", "engine_error", "timeout", "engine_error"):
        health.observe(status, "generation failed: RuntimeError('boom')" if status == "engine_error" else "")
        assert health.dead_reason() is None  # an env failure says nothing; an ok episode clears the count
    health.observe("engine_error", "generation failed: RuntimeError('boom')")
    reason = health.dead_reason()
    assert reason is not None and "3 episodes in a row" in reason and "boom" in reason
    with pytest.raises(ValueError, match="max_consecutive_engine_errors"):
        load_config(None, ["--actors.max_consecutive_engine_errors", "0"])
