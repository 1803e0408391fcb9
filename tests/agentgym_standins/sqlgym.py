"""SQLGym's server: agentenv-sqlgym/agentenv_sqlgym/server.py, model.py, environment.py.

Like WebShop's: a bare random int from /create, old ids again once it holds 8 envs, ``env_idx``,
``state``, /reset answers ``[text, null]`` and the client reads GET /observation; ``item_id`` is
required and one outside BIRD's 0..10961 is an uncaught ValueError (HTTP 500), as is an unknown id;
there is no /close.
"""

from __future__ import annotations

from typing import Any, List, Tuple

from fastapi import FastAPI
from pydantic import BaseModel

from tests.agentgym_standins import StandinState, secret_of
from tests.agentgym_standins.webshop import cycling_create

MAX_ENVS = 8
NUM_ITEMS = 10962


class StepQuery(BaseModel):
    env_idx: int
    action: str


class StepResponse(BaseModel):
    state: str
    reward: float
    done: bool
    info: Any


class ResetQuery(BaseModel):
    env_idx: int
    item_id: int


def sqlgym_app(state: StandinState) -> FastAPI:
    app = FastAPI()
    state.next_id = -1

    def checked(env_idx: int) -> dict[str, Any]:
        if env_idx not in state.envs:
            raise IndexError(f"Env {env_idx} not found")
        return state.envs[env_idx]

    @app.post("/create", response_model=int)
    async def create() -> Any:
        return cycling_create(state, MAX_ENVS)

    @app.get("/list_envs", response_model=List[int])
    async def list_envs() -> Any:
        return list(state.envs)

    @app.post("/reset", response_model=Tuple[str, None])
    async def reset(query: ResetQuery) -> Any:
        game = checked(query.env_idx)
        if not 0 <= query.item_id < NUM_ITEMS:
            raise ValueError(f"Item id {query.item_id} is out of range.")
        secret = secret_of(query.item_id)
        game.update(secret=secret, observation=f"Which word does table words hold for item {query.item_id}?\n"
                                               "CREATE TABLE words (word TEXT);")
        return game["observation"], None

    @app.get("/observation", response_model=str)
    async def observation(env_idx: int) -> Any:
        return checked(env_idx)["observation"]

    @app.post("/step", response_model=StepResponse)
    async def step(query: StepQuery) -> Any:
        game = checked(query.env_idx)
        state.actions.append(query.action)
        right = query.action == f"SELECT word FROM words WHERE word = '{game['secret']}'"
        result = str([(game["secret"],)] if right else [])
        return StepResponse(state=result, reward=float(right), done=right, info=None)

    return app
