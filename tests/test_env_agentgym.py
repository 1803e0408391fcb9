"""AgentGymEnv against stand-ins of every AgentGym server family (tests/agentgym_standins).

Each stand-in has its real server's routes, request models, reply shapes and failure modes; the
game behind them is ours (task k asks for ``secret_of(k)``). Per family: a scripted won episode is
marked successful and scored as AgentGym scores it, a lost one is not, no server-side env piles up
on servers without /close, and server failures end the session with envhub's ``env_error``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import httpx
import pytest
from fastapi import FastAPI

from common.config.envhub import EnvhubConfig
from common.net import bind_socket
from envhub import registry
from envhub.client import EnvClient, EnvClientError
from envhub.conformance import check_env
from envhub.envs.agentgym import AgentGymEnv, AgentGymServerError, register_configured_servers
from envhub.envs.agentgym_protocol.answers import custom_observation
from envhub.envs.agentgym_protocol.families import FAMILIES
from envhub.envs.agentgym_protocol.remote import AgentGymHttp
from envhub.envs.agentgym_protocol.replies import NO_BACKTICKS, ONE_ACTION_ONLY, action_from_reply
from tests.agentgym_standins import StandinState, serving
from tests.agentgym_standins.alfworld import alfworld_app
from tests.agentgym_standins.babyai import WIN_REWARD, babyai_app
from tests.agentgym_standins.lmrlgym import lmrlgym_app
from tests.agentgym_standins.sciworld import sciworld_app
from tests.agentgym_standins.searchqa import searchqa_app
from tests.agentgym_standins.sqlgym import sqlgym_app
from tests.agentgym_standins.textcraft import textcraft_app
from tests.agentgym_standins.tool import tool_app
from tests.agentgym_standins.webarena import webarena_app
from tests.agentgym_standins.webshop import webshop_app
from tests.servers import running_hub

pytestmark = pytest.mark.integration  # real processes, servers or sockets (tests/conftest.py: tiers)

TASK = 2  # asks for "stone" on every stand-in
TOOLS = ("academia", "movie", "todo", "sheet", "weather")


def react(action: str) -> str:
    return f"Thought:\nI will do this.\n\nAction:\n{action}"


@dataclass(frozen=True)
class FamilyCase:
    """One family's stand-in and a scripted episode on task ``TASK``."""

    family: str
    app: Callable[[StandinState], FastAPI]
    win: tuple[str, ...]
    win_score: float
    """AgentGym's score of the winning step (its client's ``StepOutput.reward``)."""
    first_observation_has: str
    lose: tuple[str, ...] = ()
    lose_score: float = 0.0


CASES = {case.family: case for case in (
    FamilyCase("textcraft", textcraft_app, ("Thought: a stick first.\nAction: get 1 stick",
                                            react("craft stone using 1 stick.")), 1.0, "Goal: craft stone."),
    FamilyCase("babyai", babyai_app, (react("go to stone ball 1"),), WIN_REWARD,
               'Available actions: ["turn left"'),
    FamilyCase("sciworld", sciworld_app, (react("look around"), react("focus on stone")), 100.0,
               "Your task is to find the stone. Focus on it.\nThis room is called the hallway.",
               lose=(react("focus on apple"),), lose_score=-100.0),
    FamilyCase("webshop", webshop_app, (react("search[stone]"), react("click[buy now]")), 1.0,
               "Instruction: [SEP] Find me a stone", lose=(react("search[apple]"), react("click[buy now]")),
               lose_score=0.25),
    FamilyCase("alfworld", alfworld_app, (react("take stone"),), 1.0,
               "take the stone.\nAVAILABLE ACTIONS: look,inventory,take stone,take spoon"),
    FamilyCase("sqlgym", sqlgym_app, ("Thought: query it.\n```sql\nSELECT word FROM words WHERE word = 'stone'\n```",),
               1.0, "CREATE TABLE words"),
    FamilyCase("maze", lmrlgym_app, (react("move down"),) * 3, 1.0, "Your current position is at position 5, 6."),
    FamilyCase("wordle", lmrlgym_app, (react("s t o n e"),), 1.0, "Let's start Wordle!",
               lose=(react("a p p l e"), react("r i v e r")) * 3, lose_score=0.0),
    FamilyCase("webarena", webarena_app, ("Let me look.\n```click [4]```", "I found it.\n```stop [stone]```"), 1.0,
               "OBJECTIVE: Tell me the word of task 2.", lose=("Done.\n```stop [apple]```",), lose_score=0.0),
    FamilyCase("searchqa", searchqa_app, ("<think>?</think><search>task 2</search>", "<answer> stone </answer>"),
               1.0, "Question: Which word does task 2 hide?"),
    *(FamilyCase(name, tool_app, ("Action: lookup with Action Input: {}",
                                  'Action: finish with Action Input: {"answer": "stone"}'), 1.0,
                 "Now new trial starts.", lose=('Action: finish with Action Input: {"answer": "apple"}',),
                 lose_score=0.0) for name in TOOLS),
)}


