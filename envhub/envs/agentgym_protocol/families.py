"""One entry per AgentGym env-server family: its routes, field names and rules, read from its source.

Every entry cites the files it follows (WooooDyy/AgentGym: the server ``agentenv-*/…server.py`` and
its pydantic models, and the client ``agentenv/agentenv/envs/<env>.py`` whose ``reset``/``observe``/
``step`` decide what the agent reads and what AgentGym scores). `AgentGymEnv` interprets the table;
a family is chosen with the ``family`` option and any field can be overridden by an option of the
same name (see options.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ActionFormat = Literal["thought_action", "react", "react_single_line", "react_first", "sql_block",
                       "backticked", "raw"]
"""How a reply becomes the ``action`` sent to ``/step`` (envhub/envs/agentgym_protocol/replies.py)."""

FirstObservation = Literal["reset_reply", "reset_reply_with_task", "reset_reply_with_actions",
                           "observation_route", "reset_reply_with_vocabulary", "reset_or_route"]
"""Where the first observation comes from, as the family's AgentGym client composes ``observe()``:
the ``/reset`` answer's ``observation`` (with SciWorld's ``task_description`` before it, ALFWorld's
``available_actions`` after it, or Wordle's vocabulary from ``/filtered_vocab``), ``GET /observation``,
or (``custom``) the reset answer when it holds one, else ``GET /observation``."""

DoneRule = Literal["done", "terminated_truncated"]
"""``done``: one bool (-> terminated); ``terminated_truncated``: WebArena's Gymnasium pair."""

SuccessRule = Literal["score_reaches_one", "score_positive"]
"""On the terminal step: the scaled score reached 1 (most envs), or any positive score (BabyAI:
minigrid pays ``1 - 0.9 * steps / max_steps`` < 1 for a win and AgentGym's server only reports
``done`` for a reward above 0.5)."""


@dataclass(frozen=True)
class ServerFamily:
    """The protocol of one AgentGym env-server family."""

    name: str
    """The ``family`` option's value."""
    source: str
    """The AgentGym files this entry follows."""
    route_prefix: str = ""
    """Prefix of every route (LMRL-Gym serves ``/maze/...`` and ``/wordle/...`` on one port)."""
    create_body: dict[str, Any] | None = None
    """JSON body of ``POST /create``; None sends none (servers whose /create takes no parameter)."""
    id_field: str = "id"
    """Key of the server-side env id in every body and ``GET`` query (``env_idx`` or ``id``)."""
    task_field: str = "data_idx"
    """``/reset`` key carrying the task index."""
    reset_body: dict[str, Any] = field(default_factory=dict)
    """Further ``/reset`` keys AgentGym's client always sends (ALFWorld's world_type, WebArena's seed)."""
    first_observation: FirstObservation = "reset_reply"
    """Where the first observation comes from (`FirstObservation`)."""
    reset_failure_observation: str | None = None
    """A ``/reset`` observation that means the reset failed (WebArena answers 200 ``TimeoutError``)."""
    observation_field: str = "observation"
    """``/step`` answer key of the next observation (``state`` for WebShop and SQLGym); empty (``custom``):
    ``observation``, else ``state``, with any ``task_description`` and ``available_actions`` folded in."""
    done_rule: DoneRule = "done"
    """How /step says the episode ended (`DoneRule`)."""
    score_field: str = "reward"
    """``/step`` answer key that AgentGym's client returns as ``StepOutput.reward`` (the score)."""
    score_scale: float = 1.0
    """Score x this = envhub's [0, 1] scale (SciWorld scores 0..100)."""
    cumulative_score: bool = False
    """The score field is the episode's score so far (not a per-step reward)."""
    success_rule: SuccessRule = "score_reaches_one"
    """When a terminal step is a win (`SuccessRule`)."""
    action_format: ActionFormat = "react"
    """How a reply becomes the action sent (`ActionFormat`)."""
    close_path: str = ""
    """Route that frees a server-side env; empty: the server has none, envs are reused instead."""
    max_server_envs: int | None = None
    """Server-side envs the server holds before it hands out old ids again (SQLGym 8, WebShop 8000)."""


