"""Any AgentGym env server (WebShop, ALFWorld, the original TextCraft, ...) as an envhub env.

AgentGym's `agentenv-*` packages each run a small HTTP server; `AgentGymEnv` is their client,
so an existing server plugs into envhub by URL without changing it. The protocol (JSON):

    POST /create   [create_body]                  -> {"id": n}  or a bare id (WebShop)
    POST /reset    {id_field: n, task_field: k}   -> {"observation": ...} (or read GET /observation)
    POST /step     {id_field: n, "action": a}     -> {"observation" | "state", "reward", "done", ...}
    GET  /observation?{id_field}=n                -> "text" or {"observation": ...}
    POST /close    {id_field: n}                  (older servers have no /close: 404 is ignored)

AgentGym servers report failures as HTTP 200 with {"error": "..."}; that, any non-2xx answer and
any transport failure raise `AgentGymServerError`, so envhub closes the session and answers 500.

Mapping to the envhub contract:
- the task id is AgentGym's data index (``int(task_id)``); the seed is ignored (AgentGym tasks are
  deterministic per index);
- the reply is parsed as ``Thought: ... Action: <action>`` and only the action is sent
  (``action_format: raw`` sends the reply unchanged); a reply without an action gets feedback
  and costs a turn, without a server call;
- ``done`` -> ``terminated`` (AgentGym has no truncation); reward = server reward x
  ``reward_scale``, clamped to [0, 1]; with ``cumulative_reward`` the field is a running score
  (BabyAI/SciWorld ``score``) and each step returns the increase of its best value so far, so an
  episode's rewards sum to the best score reached;
- ``info["success"]``: the server's own bool ``success`` field when it sends one, else whether the
  reward (cumulative: the best score) reached 1;
- ``available_actions`` (ALFWorld) and ``task_description`` (SciWorld) are folded into the text.

Pointing envhub at a server (config; the options are the fields of `AgentGymOptions`):

    envhub:
      env_options:
        agentgym-v0: {url: "http://127.0.0.1:36001", num_tasks: 500}

Several servers: one ``register`` line each in envhub/envs/__init__.py, options as defaults
(``env_options`` still override them), e.g.

    register("webshop-v0", entry_point="envhub.envs.agentgym:AgentGymEnv", max_turns=10,
             splits={"train": range(0, 6000), "test": range(6000, 6200)},
             url="http://127.0.0.1:36003", id_field="env_idx", task_field="session_id")
    register("alfworld-v0", entry_point="envhub.envs.agentgym:AgentGymEnv", max_turns=30, splits=None,
             url="http://127.0.0.1:36002", task_field="game", reset_body={"world_type": "Text"},
             num_tasks=2000)

(ports and task counts are illustrative: use your servers'. ``splits`` on a register line is the
registry's fixed task list; with ``splits=None`` the ``num_tasks`` / ``splits`` options decide it.)

Slow servers (SciWorld's /create takes seconds): raise ``envhub.step_timeout_s`` too, since envhub's
own deadline applies to every call.
"""

from __future__ import annotations

import functools
import math
import ssl
from dataclasses import dataclass, field
from typing import Any

import httpx

from envhub.actions import MalformedAction, extract_action
from envhub.base import ACKNOWLEDGEMENT, ConversationStart, Environment, StepResult
from envhub.options import OptionsError, parse_options

ACTION_FORMATS = ("thought_action", "raw")
CLOSE_NOT_SUPPORTED = (404, 405)