@contextlib.contextmanager
def standin(case: FamilyCase) -> Iterator[tuple[str, StandinState]]:
    state = StandinState()
    with serving(case.app(state)) as url:
        yield url, state


async def play(env: AgentGymEnv, replies: tuple[str, ...], task: int = TASK) -> tuple[str, list[Any]]:
    observation, _ = await env.reset(str(task), seed=0)
    results = [await env.step(reply) for reply in replies]
    return observation, results


def test_every_agentgym_server_family_has_a_case() -> None:
    assert set(CASES) == set(FAMILIES) - {"custom"}


@pytest.mark.parametrize("family", sorted(CASES))
def test_a_scripted_win_is_a_success_with_agentgyms_score(family: str) -> None:
    case = CASES[family]
    with standin(case) as (url, state):
        async def body() -> tuple[str, list[Any]]:
            env = AgentGymEnv(url=url, family=family, num_tasks=20, timeout_s=5)
            try:
                return await play(env, case.win)
            finally:
                await env.close()

        observation, results = asyncio.run(body())
    last = results[-1]
    assert case.first_observation_has in observation
    assert last.terminated and not last.truncated and last.info["success"] is True
    assert last.info["score"] == pytest.approx(case.win_score)
    assert all(not r.terminated and r.info["success"] is False for r in results[:-1])
    protocol = AgentGymEnv(url=url, family=family, num_tasks=20).protocol
    best = min(1.0, case.win_score * protocol.score_scale)
    assert sum(r.reward for r in results) == pytest.approx(best), "the episode's rewards sum to its scaled score"
    assert len(state.actions) == len(case.win), "every reply reached the server"


@pytest.mark.parametrize("family", sorted(f for f, case in CASES.items() if case.lose))
def test_a_lost_episode_ends_unsuccessful_with_the_servers_score(family: str) -> None:
    case = CASES[family]
    with standin(case) as (url, _):
        async def body() -> list[Any]:
            env = AgentGymEnv(url=url, family=family, num_tasks=20, timeout_s=5)
            try:
                return (await play(env, case.lose))[1]
            finally:
                await env.close()

        results = asyncio.run(body())
    assert results[-1].terminated and results[-1].info["success"] is False
    assert results[-1].info["score"] == pytest.approx(case.lose_score)
    assert all(0.0 <= r.reward <= 1.0 for r in results)


