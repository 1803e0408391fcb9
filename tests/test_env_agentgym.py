"""AgentGymEnv against a toy server speaking AgentGym's env-server protocol.

The toy server (FastAPI + uvicorn on 127.0.0.1, port 0, in a thread) is a word game with the
routes and quirks of the real agentenv servers: ``/create`` -> ``{"id"}``, ``/reset`` with
``data_idx``, ``/step`` -> ``{observation, reward, score, done}``, ``GET /observation?id=``,
``/close``, and failures reported as HTTP 200 ``{"error": ...}``. Most checks go through a real
envhub server, so each step makes two HTTP hops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest
import uvicorn
from fastapi import FastAPI, HTTPException, Request

from envhub import registry
from envhub.client import EnvClient, EnvClientError
from envhub.config import EnvhubConfig
from envhub.conformance import check_env
from envhub.envs.agentgym import AgentGymEnv, AgentGymOptions
from envhub.main import bind_socket
from tests.servers import running_hub

WORDS = ("apple", "river", "stone", "cloud", "maple")
NUM_TASKS = 20
WORD_PATTERN = re.compile(r"say the word '(\w+)'")


@dataclass
class ToyGameState:
    """What the toy server holds: one game per server-side env id, and call counts."""

    games: dict[int, dict[str, Any]] = field(default_factory=dict)
    next_id: int = 0
    steps: int = 0
    closed: int = 0


def toy_agentgym_app(state: ToyGameState) -> FastAPI:
    app = FastAPI()

    async def body_of(request: Request) -> dict[str, Any]:
        raw = await request.body()
        return json.loads(raw) if raw else {}

    @app.post("/create")
    async def create(request: Request) -> dict[str, Any]:
        env_id, state.next_id = state.next_id, state.next_id + 1
        state.games[env_id] = {"quiet": bool((await body_of(request)).get("quiet_reset")), "last": ""}
        return {"id": env_id}

    @app.post("/reset")
    async def reset(request: Request) -> dict[str, Any]:
        body = await body_of(request)
        game = state.games.get(body["id"])
        if game is None:
            return {"error": f"The id {body['id']} is not valid."}
        word = WORDS[body["data_idx"] % len(WORDS)]
        intro = f"Task {body['data_idx']}: say the word '{word}'. Actions: say <word>, hint."
        game.update(word=word, score=0, done=False, last=intro)
        if game["quiet"]:  # WebShop-style: the client reads GET /observation
            return {"id": body["id"]}
        return {"id": body["id"], "observation": intro, "reward": 0, "done": False}

    @app.get("/observation")
    async def observation(id: int) -> Any:
        return state.games[id]["last"] if id in state.games else {"error": f"The id {id} is not valid."}

    @app.post("/step")
    async def step(request: Request) -> dict[str, Any]:
        body = await body_of(request)
        state.steps += 1
        if body["action"] == "boom":
            return {"error": "the toy server exploded"}
        if body["action"] == "http500":
            raise HTTPException(500, "toy server crashed")
        return play(state.games[body["id"]], body["action"])

    @app.post("/close")
    async def close(request: Request) -> dict[str, Any]:
        state.games.pop((await body_of(request))["id"], None)
        state.closed += 1
        return {"closed": True}

    return app


def play(game: dict[str, Any], action: str) -> dict[str, Any]:
    reward = 0
    if action == f"say {game['word']}":
        game.update(done=True, score=100, last="Correct! You win.")
        reward = 1
    elif action == "hint":
        game.update(score=max(game["score"], 50), last=f"The word starts with {game['word'][0]}.")
    else:
        game["last"] = "Wrong. Try: say <word>."
    return {"observation": game["last"], "reward": reward, "score": game["score"], "done": game["done"]}


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "toy server died during startup"
        threading.Event().wait(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def toy() -> Iterator[tuple[str, ToyGameState]]:
    state = ToyGameState()
    with serving(toy_agentgym_app(state)) as url:
        yield url, state


@pytest.fixture(scope="module")
def hub_url(toy: tuple[str, ToyGameState]) -> Iterator[str]:
    options = {"agentgym-v0": {"url": toy[0], "num_tasks": NUM_TASKS, "timeout_s": 5}}
    with running_hub(EnvhubConfig(env_options=options)) as url:
        yield url


def reply(action: str) -> str:
    return f"Thought: I will try this.\nAction: {action}"


def test_options_are_validated_with_clear_errors() -> None:
    with pytest.raises(ValueError, match="url"):
        AgentGymEnv(num_tasks=5)
    with pytest.raises(ValueError, match=r"unknown option.*'port'.*valid options: url"):
        AgentGymEnv(url="http://127.0.0.1:1", num_tasks=5, port=3)
    with pytest.raises(ValueError, match="not both"):
        AgentGymEnv(url="http://127.0.0.1:1", num_tasks=5, splits={"train": [0, 5]})
    with pytest.raises(ValueError, match="set num_tasks"):
        AgentGymEnv.task_splits(url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match=r"split 'test' must be \[start, stop\]"):
        AgentGymEnv(url="http://127.0.0.1:1", splits={"train": [0, 10], "test": [10]})
    with pytest.raises(ValueError, match="action_format"):
        AgentGymEnv(url="http://127.0.0.1:1", num_tasks=5, action_format="json")
    splits = AgentGymOptions(url="http://h:1", splits={"train": [0, 400], "test": [400, 500]}).task_splits()
    assert splits == {"train": range(0, 400), "test": range(400, 500)}


def test_conformance_through_envhub_two_hops(hub_url: str, toy: tuple[str, ToyGameState]) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            listed = {env["id"]: env for env in await client.list_envs()}
            assert listed["agentgym-v0"]["splits"] == {"train": NUM_TASKS}
            report = await check_env(client, "agentgym-v0", task_id="3", actions=[reply(f"say {WORDS[3]}")])
            assert report.reached_terminal and report.success is True

    asyncio.run(body())
    assert not toy[1].games, "every server-side env was closed"


def test_scripted_policy_wins_and_rewards_map(hub_url: str, toy: tuple[str, ToyGameState]) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            handle = await client.create("agentgym-v0", "7", seed=0)
            word = WORD_PATTERN.search(handle.observation).group(1)
            steps_before = toy[1].steps
            malformed = await client.step(handle.session_id, "I think I will say something")
            assert "Action:" in malformed.observation and malformed.reward == 0.0 and not malformed.terminated
            assert toy[1].steps == steps_before, "a reply without an action never reaches the server"
            wrong = await client.step(handle.session_id, reply("say banana"))
            assert wrong.observation.startswith("Wrong") and wrong.reward == 0.0 and not wrong.terminated
            won = await client.step(handle.session_id, reply(f"say {word}"))
            assert won.terminated and not won.truncated and won.reward == 1.0 and won.info["success"] is True
            await client.close(handle.session_id)

    asyncio.run(body())
    assert not toy[1].games


@pytest.mark.parametrize("action, message", [("boom", "the toy server exploded"), ("http500", "HTTP 500")])
def test_server_error_ends_the_session_with_an_env_error(hub_url: str, toy: tuple[str, ToyGameState],
                                                         action: str, message: str) -> None:
    async def body() -> None:
        async with EnvClient(hub_url) as client:
            handle = await client.create("agentgym-v0", "1", seed=0)
            with pytest.raises(EnvClientError) as failed:
                await client.step(handle.session_id, reply(action))
            assert failed.value.status_code == 500 and message in failed.value.message
            with pytest.raises(EnvClientError) as gone:
                await client.step(handle.session_id, reply("hint"))
            assert gone.value.status_code == 410
            assert (await client.health())["stats"]["errors"]["env_error"] >= 1

    asyncio.run(body())
    assert not toy[1].games, "the failed session's server-side env was closed too"


def test_task_out_of_range_and_unreachable_server() -> None:
    async def body(hub: str) -> None:
        async with EnvClient(hub) as client:
            with pytest.raises(EnvClientError) as bad_task:
                await client.create("agentgym-v0", str(NUM_TASKS), seed=0)
            assert bad_task.value.status_code == 400 and f"0..{NUM_TASKS - 1}" in bad_task.value.message
            with pytest.raises(EnvClientError) as unreachable:
                await client.create("agentgym-v0", "0", seed=0)
            assert unreachable.value.status_code == 500 and "/create failed" in unreachable.value.message

    closed_port = bind_socket("127.0.0.1", 0)  # bound, never listening: connections are refused
    url = f"http://127.0.0.1:{closed_port.getsockname()[1]}"
    try:
        with running_hub(EnvhubConfig(env_options={"agentgym-v0": {"url": url, "num_tasks": NUM_TASKS}})) as hub:
            asyncio.run(body(hub))
    finally:
        closed_port.close()


def test_registered_id_with_cumulative_score(toy: tuple[str, ToyGameState]) -> None:
    if "toyscore-v0" not in {env_spec.id for env_spec in registry.list_specs()}:
        # What a user adds to envhub/envs/__init__.py for a BabyAI/SciWorld-style server.
        registry.register("toyscore-v0", entry_point="envhub.envs.agentgym:AgentGymEnv", max_turns=10,
                          splits={"train": range(0, 10), "test": range(10, 12)},
                          url=toy[0], reward_field="score", reward_scale=0.01, cumulative_reward=True)

    async def body() -> None:
        env = registry.make("toyscore-v0")
        observation, info = await env.reset("11", seed=0)
        word = WORD_PATTERN.search(observation).group(1)
        rewards = [(await env.step(reply(action))).reward for action in ("hint", "hint", "say nothing")]
        last = await env.step(reply(f"say {word}"))
        await env.close()
        assert rewards == [0.5, 0.0, 0.0] and last.reward == 0.5 and last.info["success"] is True

    assert registry.task_ids("toyscore-v0", "test") == ["10", "11"]
    asyncio.run(body())


def test_quiet_reset_reads_the_observation_route(toy: tuple[str, ToyGameState]) -> None:
    async def body() -> None:
        env = AgentGymEnv(url=toy[0], num_tasks=NUM_TASKS, create_body={"quiet_reset": True}, action_format="raw")
        observation, _ = await env.reset("2", seed=0)
        result = await env.step(f"say {WORDS[2]}")  # raw: the reply goes to the server unchanged
        await env.close()
        assert observation.startswith("Task 2: say the word 'stone'") and result.info["success"] is True

    asyncio.run(body())
