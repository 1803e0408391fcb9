"""Any AgentGym env server (TextCraft, BabyAI, WebShop, ALFWorld, WebArena, ...) as an envhub env.

AgentGym's ``agentenv-*`` packages each run a small HTTP server; `AgentGymEnv` is their client, so
an existing, unmodified server plugs into envhub by URL. Pick the server's family and give its
address (config only, no code):

    envhub:
      env_options:
        agentgym-v0: {url: "http://127.0.0.1:36001", family: textcraft, num_tasks: 544}

Families (envhub/envs/agentgym_protocol/families.py holds the table and cites AgentGym's files;
"id" is the server-side env id's key in bodies and GET queries, "task" the /reset key of the task
index; "first observation" is what AgentGym's client shows before the first action):

| family    | create  | id      | task       | first observation         | reply sent         | score; success | close |
|-----------|---------|---------|------------|---------------------------|--------------------|----------------|-------|
| textcraft | {}      | id      | data_idx   | reset                     | one Action: line*  | reward; >= 1   | yes   |
| babyai    | -       | id      | data_idx   | reset                     | one Action: line*  | score; > 0     | yes   |
| sciworld  | -       | id      | data_idx   | task_description+reset    | after last Action: | score; = 100   | yes   |
| webshop   | -       | env_idx | session_id | GET /observation          | after last Action: | reward; = 1    | no    |
| alfworld  | -       | id      | game       | reset+AVAILABLE ACTIONS   | after last Action: | won; = 1       | no    |
| sqlgym    | -       | env_idx | item_id    | GET /observation          | its ```sql block   | reward; = 1    | no    |
| maze      | -       | id      | game       | reset                     | after 1st Action:  | reward; = 1    | no    |
| wordle    | -       | id      | seed       | reset+/filtered_vocab     | after 1st Action:  | reward; = 1    | no    |
| webarena  | -       | env_idx | idx        | GET /observation          | raw, needs ```     | reward**; = 1  | yes   |
| searchqa  | {id: 0} | env_idx | id         | GET /observation          | raw                | reward; = 1    | yes   |
| tools***  | {id: 0} | env_idx | id         | GET /observation          | raw                | reward; = 1    | no    |
| custom    | -       | id      | data_idx   | reset or GET /observation | Thought/Action     | reward; >= 1   | yes   |

("reset": the /reset answer's observation; "-": no body. * TextCraft and BabyAI keep the letters,
digits, commas and spaces of the one ``Action:`` line; a reply with two gets AgentGym's "Only one
'Action' is allowed" answer. ** counted on a terminated step only. *** academia, movie, todo, sheet
and weather share one protocol; their score is a progress rate.) Every family's ``/step`` takes
``{<id>: n, action: text}`` (<id>: the table's id key); WebShop and SQLGym answer the observation
as ``state``; WebArena answers ``terminated``/``truncated`` instead of ``done``; LMRL-Gym's routes
sit under ``/maze`` or ``/wordle`` on the server's root URL. WebArena's failed reset (its HTTP 200 ``{"observation":
"TimeoutError"}``) and every ``{"error": ...}`` answer, non-2xx answer or transport failure raise
`AgentGymServerError`: envhub ends the session with status ``env_error`` and the server's message.

Scores and rewards (envhub/fidelity.py): every step's ``info["score"]`` is AgentGym's score for that
step, what its client returns as ``StepOutput.reward`` (AgentGym-RL takes the last step's as the
episode's score); ``reward`` stays envhub's [0, 1] training signal: score x ``score_scale`` clamped
to [0, 1], and for a running score (``cumulative_score``: BabyAI, SciWorld, SearchQA, the tool servers)
each step's increase of its best value, so an episode's rewards sum to the best score reached.
``info["success"]`` on the terminal step follows the family's rule above (a server's own bool
``success`` field wins). ``done`` -> ``terminated``; WebArena's ``truncated`` -> ``truncated``.

Server-side envs: where the server has ``/close``, each session's env is closed with the session.
Where it has none, the env goes back to a process-wide idle list and the next session on that server
resets it (envhub/envs/agentgym_protocol/remote.py), so a server holds at most as many envs as
sessions were open on it at once. SQLGym (8 slots) and WebShop (8000) hand out old ids once full;
an id another session holds is refused with a message saying so.

Options (envhub/envs/agentgym_protocol/options.py): ``url`` (required), ``family`` (default
``custom``), ``num_tasks`` or ``splits`` (the task indices), ``timeout_s``, the conversation start
(``instruction``, ``acknowledgement``, ``examples``, ``default_examples``: paste the
``conversation_start`` of the server's AgentGym client), and, to override one field of the family's
protocol, any of ``route_prefix``, ``create_body``, ``id_field``, ``task_field``, ``reset_body``,
``first_observation``, ``reset_failure_observation``, ``observation_field``, ``done_rule``,
``score_field``, ``score_scale``, ``cumulative_score``, ``success_rule``, ``action_format``,
``close_path``, ``max_server_envs``. A task id is AgentGym's data index; the seed is ignored
(AgentGym tasks are deterministic per index).

Several servers at once: one env id per server. From config alone: name each
``agentgym-<name>-vN`` in ``envhub.env_options`` with its options (``url`` and ``family`` at least)
and call ``register_configured_servers(cfg.envhub.env_options)`` once per process before the
registry is used (envhub's entry points do not call it yet); or add one ``register`` line each in
envhub/envs/__init__.py with the options as defaults (``env_options`` still override them):

    register("webshop-v0", entry_point="envhub.envs.agentgym:AgentGymEnv", max_turns=10,
             splits={"train": range(0, 6000), "test": range(6000, 6200)},
             url="http://127.0.0.1:36003", family="webshop")

Where envhub differs from AgentGym's clients, on purpose:
- ``reward`` of a running score pays the best score's increases (sum = best score reached); AgentGym-RL
  trains on the last step's score, which ``info["score"]`` carries;
- the instruction AgentGym's Maze and Wordle clients put into the first observation is the
  ``instruction`` option here; Wordle's vocabulary follows the reset observation under our own line;
- WebArena's ``truncated`` ends the episode (AgentGym's client only looks at ``terminated``);
- only ReAct replies (AgentGym's default); its function-calling and code-as-action formats are not parsed;
- a ninth concurrent session on SQLGym (a 8001st on WebShop) is refused instead of sharing an env.

A server that is not AgentGym-shaped at all needs its own `Environment` class. Slow servers
(SciWorld's /create takes seconds): raise ``envhub.step_timeout_s`` too, since envhub's own deadline
applies to every call.
"""