@pytest.mark.parametrize("action_format, reply, sent", [
    # BaseAdapter.parse_react: after the last "Action:"; WebShop's bare click[...] passes whole.
    ("react", "Thought: t\nAction: look\nAction: go north ", "go north"),
    ("react", "  click[buy now] ", "click[buy now]"),
    # TextCraftEnvClient.step: "\s*" crosses the line break; only letters, digits, commas, spaces stay.
    ("react_single_line", "Action:\nget 1 oak-planks!\nThat is all.", "get 1 oakplanks"),
    # MazeEnvClient.step: after the first "Action:", up to the next one.
    ("react_first", "Action: move up\nAction: move down", "move up"),
    ("react_first", " s t o n e ", "s t o n e"),
    # SqlGymEnvClient.step: the last ```sql block, else the reply.
    ("sql_block", "```sql\nSELECT 1\n```\n```sql\nSELECT 2\n```", "SELECT 2"),
    ("sql_block", " SELECT 3 ", "SELECT 3"),
])
def test_reply_parsers_follow_agentgyms_clients(action_format: str, reply: str, sent: str) -> None:
    assert action_from_reply(action_format, reply) == sent


def test_replies_are_sent_as_agentgyms_clients_send_them() -> None:
    sent = {}
    for family in ("textcraft", "sqlgym", "searchqa", "maze"):
        case = CASES[family]
        with standin(case) as (url, state):
            async def body() -> None:
                env = AgentGymEnv(url=url, family=family, num_tasks=20, timeout_s=5)
                await play(env, case.win[:1])
                await env.close()

            asyncio.run(body())
            sent[family] = state.actions[0]
    assert sent == {"textcraft": "get 1 stick", "sqlgym": "SELECT word FROM words WHERE word = 'stone'",
                    "searchqa": "<think>?</think><search>task 2</search>", "maze": "move down"}


@pytest.mark.parametrize("family, reply, answer", [
    ("textcraft", "Action: get 1 stick\nAction: get 2 sticks", ONE_ACTION_ONLY),
    ("webarena", "I will click [4].", NO_BACKTICKS),
])
def test_replies_agentgym_answers_itself_cost_a_turn_without_a_server_call(family: str, reply: str,
                                                                           answer: str) -> None:
    with standin(CASES[family]) as (url, state):
        async def body() -> Any:
            env = AgentGymEnv(url=url, family=family, num_tasks=20, timeout_s=5)
            try:
                return (await play(env, (reply,)))[1][0]
            finally:
                await env.close()

        result = asyncio.run(body())
    assert answer in result.observation and result.info["score"] == 0.0 and not result.terminated
    assert state.actions == []


@pytest.mark.parametrize("family", ["webshop", "textcraft"])
def test_a_reply_without_an_action_sends_agentgyms_empty_action_and_counts_unparsed(family: str) -> None:
    with standin(CASES[family]) as (url, state):
        async def body() -> Any:
            env = AgentGymEnv(url=url, family=family, num_tasks=20, timeout_s=5)
            try:
                return (await play(env, ("I would like to think about it.",)))[1][0]
            finally:
                await env.close()

        result = asyncio.run(body())
    assert state.actions == [""]  # what AgentGym's client sends; the server's answer is the observation
    assert result.info["action_parsed"] is False and result.info["score"] == 0.0


@pytest.mark.parametrize("family", sorted(CASES))
def test_server_side_envs_do_not_pile_up(family: str) -> None:
    """Sequential and concurrent episodes: a server with /close ends with none held, one without
    holds only as many as sessions were open at once, however many episodes were played."""
    case = CASES[family]
    with standin(case) as (url, state):
        async def episode() -> bool:
            env = AgentGymEnv(url=url, family=family, num_tasks=20, timeout_s=5)
            try:
                return (await play(env, case.win))[1][-1].info["success"]
            finally:
                await env.close()

        async def body() -> list[bool]:
            wins = [await episode() for _ in range(4)]
            wins += await asyncio.gather(*(episode() for _ in range(3)))
            return wins + await asyncio.gather(*(episode() for _ in range(3)))

        wins = asyncio.run(body())
    assert all(wins), "a reused env plays its new episode from the start"
    has_close = bool(AgentGymEnv(url=url, family=family, num_tasks=1).protocol.close_path)
    assert len(state.envs) == (0 if has_close else 3)
    assert state.creates == (10 if has_close else 3)


