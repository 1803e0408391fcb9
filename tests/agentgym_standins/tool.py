"""The tool servers (academia, movie, todo, sheet, weather): agentenv-tool/agentenv_<name>/
<name>_server.py, <name>_model.py, <name>_environment.py; one protocol for all five.

/create needs ``{"id": int}`` (the task, 422 without) and answers a bare int; ids travel as
``env_idx``; /reset answers the observation text; /step takes the whole reply and reads
``Action: <tool> with Action Input: <json>`` itself; ``reward`` is the task's progress rate
(0..1); an unknown id or task is an uncaught exception (HTTP 500); there is no /close.
"""

from __future__ import annotations

import re
from typing import Any, List, Optional

from fastapi import FastAPI
from pydantic import BaseModel

from tests.agentgym_standins import StandinState, secret_of

NUM_TASKS = 20
FORMAT_ERROR = 'Format error, please response in the format of  "Action: [your action] with Action Input: ' \
               '[your action input]'
_ACTION = re.compile(r"Action:\s*(\w+)\s*with Action Input:\s*(.*)", re.DOTALL)


class CreateQuery(BaseModel):
    id: int


class StepQuery(BaseModel):
    env_idx: int
    action: str


class StepResponse(BaseModel):
    observation: str
    reward: float
    done: bool


class ResetQuery(BaseModel):
    env_idx: int
    id: Optional[int] = None


def tool_app(state: StandinState) -> FastAPI:
    app = FastAPI()

    def task(task_id: int) -> dict[str, Any]:
        if not 0 <= task_id < NUM_TASKS:
            raise IndexError("list index out of range")
        return {"goal": f"Find the word of task {task_id} and answer it.", "secret": secret_of(task_id),
                "reward": 0.0, "new_trial": True}

    @app.get("/list_envs", response_model=List[int])
    def list_envs() -> Any:
        return list(state.envs)

    @app.post("/create", response_model=int)
    def create(query: CreateQuery) -> Any:
        env_id = state.new_id()
        state.envs[env_id] = task(query.id)
        return env_id

    @app.post("/reset", response_model=str)
    def reset(query: ResetQuery) -> Any:
        state.envs[query.env_idx].update(task(query.id if query.id is not None else 0))
        return observation(query.env_idx)

    @app.get("/observation", response_model=str)
    def observation(env_idx: int) -> Any:
        env = state.envs[env_idx]
        if env["new_trial"]:
            return f"Now new trial starts.\nYou should perform actions to accomplish the goal: {env['goal']}\n" \
                   "Give me one action."
        return f"Observation: {env['last']}"

    @app.post("/step", response_model=StepResponse)
    def step(query: StepQuery) -> Any:
        env = state.envs[query.env_idx]
        state.actions.append(query.action)
        match = _ACTION.search(query.action)
        if match is None:
            return StepResponse(observation=FORMAT_ERROR, reward=env["reward"], done=False)
        tool, argument = match.group(1), match.group(2).strip()
        done = tool == "finish"
        if tool == "lookup":
            env["reward"], env["last"] = max(env["reward"], 0.5), f"The word is {env['secret']}."
        elif done:
            env["reward"] = 1.0 if env["secret"] in argument else env["reward"]
            env["last"] = "Task finished."
        else:
            env["last"] = f"Unknown tool {tool}."
        env["new_trial"] = False
        return StepResponse(observation=f"Observation: {env['last']}\nGive me one action.", reward=env["reward"],
                            done=done)

    return app