from __future__ import annotations

import json
import re
from typing import Any

from envhub.base import ConversationStart, Environment, StepResult
from envhub.envs.agentgym_protocol import answers
from envhub.envs.agentgym_protocol.options import AgentGymOptions
from envhub.envs.agentgym_protocol.remote import IDLE_ENVS, AgentGymHttp, AgentGymServerError
from envhub.envs.agentgym_protocol.replies import Feedback, NoAction, action_from_reply

__all__ = ["AgentGymEnv", "AgentGymOptions", "AgentGymServerError", "register_configured_servers"]

CLOSE_NOT_SUPPORTED = (404, 405)
CONFIGURED_ID = re.compile(r"^agentgym-[A-Za-z0-9_.\-]+-v(0|[1-9][0-9]*)$")


class AgentGymEnv(Environment):
    """One episode on a remote AgentGym env server (see the module docstring)."""

    # Harmless in most AgentGym envs; pass a real script to the conformance checker per server.
    example_actions = ("Thought: I should look around.\nAction: look",
                       "Thought: Let me check what I carry.\nAction: inventory")

    def __init__(self, **options: Any) -> None:
        self.options = AgentGymOptions.parse(options)
        self.protocol = self.options.protocol()
        self._server = AgentGymHttp(self.options.url, self.protocol.route_prefix, self.options.timeout_s)
        # Reusable envs are only those made alike: same server, routes and /create body.
        self._server_key = (f"{self.options.url.rstrip('/')}{self.protocol.route_prefix}",
                            json.dumps(self.protocol.create_body, sort_keys=True))
        self._remote_id: Any = None
        self._best_score = 0.0

    @classmethod
    def task_splits(cls, **options: Any) -> dict[str, range]:
        return AgentGymOptions.parse(options).task_splits()

    @classmethod
    def conversation_start(cls, **options: Any) -> ConversationStart:
        return AgentGymOptions.parse(options).conversation_start()

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        reused = self._remote_id is None and self._take_idle_env()
        if self._remote_id is None:
            await self._create()
        try:
            observation = await self._reset_remote(int(task_id))
        except AgentGymServerError:
            if not reused:
                raise
            # The server no longer knows a kept env (restarted?): forget it, retry once on a new one.
            IDLE_ENVS.forget(self._server_key, self._remote_id)
            self._remote_id = None
            await self._create()
            observation = await self._reset_remote(int(task_id))
        self._best_score = 0.0
        return observation, {"success": False}

    async def step(self, action: str) -> StepResult:
        parsed = action_from_reply(self.protocol.action_format, action)
        if isinstance(parsed, Feedback):  # AgentGym's client answers these itself; the step scores 0
            return StepResult(parsed.observation, 0.0, False, False,
                              {"success": False, "score": 0.0, "action_parsed": False})
        action_parsed = not isinstance(parsed, NoAction)
        action = parsed if action_parsed else ""
        answer = await self._server.call("POST", "/step", {self.protocol.id_field: self._remote_id, "action": action})
        where = f"{self.options.url}/step"
        observation, terminated, truncated = answers.step_fields(self.protocol, answer, where)
        score = answers.step_score(self.protocol, answer, terminated, where)
        reward, self._best_score = answers.training_reward(self.protocol, score, self._best_score)
        success = (terminated or truncated) and answers.succeeded(self.protocol, answer, score)
        return StepResult(observation, reward, terminated, truncated,
                          {"success": success, "score": score, "action_parsed": action_parsed})

    async def close(self) -> None:
        try:
            if self._remote_id is not None:
                await self._release_remote()
        finally:
            self._remote_id = None
            await self._server.aclose()

    def _take_idle_env(self) -> bool:
        if self.protocol.close_path:
            return False  # a server that can close its envs gets a fresh one per session
        self._remote_id = IDLE_ENVS.take(self._server_key)
        return self._remote_id is not None

    async def _create(self) -> None:
        answer = await self._server.call("POST", "/create", self.protocol.create_body)
        # {"id": n} (most), {"env_idx": n} (WebArena) or a bare int (WebShop, SQLGym, SearchQA, tools).
        remote_id = answer.get("id", answer.get(self.protocol.id_field)) if isinstance(answer, dict) else answer
        if isinstance(remote_id, bool) or not isinstance(remote_id, (int, str)):
            raise AgentGymServerError(f"{self.options.url}/create: no env id in the answer {str(answer)[:300]}")
        if not self.protocol.close_path:
            IDLE_ENVS.claim_new(self._server_key, remote_id, self.protocol.max_server_envs)
        self._remote_id = remote_id

    async def _release_remote(self) -> None:
        if not self.protocol.close_path:
            IDLE_ENVS.give_back(self._server_key, self._remote_id)
            return
        try:
            await self._server.call("POST", self.protocol.close_path, {self.protocol.id_field: self._remote_id})
        except AgentGymServerError as error:
            if error.status_code not in CLOSE_NOT_SUPPORTED:
                raise

    async def _reset_remote(self, task: int) -> str:
        body = {**self.protocol.reset_body, self.protocol.id_field: self._remote_id, self.protocol.task_field: task}
        answer = await self._server.call("POST", "/reset", body)
        marker = self.protocol.reset_failure_observation
        if marker is not None and isinstance(answer, dict) and answer.get("observation") == marker:
            raise AgentGymServerError(f"{self.options.url}/reset of task {task} answered {marker!r}: the server "
                                      f"could not load the task (WebArena: its browser or a site timed out; "
                                      f"AgentGym suggests restarting the web server)")
        observation = await self._first_observation(answer)
        if not isinstance(observation, str):
            raise AgentGymServerError(f"{self.options.url}: no observation after resetting task {task} "
                                      f"({self.protocol.first_observation}): {str(answer)[:300]}")
        return observation

    async def _first_observation(self, answer: Any) -> str | None:
        """What the family's AgentGym client shows before the first action (its ``observe()``)."""
        how = self.protocol.first_observation
        from_reset = answers.reset_observation(self.protocol, answer)
        if how == "observation_route" or (how == "reset_or_route" and from_reset is None):
            route = await self._get("/observation")
            return route if how == "observation_route" else answers.custom_observation(route)
        if how == "reset_reply_with_vocabulary" and from_reset is not None:
            return answers.with_vocabulary(from_reset, await self._get("/filtered_vocab"))
        return from_reset

    async def _get(self, path: str) -> Any:
        return await self._server.call("GET", path, params={self.protocol.id_field: self._remote_id})


def register_configured_servers(env_options: dict[str, dict[str, Any]], max_turns: int = 30) -> list[str]:
    """Register every ``agentgym-<name>-vN`` key of ``env_options`` (one AgentGym server each, its
    options there) as an id served by `AgentGymEnv`; return the ids. Registering again is a no-op."""
    from envhub import registry  # here: the registry imports envhub.envs, which names this module

    known = {env_spec.id for env_spec in registry.list_specs()}
    added = []
    for env_id, options in env_options.items():
        if env_id in known or not CONFIGURED_ID.match(env_id):
            continue
        if not isinstance(options, dict) or "family" not in options:
            raise ValueError(f"envhub.env_options.{env_id}: an AgentGym server needs at least url and family")
        AgentGymOptions.parse(options)  # a bad option fails here, naming the id, not at the first session
        registry.register(env_id, entry_point="envhub.envs.agentgym:AgentGymEnv", max_turns=max_turns, splits=None)
        added.append(env_id)
    return added