class AgentGymServerError(RuntimeError):
    """The AgentGym server failed a call; `status_code` is None without an HTTP answer."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass(frozen=True)
class AgentGymOptions:
    """Options of `AgentGymEnv` (set them in ``envhub.env_options`` or on the ``register`` line)."""

    url: str = ""
    """Base URL of the AgentGym env server, e.g. ``http://127.0.0.1:36001`` (required)."""

    timeout_s: float = 60.0
    """HTTP timeout of one call to the server (envhub's ``step_timeout_s`` also applies)."""

    num_tasks: int | None = None
    """Tasks the server offers: data indices 0..num_tasks-1, all in split ``train``. Needed for an
    id registered with ``splits=None`` (like ``agentgym-v0``), unless ``splits`` is given."""

    splits: dict[str, list[int]] | None = None
    """Instead of ``num_tasks``: split name -> ``[start, stop]`` (half-open, like ``range``). On a
    ``register`` line use register's own ``splits=`` (ranges) instead: that name is taken there."""

    id_field: str = "id"
    """Body/query key carrying the server's env id (``env_idx`` for WebShop)."""

    create_body: dict[str, Any] = field(default_factory=dict)
    """JSON body of ``POST /create`` (e.g. TextCraft's ``{commands, goal}``); empty for none."""

    task_field: str = "data_idx"
    """Reset key carrying the task index (``session_id`` for WebShop, ``game`` for ALFWorld)."""

    reset_body: dict[str, Any] = field(default_factory=dict)
    """Extra keys of every ``POST /reset`` body (e.g. ALFWorld's ``{world_type: Text}``)."""

    reward_field: str = "reward"
    """Step-answer key read as the reward (``score`` for BabyAI and SciWorld)."""

    reward_scale: float = 1.0
    """Multiplier applied before clamping to [0, 1] (0.01 for SciWorld's 0..100 score)."""

    cumulative_reward: bool = False
    """``reward_field`` is a running score: return its increases, not its value."""

    action_format: str = "thought_action"
    """``thought_action``: send only the text after ``Action:``; ``raw``: send the reply unchanged."""

    close_path: str = "/close"
    """Route that frees the server's env; empty for servers without one."""

    instruction: str = ""
    """The env's instruction, shown as its own user turn before the first observation: paste the
    ``conversation_start`` text of the server's AgentGym client (agentenv/envs/<env>.py)."""

    acknowledgement: str = ACKNOWLEDGEMENT
    """The assistant's reply to the instruction (AgentGym's clients: "OK. I'll follow ..." or "Ok.")."""

    examples: list[list[list[str]]] = field(default_factory=list)
    """Worked examples: each a list of ``[observation, reply]`` turns in the server's action format."""

    default_examples: int = 0
    """Examples shown when the run does not say (``rollout.num_examples``)."""

    def __post_init__(self) -> None:
        if not self.url:
            raise OptionsError("agentgym: needs option 'url' (the AgentGym env server's address, "
                               "e.g. http://127.0.0.1:36001)")
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise OptionsError(f"agentgym: option url must be an http(s) URL of an AgentGym server, got {self.url!r}")
        if self.timeout_s <= 0 or self.reward_scale <= 0:
            raise ValueError("agentgym: timeout_s and reward_scale must be > 0")
        if self.action_format not in ACTION_FORMATS:
            raise ValueError(f"agentgym: action_format must be one of {ACTION_FORMATS}, got {self.action_format!r}")
        if self.num_tasks is not None and self.splits is not None:
            raise ValueError("agentgym: set num_tasks or splits, not both")
        if self.num_tasks is not None or self.splits is not None:
            self.task_splits()  # validates them now rather than at the first session
        self.conversation_start()

    def conversation_start(self) -> ConversationStart:
        """The instruction and examples given in the options (``ValueError`` if malformed)."""
        if not all(isinstance(turn, list) and len(turn) == 2 for example in self.examples for turn in example):
            raise ValueError("agentgym: examples must be lists of [observation, reply] turns")
        return ConversationStart(self.instruction, self.acknowledgement,
                                 tuple(tuple(tuple(turn) for turn in example) for example in self.examples),
                                 self.default_examples)

    def task_splits(self) -> dict[str, range]:
        """Task indices per split, from ``num_tasks`` or ``splits``."""
        if self.num_tasks is None and self.splits is None:
            raise ValueError("agentgym: the task list is unknown; set num_tasks (an int) or "
                             "splits ({name: [start, stop]}) in envhub.env_options")
        if self.num_tasks is not None:
            if isinstance(self.num_tasks, bool) or not isinstance(self.num_tasks, int) or self.num_tasks < 1:
                raise ValueError(f"agentgym: num_tasks must be an int >= 1, got {self.num_tasks!r}")
            return {"train": range(self.num_tasks)}
        if not isinstance(self.splits, dict) or not self.splits:
            raise ValueError(f"agentgym: splits must map split names to [start, stop], got {self.splits!r}")
        return {name: _split_range(name, bounds) for name, bounds in self.splits.items()}

    @classmethod
    def parse(cls, options: dict[str, Any]) -> AgentGymOptions:
        """Options from a mapping; unknown keys are an error naming the valid ones."""
        return parse_options(cls, options, "agentgym")


def _split_range(name: str, bounds: Any) -> range:
    valid = (isinstance(bounds, (list, tuple)) and len(bounds) == 2
             and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds) and 0 <= bounds[0] < bounds[1])
    if not valid:
        raise ValueError(f"agentgym: split {name!r} must be [start, stop] with 0 <= start < stop, got {bounds!r}")
    return range(bounds[0], bounds[1])


@functools.cache
def _tls_context() -> ssl.SSLContext:
    # One context for every session: building one per client costs time and memory.
    return ssl.create_default_context()


def observation_text(answer: Any) -> str | None:
    """The observation in a server answer (str, or a dict with ``observation``/``state``)."""
    if isinstance(answer, str):
        return answer
    if not isinstance(answer, dict):
        return None
    text = answer.get("observation", answer.get("state"))
    if not isinstance(text, str):
        return None
    parts = [answer["task_description"], text] if isinstance(answer.get("task_description"), str) else [text]
    if isinstance(answer.get("available_actions"), list):
        parts.append("AVAILABLE ACTIONS: " + ", ".join(map(str, answer["available_actions"])))
    return "\n".join(parts)