def test_a_kept_env_the_server_forgot_is_replaced() -> None:
    with standin(CASES["alfworld"]) as (url, state):
        async def body() -> bool:
            first = AgentGymEnv(url=url, family="alfworld", num_tasks=20, timeout_s=5)
            await play(first, CASES["alfworld"].win)
            await first.close()
            state.envs.clear()  # the server restarted: the kept id means nothing to it now
            second = AgentGymEnv(url=url, family="alfworld", num_tasks=20, timeout_s=5)
            try:
                return (await play(second, CASES["alfworld"].win))[1][-1].info["success"]
            finally:
                await second.close()

        assert asyncio.run(body()) is True
        assert state.creates == 2 and len(state.envs) == 1


def test_a_server_out_of_env_slots_is_refused_with_the_reason() -> None:
    """SQLGym holds 8 envs and then hands out old ids again: a ninth concurrent session must not share one."""
    with standin(CASES["sqlgym"]) as (url, state):
        async def body() -> list[Any]:
            envs = [AgentGymEnv(url=url, family="sqlgym", num_tasks=20, timeout_s=5) for _ in range(9)]
            try:
                return await asyncio.gather(*(env.reset("2", 0) for env in envs), return_exceptions=True)
            finally:
                await asyncio.gather(*(env.close() for env in envs))

        results = asyncio.run(body())
    refused = [r for r in results if isinstance(r, AgentGymServerError)]
    assert len(refused) == 1 and "run out of env slots (it holds at most 8)" in str(refused[0])
    assert len(state.envs) == 8


def hub_for(url: str, **options: Any) -> contextlib.AbstractContextManager[str]:
    """A real envhub serving ``agentgym-v0`` from the server at ``url``."""
    settings = {"url": url, "num_tasks": 20, "timeout_s": 5, **options}
    return running_hub(EnvhubConfig(env_options={"agentgym-v0": settings}))


def test_through_envhub_two_hops_conformance_and_a_win() -> None:
    case = CASES["textcraft"]
    with standin(case) as (url, state), hub_for(url, family="textcraft") as hub:
        async def body() -> None:
            async with EnvClient(hub) as client:
                report = await check_env(client, "agentgym-v0", task_id=str(TASK), actions=list(case.win))
                assert report.reached_terminal and report.success is True

        asyncio.run(body())
    assert not state.envs, "every server-side env was closed"


@pytest.mark.parametrize("family, options, task, message", [
    ("webarena", {}, 13, "answered 'TimeoutError'"),
    ("alfworld", {"reset_body": {"world_type": "Pixels"}}, TASK, 'world_type must be one of "Text"'),
    ("sqlgym", {"num_tasks": 20000}, 15000, "HTTP 500"),
    ("textcraft", {"family": "custom"}, TASK, "HTTP 422"),  # no /create body: what the real server refused
])
def test_server_failures_end_the_session_with_an_env_error(family: str, options: dict[str, Any], task: int,
                                                           message: str) -> None:
    settings = {"family": family, **options}
    with standin(CASES[family]) as (url, _), hub_for(url, **settings) as hub:
        async def body() -> None:
            async with EnvClient(hub) as client:
                with pytest.raises(EnvClientError) as failed:
                    await client.create("agentgym-v0", str(task), seed=0)
                assert failed.value.status_code == 500 and message in failed.value.message
                assert (await client.health())["stats"]["errors"]["env_error"] == 1

        asyncio.run(body())


def test_an_error_answer_mid_episode_ends_the_session() -> None:
    with standin(CASES["babyai"]) as (url, state), hub_for(url, family="babyai") as hub:
        async def body() -> None:
            async with EnvClient(hub) as client:
                handle = await client.create("agentgym-v0", str(TASK), seed=0)
                state.envs.clear()  # the server lost the env: its next answer is {"error": "The id ... is not valid."}
                with pytest.raises(EnvClientError) as failed:
                    await client.step(handle.session_id, react("turn left"))
                assert failed.value.status_code == 500 and "is not valid" in failed.value.message
                with pytest.raises(EnvClientError) as gone:
                    await client.step(handle.session_id, react("turn left"))
                assert gone.value.status_code == 410

        asyncio.run(body())


