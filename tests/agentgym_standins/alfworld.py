"""ALFWorld's server: agentenv-alfworld/agentenv_alfworld/server.py, model.py, env_wrapper.py.

/create takes no body; /reset needs ``game`` (int) and ``world_type`` (str, one of Text, Embody,
Hybrid, else ``{"error"}``) and answers the admissible commands as ``available_actions``, as does
/step; a finished env refuses steps until reset; there is no /close (404).
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
    game: int
    world_type: str


def alfworld_app(state: StandinState) -> FastAPI:
    app = FastAPI()

    def checked(env_id: int, is_reset: bool = False) -> dict[str, Any]:
        if env_id not in state.envs:
            raise NameError(f"The id {env_id} is not valid.")
        if not is_reset and state.envs[env_id]["done"]:
            raise NameError(f"The task with environment {env_id} has finished.")
        return state.envs[env_id]

    @app.post("/create")
    async def create() -> Any:
        env_id = state.new_id()
        state.envs[env_id] = {"done": False, "reward": 0}
        return {"id": env_id}

    @app.post("/reset")
    async def reset(body: ResetRequestBody) -> Any:
        if body.world_type not in ["Text", "Embody", "Hybrid"]:
            return {"error": 'world_type must be one of "Text", "Embody" and "Hybrid"'}
        try:
            game = checked(body.id, is_reset=True)
            game.update(secret=secret_of(body.game), done=False, reward=0)
            text = f"You are in the middle of a room.\nYour task is to: take the {game['secret']}."
            return {"id": body.id, "observation": text, "available_actions": actions_of(game),
                    "task_type": "pick_and_place_simple/trial_1"}
        except Exception as error:
            return {"error": str(error)}

    @app.post("/step")
    async def step(body: StepRequestBody) -> Any:
        try:
            game = checked(body.id)
            state.actions.append(body.action)
            won = body.action == f"take {game['secret']}"
            game.update(done=won, reward=float(won))
            text = f"You pick up the {game['secret']}." if won else "Nothing happens."
            return {"observation": text, "reward": game["reward"], "available_actions": actions_of(game),
                    "done": game["done"]}
        except Exception as error:
            return {"error": f"{error}"}

    return app


def actions_of(game: dict[str, Any]) -> list[str]:
    return ["look", "inventory", f"take {game['secret']}", "take spoon"]