class AgentGymEnv(Environment):
    """One episode on a remote AgentGym env server (one server-side env per session)."""

    # Harmless in most AgentGym envs; pass a real script to the conformance checker per server.
    example_actions = ("Thought: I should look around.\nAction: look",
                       "Thought: Let me check what I carry.\nAction: inventory")

    def __init__(self, **options: Any) -> None:
        self.options = AgentGymOptions.parse(options)
        self._http: httpx.AsyncClient | None = None
        self._remote_id: Any = None
        self._best_score = 0.0

    @classmethod
    def task_splits(cls, **options: Any) -> dict[str, range]:
        return AgentGymOptions.parse(options).task_splits()

    @classmethod
    def conversation_start(cls, **options: Any) -> ConversationStart:
        return AgentGymOptions.parse(options).conversation_start()

    async def reset(self, task_id: str, seed: int) -> tuple[str, dict[str, Any]]:
        if self._remote_id is None:
            self._remote_id = await self._create()
        body = {**self.options.reset_body, **self._id_param(), self.options.task_field: int(task_id)}
        observation = observation_text(await self._call("POST", "/reset", body))
        if observation is None:  # WebShop-style reset: the text comes from /observation
            observation = observation_text(await self._call("GET", "/observation", params=self._id_param()))
        if observation is None:
            raise AgentGymServerError(f"{self.options.url}: no observation after resetting task {task_id}")
        self._best_score = 0.0
        return observation, {"success": False}

    async def step(self, action: str) -> StepResult:
        if self.options.action_format == "thought_action":
            parsed = extract_action(action)
            if isinstance(parsed, MalformedAction):
                return StepResult(parsed.feedback, 0.0, False, False,
                                  {"success": False, "malformed_action": True, "action_parsed": False})
            action = parsed
        answer = await self._call("POST", "/step", {**self._id_param(), "action": action})
        observation = observation_text(answer)
        if observation is None or not isinstance(answer, dict) or not isinstance(answer.get("done"), bool):
            raise AgentGymServerError(f"{self.options.url}/step: the answer lacks an observation or a bool done: "
                                      f"{str(answer)[:300]}")
        reward, reached_one = self._reward(answer.get(self.options.reward_field, 0.0))
        success = answer["success"] if isinstance(answer.get("success"), bool) else reached_one
        info = {"success": bool(answer["done"] and success), "server_reward": answer.get(self.options.reward_field),
                "action_parsed": True}
        return StepResult(observation, reward, answer["done"], False, info)

    def _reward(self, raw: Any) -> tuple[float, bool]:
        """(reward of this step in [0, 1], whether the reward or best score reached 1)."""
        if raw is None:
            raw = 0.0
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            raise AgentGymServerError(f"{self.options.url}/step: {self.options.reward_field} is not a finite "
                                      f"number: {raw!r}")
        value = min(1.0, max(0.0, float(raw) * self.options.reward_scale))
        if not self.options.cumulative_reward:
            return value, value >= 1.0
        increase = max(0.0, value - self._best_score)
        self._best_score = max(self._best_score, value)
        return increase, self._best_score >= 1.0

    async def close(self) -> None:
        try:
            if self._remote_id is not None and self.options.close_path:
                await self._close_remote()
        finally:
            self._remote_id = None
            if self._http is not None:
                await self._http.aclose()
                self._http = None

    async def _close_remote(self) -> None:
        try:
            await self._call("POST", self.options.close_path, self._id_param())
        except AgentGymServerError as error:
            if error.status_code not in CLOSE_NOT_SUPPORTED:
                raise

    async def _create(self) -> Any:
        answer = await self._call("POST", "/create", self.options.create_body or None)
        remote_id = answer.get("id", answer.get(self.options.id_field)) if isinstance(answer, dict) else answer
        if isinstance(remote_id, bool) or not isinstance(remote_id, (int, str)):
            raise AgentGymServerError(f"{self.options.url}/create: no env id in the answer {str(answer)[:300]}")
        return remote_id

    def _id_param(self) -> dict[str, Any]:
        return {self.options.id_field: self._remote_id}

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            # trust_env=False: env servers are local or cluster-internal; no proxy should intercept them.
            self._http = httpx.AsyncClient(base_url=self.options.url, timeout=self.options.timeout_s,
                                           trust_env=False, verify=_tls_context(),
                                           limits=httpx.Limits(max_connections=2))
        return self._http

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
                    params: dict[str, Any] | None = None) -> Any:
        """One request; any failure, including an ``{"error": ...}`` answer, raises AgentGymServerError."""
        where = f"{method} {self.options.url}{path}"
        try:
            response = await self._client().request(method, path, json=body, params=params)
        except httpx.HTTPError as error:
            raise AgentGymServerError(f"{where} failed: {type(error).__name__}: {error}") from error
        if not response.is_success:
            raise AgentGymServerError(f"{where} answered HTTP {response.status_code}: {response.text[:300]}",
                                      response.status_code)
        try:
            answer = response.json()
        except ValueError:
            raise AgentGymServerError(f"{where} answered non-JSON: {response.text[:300]!r}") from None
        if isinstance(answer, dict) and "error" in answer:
            raise AgentGymServerError(f"{where} reported an error: {answer['error']}")
        return answer
