"""ScienceWorld's server: agentenv-sciworld/agentenv_sciworld/server.py, model.py, environment.py.

/create takes no body; /reset answers ``task_description`` apart from the ``observation``; /step
answers ``reward`` (this step's) and ``score`` (the episode's, 0..100, -100 for a failed task);
failures are HTTP 200 ``{"error": ...}``, except /close of a closed env, which raises (HTTP 500).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from tests.agentgym_standins import StandinState, secret_of


class StepRequestBody(BaseModel):
    id: int
    action: str


class ResetRequestBody(BaseModel):
    id: int
    data_idx: int


class CloseRequestBody(BaseModel):
    id: int


def sciworld_app(state: StandinState) -> FastAPI:
    app = FastAPI()

    def checked(env_id: int, is_reset: bool = False) -> dict[str, Any]:
        if env_id not in state.envs or state.envs[env_id]["deleted"]:
            raise ValueError(f"The id {env_id} is not valid.")
        if not is_reset and state.envs[env_id]["done"]:
            raise ValueError(f"The task with environment {env_id} has finished.")
        return state.envs[env_id]

    @app.post("/create")
    def create() -> Any:
        env_id = state.new_id()
        state.envs[env_id] = {"deleted": False, "done": False}
        return {"id": env_id}

    @app.post("/reset")
    def reset(body: ResetRequestBody) -> Any:
        try:
            game = checked(body.id, is_reset=True)
            game.update(secret=secret_of(body.data_idx), score=0, done=False, looked=False)
            return {"task_name": "find-thing", "var_num": body.data_idx,
                    "task_description": f"Your task is to find the {game['secret']}. Focus on it.",
                    "observation": "This room is called the hallway.", "reward": 0, "score": 0,
                    "deleted": False, "done": False}
        except Exception as error:
            return {"error": str(error)}

    @app.post("/step")
    def step(body: StepRequestBody) -> Any:
        try:
            game = checked(body.id)
        except Exception as error:
            return {"error": str(error)}
        state.actions.append(body.action)
        before = game["score"]
        if body.action == "look around" and not game["looked"]:
            game.update(looked=True, score=25)
            text = f"This room is called the hallway. In it, you see: a {game['secret']}."
        elif body.action == f"focus on {game['secret']}":
            game.update(score=100, done=True)
            text = f"You focus on the {game['secret']}."
        elif body.action.startswith("focus on "):
            game.update(score=-100, done=True)
            text = "You focus on the wrong thing."
        else:
            text = "No known action matches that input."
        return {"observation": text, "reward": game["score"] - before, "score": game["score"], "done": game["done"]}

    @app.post("/close")
    def close(body: CloseRequestBody) -> Any:
        state.closes += 1
        if state.envs[body.id]["deleted"]:  # uncaught, as in the real server: HTTP 500
            raise ValueError(f"The task with environment {body.id} has been deleted.")
        del state.envs[body.id]
        return True

    return app
