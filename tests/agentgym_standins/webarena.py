"""WebArena's server: agentenv-webarena/agentenv_webarena/server.py (Quart, not FastAPI) and
environment.py (WebarenaEnvServer).

No request models: a missing key is an uncaught KeyError (HTTP 500). /create answers
``{"env_idx": n}``; /reset needs ``env_idx``, ``seed`` and ``idx``, and a reset that fails inside
(the browser or a site timed out) answers HTTP 200 ``{"observation": "TimeoutError", ...}``;
the client reads the prompt from GET /observation; /step takes the whole reply, parses the
action between triple backticks itself (a reply without one is answered with the parse error as
the observation, reward 0, not terminated) and answers ``terminated``/``truncated``; a ``stop``
action terminates and is evaluated (1.0 for the right answer). /close answers ``{"closed": ...}``.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI, Request

from tests.agentgym_standins import StandinState, secret_of

TIMEOUT_TASKS = {13}
"""Tasks whose reset fails the way a slow site or dead browser fails."""
_BACKTICKED = re.compile(r"```((.|\n)*?)```")


def webarena_app(state: StandinState) -> FastAPI:
    app = FastAPI()

    @app.post("/create")
    async def create() -> Any:
        env_id = state.new_id()
        state.envs[env_id] = {"trajectory": []}
        return {"env_idx": env_id}

    @app.post("/reset")
    async def reset(request: Request) -> Any:
        query = await request.json()
        task = query["idx"]
        try:
            if task in TIMEOUT_TASKS:
                raise TimeoutError("Timeout 30000ms exceeded.")
            env = state.envs[query["env_idx"]]
            env.update(intent=f"Tell me the word of task {task}.", secret=secret_of(task), seed=query["seed"],
                       page="[1] RootWebArea 'Home' focused: True\n[4] link 'Words'", previous="None")
            observation = {"text": env["page"]}
            sites, intent = ["shopping"], env["intent"]
        except Exception:
            observation, sites, intent = {"text": "TimeoutError"}, "Error", "Error"
        return {"observation": observation["text"], "sites": sites, "object": intent}

    @app.get("/observation")
    async def observation(env_idx: int) -> Any:
        return prompt(state.envs[env_idx])

    @app.post("/step")
    async def step(request: Request) -> Any:
        query = await request.json()
        env, reply = state.envs[query["env_idx"]], query["action"]
        state.actions.append(reply)
        match = _BACKTICKED.search(reply)
        if match is None:
            return {"observation": f"Cannot parse action from response {reply}", "reward": 0,
                    "terminated": False, "truncated": False, "info": None}
        action = match.group(1).strip()
        env["previous"] = action
        terminated = action.startswith("stop")
        reward = float(action == f"stop [{env['secret']}]") if terminated else 0.0
        if action.startswith("click"):
            env["page"] = f"[1] RootWebArea 'Words' focused: True\n[7] StaticText 'The word is {env['secret']}'"
        return {"observation": prompt(env), "reward": reward, "terminated": terminated, "truncated": False,
                "info": {"page": "words"}}

    @app.post("/close")
    async def close(request: Request) -> Any:
        query = await request.json()
        state.closes += 1
        state.envs.pop(query["env_idx"], None)
        return {"closed": "closed"}

    return app


def prompt(env: dict[str, Any]) -> str:
    return f"OBSERVATION:\n{env['page']}\nURL: http://localhost/words\nOBJECTIVE: {env['intent']}\n" \
           f"PREVIOUS ACTION: {env['previous']}"
