"""SearchQA's server: agentenv-searchqa/agentenv_searchqa/server.py, model.py, env_wrapper.py.

/create needs ``{"id": int}`` (422 without) and answers a bare int; ids travel as ``env_idx``;
/reset answers the observation text (the client reads GET /observation); /step takes the model's
whole reply and finds ``<search>`` or ``<answer>`` in it itself; an unknown id or a task out of
range is an uncaught exception (HTTP 500); /close answers true, or false for an unknown id.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from fastapi import FastAPI
from pydantic import BaseModel

from tests.agentgym_standins import StandinState, secret_of

NUM_ITEMS = 221328
_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


class CreateQuery(BaseModel):
    id: int


class StepQuery(BaseModel):
    env_idx: int
    action: str


class StepResponse(BaseModel):
    observation: str
    reward: float
    done: bool
    info: None


class ResetQuery(BaseModel):
    env_idx: int
    id: Optional[int] = None


class CloseRequestBody(BaseModel):
    env_idx: int


def searchqa_app(state: StandinState) -> FastAPI:
    app = FastAPI()

    def checked(env_idx: int) -> dict[str, Any]:
        if env_idx not in state.envs:
            raise IndexError(f"Env {env_idx} not found")
        return state.envs[env_idx]

    def item(item_id: int) -> dict[str, Any]:
        if not 0 <= item_id < NUM_ITEMS:
            raise ValueError(f"Item id {item_id} is out of range.")
        return {"question": f"Which word does task {item_id} hide?", "answer": secret_of(item_id)}

    @app.post("/create", response_model=int)
    def create(query: CreateQuery) -> Any:
        env_id = state.new_id()
        state.envs[env_id] = item(query.id)
        return env_id

    @app.post("/reset", response_model=str)
    def reset(query: ResetQuery) -> Any:
        checked(query.env_idx)
        state.envs[query.env_idx] = item(query.id)
        return observation(query.env_idx)

    @app.get("/observation", response_model=str)
    def observation(env_idx: int) -> Any:
        return f"Answer inside <answer>...</answer>; search with <search>...</search>.\n\n " \
               f"Question: {checked(env_idx)['question']}"

    @app.post("/step", response_model=StepResponse)
    def step(query: StepQuery) -> Any:
        task = checked(query.env_idx)
        state.actions.append(query.action)
        match = _TAG.search(query.action)
        reward, done = 0.0, False
        if match and match.group(1) == "search":
            text = f"<information>Doc 1(Title: {match.group(2).strip()}) The word is {task['answer']}.\n</information>"
        elif match and match.group(2).strip().lower() == task["answer"]:
            reward, done = 1.0, True
            text = "Congratulations! You have answered the question correctly."
        elif match:
            text = "Sorry, your answer is incorrect. Please try again."
        else:
            text = "Your previous action is invalid. Please try again."
        return StepResponse(observation=text, reward=reward, done=done, info=None)

    @app.post("/close")
    def close(body: CloseRequestBody) -> Any:
        state.closes += 1
        return state.envs.pop(body.env_idx, None) is not None

    return app