def _tool(name: str) -> ServerFamily:
    # The five Toolusage servers share one protocol, file for file (agentenv-tool/agentenv_<name>/).
    return ServerFamily(
        name, f"agentenv-tool/agentenv_{name}/{name}_server.py, {name}_model.py; agentenv/envs/{name}.py",
        create_body={"id": 0}, id_field="env_idx", task_field="id", first_observation="observation_route",
        action_format="raw", cumulative_score=True)


FAMILIES: dict[str, ServerFamily] = {family.name: family for family in (
    ServerFamily("custom", "a server shaped like AgentGym's but none of its families: the defaults envhub "
                 "had before families; every field is an option", first_observation="reset_or_route",
                 observation_field="", action_format="thought_action", close_path="/close"),
    ServerFamily("textcraft", "agentenv-textcraft/agentenv_textcraft/server.py, model.py, env_wrapper.py; "
                 "agentenv/envs/textcraft.py", create_body={}, action_format="react_single_line",
                 close_path="/close"),
    ServerFamily("babyai", "agentenv-babyai/agentenv_babyai/server.py, model.py, environment.py; "
                 "agentenv/envs/babyai.py", score_field="score", cumulative_score=True,
                 success_rule="score_positive", action_format="react_single_line", close_path="/close"),
    ServerFamily("sciworld", "agentenv-sciworld/agentenv_sciworld/server.py, model.py, environment.py; "
                 "agentenv/envs/sciworld.py", first_observation="reset_reply_with_task", score_field="score",
                 score_scale=0.01, cumulative_score=True, close_path="/close"),
    ServerFamily("webshop", "agentenv-webshop/agentenv_webshop/server.py, model.py, environment.py; "
                 "agentenv/envs/webshop.py", id_field="env_idx", task_field="session_id",
                 first_observation="observation_route", observation_field="state", max_server_envs=8000),
    ServerFamily("alfworld", "agentenv-alfworld/agentenv_alfworld/server.py, model.py, env_wrapper.py; "
                 "agentenv/envs/alfworld.py", task_field="game", reset_body={"world_type": "Text"},
                 first_observation="reset_reply_with_actions"),
    ServerFamily("sqlgym", "agentenv-sqlgym/agentenv_sqlgym/server.py, model.py, environment.py; "
                 "agentenv/envs/sqlgym.py", id_field="env_idx", task_field="item_id",
                 first_observation="observation_route", observation_field="state", action_format="sql_block",
                 max_server_envs=8),
    ServerFamily("maze", "agentenv-lmrlgym/agentenv_lmrlgym/server.py, maze/model.py, maze/environment.py; "
                 "agentenv/envs/lmrlgym.py (MazeEnvClient)", route_prefix="/maze", task_field="game",
                 action_format="react_first"),
    ServerFamily("wordle", "agentenv-lmrlgym/agentenv_lmrlgym/server.py, wordle/model.py, wordle/environment.py; "
                 "agentenv/envs/lmrlgym.py (WordleEnvClient)", route_prefix="/wordle", task_field="seed",
                 first_observation="reset_reply_with_vocabulary", action_format="react_first"),
    ServerFamily("webarena", "agentenv-webarena/agentenv_webarena/server.py (Quart), environment.py; "
                 "agentenv/envs/webarena.py", id_field="env_idx", task_field="idx", reset_body={"seed": 0},
                 first_observation="observation_route", reset_failure_observation="TimeoutError",
                 done_rule="terminated_truncated", action_format="backticked", close_path="/close"),
    # SearchQA may pay a wrong but well-formed answer a format score and let it retry: pay the best, not the sum.
    ServerFamily("searchqa", "agentenv-searchqa/agentenv_searchqa/server.py, model.py, env_wrapper.py; "
                 "agentenv/envs/searchqa.py", create_body={"id": 0}, id_field="env_idx", task_field="id",
                 first_observation="observation_route", cumulative_score=True, action_format="raw",
                 close_path="/close"),
    *(_tool(name) for name in ("academia", "movie", "todo", "sheet", "weather")),
)}
"""Every AgentGym env-server family in WooooDyy/AgentGym (agentenv-*), plus ``custom``."""


def family_named(name: Any) -> ServerFamily:
    """The family called ``name``; ``ValueError`` naming the known ones."""
    if not isinstance(name, str) or name not in FAMILIES:
        raise ValueError(f"agentgym: unknown family {name!r}; families: {', '.join(FAMILIES)}")
    return FAMILIES[name]
