"""run_episode over real parts (the CPU engine with a tiny random Qwen2, a real envhub server):
whatever ends an episode, a trajectory comes back that the head accepts, never longer than the
lease's token budget, never later than its deadline."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
import torch
from transformers import Qwen2ForCausalLM

from actors.conversation import ConversationStarts
from actors.cpu_engine import CpuEngine
from actors.engine_api import SamplingParams
from actors.episode import EpisodeDeps, reported_score, run_episode
from common import protocol
from common.config.envhub import EnvhubConfig
from common.protocol import TaskLease, Trajectory
from common.tiny_model import load_tiny_tokenizer, tiny_qwen2_config
from envhub.client import EnvClient
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

ENV_ID = "keydoor-v0"
MAX_NEW_TOKENS = 4


def tiny_engine(max_positions: int = 4096) -> CpuEngine:
    config = tiny_qwen2_config(load_tiny_tokenizer())
    config.max_position_embeddings = max_positions
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return CpuEngine(Qwen2ForCausalLM(config).eval(), seed=0)


def lease(turn_cap: int = 4, max_episode_tokens: int = 100_000, deadline_in_s: float = 600.0) -> TaskLease:
    return TaskLease(lease_id="g0-r0", group_id="g0", env_id=ENV_ID, task_id="3", seed=0, group_size=1,
                     turn_cap=turn_cap, max_episode_tokens=max_episode_tokens, policy_version=0,
                     deadline_unix_s=time.time() + deadline_in_s)


def play(url: str, task: TaskLease, engine: CpuEngine | None = None) -> tuple[Trajectory, int]:
    """One episode; returns its trajectory as the head decodes it and the sessions left open."""
    tokenizer = load_tiny_tokenizer()
    engine = engine or tiny_engine()

    async def main() -> tuple[Trajectory, int]:
        engine.start()
        try:
            async with EnvClient(url) as env:
                deps = EpisodeDeps(0, engine, env, tokenizer,
                                   SamplingParams(MAX_NEW_TOKENS, 1.0, (tokenizer.eos_token_id,)), None,
                                   ConversationStarts(env, lambda env_id: (True, None)))
                trajectory = await run_episode(task, 0, deps)
                return trajectory, (await env.health())["sessions"]
        finally:
            engine.stop()

    trajectory, open_sessions = asyncio.run(main())
    return protocol.decode(protocol.encode(trajectory), Trajectory), open_sessions  # passes the wire checks


@pytest.fixture(scope="module")
def hub_url():
    with running_hub(EnvhubConfig(port=0)) as url:
        yield url


def test_an_error_of_the_actor_itself_ends_the_episode_with_actor_error_and_a_trajectory(hub_url, caplog):
    # The opening (instruction and worked example) is longer than this model's 32 positions.
    trajectory, open_sessions = play(hub_url, lease(), tiny_engine(max_positions=32))
    assert (trajectory.status, trajectory.finish_reason) == ("actor_error", "actor_error")
    assert "positions" in trajectory.error and trajectory.num_turns == 0
    assert open_sessions == 0  # the env session was closed all the same
    assert any("Traceback" in (r.exc_text or "") or r.exc_info for r in caplog.records)


def test_an_observation_that_would_overflow_the_token_budget_ends_the_episode_before_it(hub_url):
    first, _ = play(hub_url, lease(turn_cap=1))
    opening = int(first.turn_spans[0, 0])
    # Room for the opening and one reply, not for the observation that follows it.
    budget = opening + MAX_NEW_TOKENS + 1
    trajectory, _ = play(hub_url, lease(max_episode_tokens=budget))
    assert (trajectory.status, trajectory.finish_reason) == ("ok", "token_budget") and trajectory.truncated
    assert len(trajectory.token_ids) <= budget
    assert trajectory.num_turns == 1 and trajectory.turn_spans[-1, 1] == len(trajectory.token_ids)
    assert len(trajectory.turn_rewards) == 1  # the step that returned the observation still counts


def test_an_opening_longer_than_the_token_budget_is_an_actor_error_within_the_budget(hub_url):
    first, _ = play(hub_url, lease(turn_cap=1))
    budget = int(first.turn_spans[0, 0]) - 1
    trajectory, _ = play(hub_url, lease(max_episode_tokens=budget))
    assert (trajectory.status, trajectory.finish_reason) == ("actor_error", "actor_error")
    assert "max_episode_tokens" in trajectory.error
    assert len(trajectory.token_ids) <= budget


def test_an_episode_past_its_deadline_is_cut_with_timeout_and_returned(hub_url):
    trajectory, open_sessions = play(hub_url, lease(deadline_in_s=-1.0))
    assert (trajectory.status, trajectory.finish_reason) == ("timeout", "deadline") and trajectory.truncated
    assert trajectory.num_turns == 0 and len(trajectory.turn_spans) == 0  # cut before the first generate
    assert open_sessions == 0


def test_an_env_step_in_flight_at_the_deadline_is_cancelled():
    slow = EnvhubConfig(port=0, env_options={ENV_ID: {"step_latency_s": 2.0}})  # reset and step wait 2 s
    with running_hub(slow) as url:
        trajectory, _ = play(url, lease(turn_cap=1, deadline_in_s=3.0))
    assert (trajectory.status, trajectory.finish_reason) == ("timeout", "deadline")
    # Generated, then cut while the env was stepping: the reply the env never answered is kept.
    assert trajectory.num_turns == 0 and len(trajectory.turn_spans) == 1


def test_the_envs_last_score_is_the_episodes_score_and_a_broken_one_is_none():
    assert reported_score({"score": -100}) == -100.0 and reported_score({"score": 0.82}) == 0.82
    for broken in ({}, {"score": True}, {"score": "1"}, {"score": float("nan")}, {"score": float("inf")}):
        assert reported_score(broken) is None


def test_the_trajectory_carries_the_envs_score_after_the_last_step(hub_url):
    unscored, _ = play(hub_url, lease(turn_cap=1))  # keydoor reports no score: reward stands for it
    assert unscored.status == "ok" and unscored.score is None
    task = dataclasses.replace(lease(turn_cap=2), env_id="textcraft-v0", task_id="0")
    scored, _ = play(hub_url, task)
    assert scored.status == "ok" and scored.num_turns == 2
    assert scored.score is not None and scored.score == scored.env_info["score"]
