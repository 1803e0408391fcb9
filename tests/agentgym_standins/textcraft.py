"""TextCraft's server: agentenv-textcraft/agentenv_textcraft/server.py, model.py, env_wrapper.py.

/create needs a JSON object (its body model has only optional fields, but the body itself is
required: no body answers 422) and resets env ``id`` to task ``id``; failures are HTTP 200
``{"error": ...}``; /close answers true, or false for an unknown id.
"""

from __future__ import annotations

from typing import Any, Optional

from fastapi import FastAPI
from pydantic import BaseModel

from tests.agentgym_standins import StandinState, secret_of


class CreateRequestBody(BaseModel):
    commands: Optional[str] = None
    goal: Optional[str] = None


class StepRequestBody(BaseModel):
    id: int
    action: str


class ResetRequestBody(BaseModel):
    id: int
    data_idx: Optional[int] = 0


class CloseRequestBody(BaseModel):
    id: int


def textcraft_app(state: StandinState) -> FastAPI:
    app = FastAPI()

    def new_game(task: int) -> dict[str, Any]:
        secret = secret_of(task)
        first = f"Crafting commands:\ncraft {secret} using 1 stick\n\nGoal: craft {secret}."
        return {"secret": secret, "sticks": 0, "observation": first}

    def checked(env_id: int) -> dict[str, Any]:
        if env_id not in state.envs:
            raise NameError(f"The id {env_id} is not valid.")
        return state.envs[env_id]

    @app.post("/create")
    async def create(body: CreateRequestBody) -> Any:
        env_id = state.new_id()
        state.envs[env_id] = new_game(env_id)
        return {"id": env_id, "observation": state.envs[env_id]["observation"], "done": False, "reward": 0}

    @app.post("/reset")
    def reset(body: ResetRequestBody) -> Any:
        try:
            checked(body.id).update(new_game(body.data_idx))
            return {"id": body.id, "observation": state.envs[body.id]["observation"], "done": False, "reward": 0}
        except Exception as error:
            return {"error": str(error)}

    @app.post("/step")
    def step(body: StepRequestBody) -> Any:
        try:
            game = checked(body.id)
        except Exception as error:
            return {"error": f"{error}"}
        state.actions.append(body.action)
        return play(game, body.action)

    @app.get("/observation")
    def observation(id: int) -> Any:
        try:
            return checked(id)["observation"]
        except Exception as error:
            return {"error": str(error)}

    @app.post("/close")
    def close(body: CloseRequestBody) -> Any:
        state.closes += 1
        return state.envs.pop(body.id, None) is not None

    return app


def play(game: dict[str, Any], action: str) -> dict[str, Any]:
    reward, done = 0, False
    if action == "get 1 stick":
        game["sticks"] += 1
        text = "Got 1 stick"
    elif action == f"craft {game['secret']} using 1 stick" and game["sticks"]:
        text, reward, done = f"Crafted 1 minecraft:{game['secret']}", 1, True
    elif action.startswith("craft "):
        text = f"Could not find enough items to craft minecraft:{action.split()[1]}"
    else:
        text = f"Could not execute {action}"
    game["observation"] = text
    return {"observation": text, "reward": reward, "done": done}
