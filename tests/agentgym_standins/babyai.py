"""BabyAI's server: agentenv-babyai/agentenv_babyai/server.py, model.py, environment.py (BabyAIEnv).

/create takes no body; /reset needs ``data_idx``; /step answers ``reward`` (minigrid's, below 1 for
a win) and ``score`` (the previous score plus this reward) and, once done, refuses further steps
with ``{"error": "... has finished."}``; failures are HTTP 200 ``{"error": ...}``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from tests.agentgym_standins import StandinState, secret_of

WIN_REWARD = 1 - 0.9 * (1 / 5)  # minigrid: 1 - 0.9 * step_count / max_steps, one step of five


class StepRequestBody(BaseModel):
    id: int
    action: str


class ResetRequestBody(BaseModel):
    id: int
    data_idx: int


class CloseRequestBody(BaseModel):
    id: int


def babyai_app(state: StandinState) -> FastAPI:
    app = FastAPI()

    def checked(env_id: int, is_reset: bool = False) -> dict[str, Any]:
        if env_id not in state.envs:
            raise ValueError(f"The id {env_id} is not valid.")
        if not is_reset and state.envs[env_id].get("done"):
            raise ValueError(f"The task with environment {env_id} has finished.")
        return state.envs[env_id]

    @app.post("/create")
    async def create() -> Any:
        env_id = state.new_id()
        state.envs[env_id] = {"done": False}
        return {"id": env_id}

    @app.post("/reset")
    def reset(body: ResetRequestBody) -> Any:
        try:
            game = checked(body.id, is_reset=True)
            secret = secret_of(body.data_idx)
            game.update(secret=secret, done=False, score=0, reward=0)
            text = f"Your goal: go to the {secret} ball\nIn front of you in this room, you can see several objects: " \
                   f"There is a {secret} ball 1 right in front of you 1 steps away." + actions_of(secret)
            return {"observation": text, "reward": 0, "score": 0, "deleted": False, "done": False}
        except Exception as error:
            return {"error": str(error)}

    @app.post("/step")
    def step(body: StepRequestBody) -> Any:
        try:
            game = checked(body.id)
            state.actions.append(body.action)
            if body.action == f"go to {game['secret']} ball 1":
                game.update(reward=WIN_REWARD, done=True)
                text = "There is a barrier in front of you.\n The task is completed."
            else:
                text = "The action is not recognized. Please check valid actions."
            payload = {"observation": text + actions_of(game["secret"]), "reward": game["reward"],
                       "score": game["score"] + game["reward"], "done": game["done"]}
            game["score"] = payload["score"]
            return payload
        except Exception as error:
            return {"error": str(error)}

    @app.post("/close")
    def close(body: CloseRequestBody) -> Any:
        state.closes += 1
        return state.envs.pop(body.id, None) is not None

    return app


def actions_of(secret: str) -> str:
    return f'\nAvailable actions: ["turn left", "turn right", "go to {secret} ball 1", "check available actions"]'
