"""WebShop's server: agentenv-webshop/agentenv_webshop/server.py, model.py, environment.py.

/create takes no body and answers a bare int (a random id); once it holds ``max_envs`` envs (8000)
it hands out the old ids again, in turn. Ids travel as ``env_idx``; /reset answers ``[text, null]``
and the client reads GET /observation; /step answers ``state``; an unknown id is an uncaught
KeyError (HTTP 500); there is no /close.
"""

from __future__ import annotations

import random
from typing import Any, List, Optional, Tuple

from fastapi import FastAPI
from pydantic import BaseModel

from tests.agentgym_standins import StandinState, secret_of


class StepQuery(BaseModel):
    env_idx: int
    action: str


class StepResponse(BaseModel):
    state: str
    reward: float
    done: bool
    info: None


class ResetQuery(BaseModel):
    env_idx: int
    session_id: Optional[int] = None


def cycling_create(state: StandinState, max_envs: int) -> int:
    """WebshopEnvServer.create / SqlGymEnvServer.create: a random new id, or an old one once full."""
    if len(state.envs) == max_envs:
        state.next_id = (state.next_id + 1) % max_envs
        return list(state.envs)[state.next_id]
    state.creates += 1
    env_id = random.randint(0, 48950076)
    state.envs[env_id] = {}
    return env_id


def webshop_app(state: StandinState, max_envs: int = 8000) -> FastAPI:
    app = FastAPI()
    state.next_id = -1

    @app.post("/create", response_model=int)
    async def create() -> Any:
        return cycling_create(state, max_envs)

    @app.get("/list_envs", response_model=List[int])
    async def list_envs() -> Any:
        return list(state.envs)

    @app.post("/reset", response_model=Tuple[str, None])
    def reset(query: ResetQuery) -> Any:
        game = state.envs[query.env_idx]
        secret = secret_of(query.session_id or 0)
        game.update(secret=secret, searched=None,
                    observation=f"WebShop [SEP] Instruction: [SEP] Find me a {secret} [SEP] Search")
        return game["observation"], None

    @app.get("/observation", response_model=str)
    def observation(env_idx: int) -> Any:
        return state.envs[env_idx]["observation"]

    @app.post("/step", response_model=StepResponse)
    def step(query: StepQuery) -> Any:
        game = state.envs[query.env_idx]
        state.actions.append(query.action)
        reward, done = 0.0, False
        if query.action.startswith("search[") and query.action.endswith("]"):
            game["searched"] = query.action[len("search["):-1]
            game["observation"] = f"Back to Search [SEP] Page 1 (Total results: 1) [SEP] {game['searched']} " \
                                  "[SEP] $10.00"
        elif query.action == "click[buy now]" and game["searched"] is not None:
            reward, done = (1.0 if game["searched"] == game["secret"] else 0.25), True
            game["observation"] = "Thank you for shopping with us!"
        return StepResponse(state=game["observation"], reward=reward, done=done, info=None)

    return app
