"""LMRL-Gym's server (maze and wordle on one port): agentenv-lmrlgym/agentenv_lmrlgym/server.py,
maze/model.py, maze/environment.py, wordle/model.py, wordle/environment.py.

Routes sit under ``/maze`` and ``/wordle``; /create takes no body; maze's /reset needs ``game``
(0..25), wordle's ``seed``; a finished env refuses steps until reset; failures are HTTP 200
``{"error": ...}``; there is no /close. Maze pays 1 on reaching the goal; wordle pays 1 for the
right word and 0 otherwise (its server shifts LMRL-Gym's -1..0 up by one).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from tests.agentgym_standins import SECRETS, StandinState, secret_of

MAZE_GAMES = 26
WORDLE_GUESSES = 6


class MazeStepRequestBody(BaseModel):
    id: int
    action: str


class MazeResetRequestBody(BaseModel):
    id: int
    game: int


class WordleStepRequestBody(BaseModel):
    id: int
    action: str


class WordleResetRequestBody(BaseModel):
    id: int
    seed: int


def lmrlgym_app(state: StandinState) -> FastAPI:
    app = FastAPI()

    def checked(env_id: int, is_reset: bool = False) -> dict[str, Any]:
        if env_id not in state.envs:
            raise NameError(f"The id {env_id} is not valid.")
        if not is_reset and state.envs[env_id]["done"]:
            raise NameError(f"The task with environment {env_id} has finished.")
        return state.envs[env_id]

    def create() -> Any:
        env_id = state.new_id()
        state.envs[env_id] = {"done": False}
        return {"id": env_id}

    app.post("/maze/create")(create)
    app.post("/wordle/create")(create)

    @app.post("/maze/reset")
    def maze_reset(body: MazeResetRequestBody) -> Any:
        try:
            game = checked(body.id, is_reset=True)
            if body.game >= MAZE_GAMES:
                raise NameError(f"The game {body.game} is not valid.")
            game.update(row=7 - body.game % 3, done=False)
            return {"observation": maze_text(game)}
        except Exception as error:
            return {"error": str(error)}

    @app.post("/maze/step")
    def maze_step(body: MazeStepRequestBody) -> Any:
        try:
            game = checked(body.id)
        except Exception as error:
            return {"error": f"{error}"}
        state.actions.append(body.action)
        game["row"] += body.action == "move down"
        game["done"] = game["row"] == 8
        return {"observation": "Success" if game["done"] else maze_text(game), "reward": int(game["done"]),
                "done": game["done"]}

    @app.post("/wordle/reset")
    def wordle_reset(body: WordleResetRequestBody) -> Any:
        try:
            checked(body.id, is_reset=True).update(secret=spaced(secret_of(body.seed)), guesses=0, done=False)
            return {"id": body.id, "observation": "Let's start Wordle!"}
        except Exception as error:
            return {"error": str(error)}

    @app.post("/wordle/step")
    def wordle_step(body: WordleStepRequestBody) -> Any:
        try:
            game = checked(body.id)
        except Exception as error:
            return {"error": f"{error}"}
        state.actions.append(body.action)
        return wordle_guess(game, body.action)

    @app.get("/wordle/filtered_vocab")
    def filtered_vocab(id: int) -> Any:
        try:
            checked(id)
            return [spaced(word) for word in SECRETS]
        except Exception as error:
            return {"error": str(error)}

    return app


def maze_text(game: dict[str, Any]) -> str:
    return f"The goal is at position 8, 6. Your current position is at position {game['row']}, 6. " \
           "There are walls to your right, to your left."


def spaced(word: str) -> str:
    return " ".join(word)


def wordle_guess(game: dict[str, Any], guess: str) -> dict[str, Any]:
    if guess not in {spaced(word) for word in SECRETS}:
        return {"observation": "invalid word", "reward": 0, "done": False}
    game["guesses"] += 1
    won = guess == game["secret"]
    feedback = " ".join("g" if a == b else "y" if a in game["secret"] else "b"
                        for a, b in zip(guess.split(), game["secret"].split()))
    game["done"] = won or game["guesses"] >= WORDLE_GUESSES
    return {"observation": feedback, "reward": 1 if won else 0, "done": game["done"]}