def test_unreachable_server_and_task_out_of_range() -> None:
    closed_port = bind_socket("127.0.0.1", 0)  # bound, never listening: connections are refused
    url = f"http://127.0.0.1:{closed_port.getsockname()[1]}"
    try:
        with hub_for(url, family="webshop") as hub:
            async def body() -> None:
                async with EnvClient(hub) as client:
                    with pytest.raises(EnvClientError) as bad_task:
                        await client.create("agentgym-v0", "20", seed=0)
                    assert bad_task.value.status_code == 400 and "0..19" in bad_task.value.message
                    with pytest.raises(EnvClientError) as unreachable:
                        await client.create("agentgym-v0", "0", seed=0)
                    assert unreachable.value.status_code == 500 and "/create failed" in unreachable.value.message

            asyncio.run(body())
    finally:
        closed_port.close()


@pytest.mark.parametrize("options, message", [
    ({"num_tasks": 5}, "needs option 'url'"),
    ({"url": "http://h:1", "family": "webshopp", "num_tasks": 5}, "unknown family 'webshopp'; families: custom"),
    ({"url": "http://h:1", "num_tasks": 5, "port": 3}, r"unknown option.*'port'.*valid options: url, family"),
    ({"url": "http://h:1", "num_tasks": 5, "action_format": "json"}, "action_format must be one of"),
    ({"url": "http://h:1", "num_tasks": 5, "create_body": "{}"}, "create_body must be a mapping"),
    ({"url": "http://h:1", "num_tasks": 5, "score_scale": 0}, "score_scale must be a number > 0"),
    ({"url": "http://h:1", "num_tasks": 5, "splits": {"train": [0, 5]}}, "not both"),
    ({"url": "http://h:1", "splits": {"train": [0, 10], "test": [10]}}, r"split 'test' must be \[start, stop\]"),
])
def test_bad_options_are_refused_with_a_clear_error(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AgentGymEnv(**options)


def test_bad_config_through_envhub_answers_400_naming_the_option() -> None:
    options = {"agentgym-v0": {"url": "http://127.0.0.1:9", "family": "alfwrld", "num_tasks": 3}}
    with running_hub(EnvhubConfig(env_options=options)) as hub:
        async def body() -> None:
            async with EnvClient(hub) as client:
                with pytest.raises(EnvClientError) as failed:
                    await client.create("agentgym-v0", "0", seed=0)
                assert failed.value.status_code == 400 and "unknown family 'alfwrld'" in failed.value.message

        asyncio.run(body())


def test_several_servers_from_config_alone() -> None:
    with standin(CASES["webshop"]) as (shop_url, _), standin(CASES["alfworld"]) as (alf_url, _):
        env_options = {"agentgym-standin-shop-v0": {"url": shop_url, "family": "webshop", "num_tasks": 20},
                       "agentgym-standin-alf-v0": {"url": alf_url, "family": "alfworld",
                                                   "splits": {"train": [0, 10], "test": [10, 20]}}}
        register_configured_servers(env_options)
        assert register_configured_servers(env_options) == [], "registering again is a no-op"

        async def body() -> list[bool]:
            wins = []
            for env_id in env_options:
                env = registry.make(env_id, **env_options[env_id])
                wins.append((await play(env, CASES[env_options[env_id]["family"]].win))[1][-1].info["success"])
                await env.close()
            return wins

        assert asyncio.run(body()) == [True, True]
        assert registry.task_ids("agentgym-standin-alf-v0", "test", **env_options["agentgym-standin-alf-v0"])[0] == "10"
    with pytest.raises(ValueError, match="needs at least url and family"):
        register_configured_servers({"agentgym-nofamily-v0": {"url": "http://h:1", "num_tasks": 3}})


@pytest.mark.parametrize("family, method, path, body, status", [
    ("textcraft", "POST", "/create", None, 422),  # the body is required, even though {} is enough
    ("searchqa", "POST", "/create", {}, 422),  # CreateQuery.id is a required int
    ("academia", "POST", "/create", {"id": "zero"}, 422),
    ("alfworld", "POST", "/reset", {"id": 0, "game": 1}, 422),  # world_type is required
    ("babyai", "POST", "/reset", {"id": 0}, 422),  # data_idx is required
    ("webshop", "POST", "/step", {"id": 0, "action": "search[x]"}, 422),  # ids travel as env_idx
    ("maze", "POST", "/create", None, 404),  # LMRL-Gym's routes sit under /maze
    ("webarena", "POST", "/reset", {"env_idx": 0, "seed": 0}, 500),  # Quart: a missing key is a KeyError
    ("webshop", "POST", "/close", {"env_idx": 0}, 404),  # no /close
])
def test_standins_refuse_what_the_real_servers_refuse(family: str, method: str, path: str, body: Any,
                                                      status: int) -> None:
    with standin(CASES[family]) as (url, _):
        response = httpx.request(method, url + path, json=body, timeout=5, trust_env=False)
    assert response.status_code == status


def test_a_custom_server_is_described_by_options_alone() -> None:
    """An AgentGym-shaped server outside the table: the custom family plus per-field options."""
    case = CASES["webshop"]
    options = {"family": "custom", "create_body": {}, "id_field": "env_idx", "task_field": "session_id",
               "first_observation": "observation_route", "observation_field": "state", "action_format": "react",
               "close_path": ""}
    with standin(case) as (url, state):
        async def body() -> list[Any]:
            env = AgentGymEnv(url=url, num_tasks=20, timeout_s=5, **options)
            try:
                return (await play(env, case.win))[1]
            finally:
                await env.close()

        results = asyncio.run(body())
    assert results[-1].terminated and results[-1].info["success"] is True and results[-1].reward == 1.0
    assert state.actions == ["search[stone]", "click[buy now]"]


def test_the_custom_family_reads_state_and_folds_in_what_the_server_lists() -> None:
    """``custom`` keeps the pre-family reading: a step's ``state`` when there is no ``observation``
    (WebShop's answer), a configured WebShop-shaped server plays without a family of its own."""
    with standin(CASES["webshop"]) as (url, _):
        async def body() -> tuple[str, list[Any]]:
            env = AgentGymEnv(url=url, family="custom", num_tasks=20, timeout_s=5, id_field="env_idx",
                              task_field="session_id", close_path="", first_observation="observation_route",
                              action_format="react")
            try:
                return await play(env, CASES["webshop"].win)
            finally:
                await env.close()

        _, results = asyncio.run(body())
    assert "Total results" in results[0].observation and results[-1].info["success"] is True
    assert custom_observation({"observation": "You see a stone.", "available_actions": ["take stone", "look"],
                               "task_description": "Find the stone."}) == \
        "Find the stone.\nYou see a stone.\nAVAILABLE ACTIONS: take stone, look"


def test_a_call_after_an_http_500_goes_out_on_a_fresh_connection() -> None:
    """uvicorn closes the connection it answered 500 on (an unhandled exception in an AgentGym
    server); this server closes it only once the next request arrives, the race at its worst."""
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.readuntil(b"\r\n\r\n")
        failing = connections == 1
        body = b"Internal Server Error" if failing else b'{"id": 3}'
        status = b"500 Internal Server Error" if failing else b"200 OK"
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")  # the next request on this connection: never answered
        writer.close()

    async def body() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        http = AgentGymHttp(f"http://127.0.0.1:{port}", "", timeout_s=5)
        try:
            with pytest.raises(AgentGymServerError, match="HTTP 500"):
                await http.call("POST", "/reset", {"id": 0})
            assert await http.call("POST", "/create") == {"id": 3}
        finally:
            await http.aclose()
            server.close()
            await server.wait_closed()
        assert connections == 2

    asyncio.run(body())
