"""babyai-v0's agentgym dialect against AgentGym's own BabyAI code, on random episodes.

Plays seeded random replies (offered actions, and now and then a refused, empty or doubled one) on
our env, then replays the same replies through AgentGym's server class (agentenv-babyai/
agentenv_babyai/environment.py, read from the AgentGym mirror, never copied into this repo) behind
its client's reply parsing, in a subprocess that can use AgentGym's minigrid pin, and prints how
many episodes differ (observation, score or done at any step) with the first differences.

    pip install --target /tmp/mg23 --no-deps minigrid==2.3.1 gymnasium==0.29.1   # AgentGym's pin
    .venv/bin/python -m tests.bench.babyai_agentgym_oracle --tasks 0-399 --turns 30 --minigrid-dir /tmp/mg23

Without ``--minigrid-dir`` AgentGym's code runs on this venv's minigrid 3 (its level 4,
``GoToObjS6-v0``, is then taken as ``GoToObjS6-v1``, and Synth-family layouts differ: see
envhub/envs/babyai/agentgym_levels.py). Last runs: on minigrid 2.3.1, tasks 0-2399 (20-30 turns each;
every refusal text of the server came up) agree at every step; on minigrid 3, 7 of tasks 0-199
differ (level 4 and the Synth levels, as expected).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

REPO = Path(__file__).resolve().parents[2]
MIRROR = "/work/.mirror/WooooDyy+AgentGym/repo"
SERVER_FILE = "agentenv-babyai/agentenv_babyai/environment.py"
ODD_REPLIES = ("Action: fly", "Action: drop", "Action:", "no action", "Action: a\nAction: b",
               "Action: check available actions", "Thought: hm\n\nAction:\n**Go to goal**.")


def record(tasks: list[int], turns: int) -> list[dict]:
    """Our env's answers to seeded random replies."""
    from envhub.envs.babyai.agentgym_game import AgentGymGame

    game, episodes = AgentGymGame(), []
    for task in tasks:
        rng = random.Random(task)
        observation, _ = game.reset(str(task))
        episode = {"task": task, "reset": observation, "steps": []}
        for _ in range(turns):
            reply = _random_reply(observation, rng)
            result = game.step(reply)
            observation = result.observation
            episode["steps"].append({"reply": reply, "observation": observation, "score": result.info["score"],
                                     "done": result.terminated})
            if result.terminated:
                break
        episodes.append(episode)
    return episodes


def _random_reply(observation: str, rng: random.Random) -> str:
    """Mostly an offered action; sometimes an odd reply, or a verb tried on an object in view (which
    brings out the server's refusal texts)."""
    offered = re.findall(r'"([^"]*)"', observation.rsplit("Available actions: ", 1)[-1]) or ["turn left"]
    in_view = re.findall(r"There is a (\w+ (?:\w+ )?\w+ \d+) ", observation)
    draw = rng.random()
    if draw < 0.08:
        return rng.choice(ODD_REPLIES)
    if draw < 0.2 and in_view:
        verb = rng.choice(("go to", "pickup", "go through", "toggle and go through", "move forward", "toggle", "drop"))
        return f"Action: {verb}" + ("" if verb in ("move forward", "toggle", "drop") else f" {rng.choice(in_view)}")
    return f"Action: {rng.choice(offered)}"


def replay_in_agentgym(episodes: list[dict], minigrid_dir: str | None) -> list[list[dict]]:
    """AgentGym's answers to the same replies, from its code in a subprocess."""
    with tempfile.TemporaryDirectory() as folder:
        source = subprocess.run(["git", "--git-dir", MIRROR, "show", f"HEAD:{SERVER_FILE}"], check=True,
                                capture_output=True, text=True).stdout
        if minigrid_dir is None:  # minigrid 3 has no GoToObjS6-v0
            source = source.replace('"BabyAI-GoToObjS6-v0"', '"BabyAI-GoToObjS6-v1"')
        Path(folder, "agentgym_babyai.py").write_text(source)
        for stub in ("gym", "matplotlib"):  # imported there, unused by the server's logic
            Path(folder, stub).mkdir()
            Path(folder, stub, "__init__.py").write_text("class Env:\n    pass\n")
        Path(folder, "matplotlib", "pyplot.py").write_text("")
        paths = [p for p in (minigrid_dir, folder) if p]
        done = subprocess.run([sys.executable, "-m", "tests.bench.babyai_agentgym_oracle", "--replay", *paths],
                              cwd=REPO, input=json.dumps(episodes), capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])


def _replay_here(paths: list[str]) -> None:
    """Subprocess side: play each episode's replies through AgentGym's server class and client parsing."""
    sys.path[:0] = paths
    import minigrid  # noqa: F401  (registers the BabyAI ids)
    from agentgym_babyai import BabyAIEnv as AgentGymServer

    answers = []
    for episode in json.loads(sys.stdin.read()):
        server = AgentGymServer()
        env_id = server.create()["id"]
        with contextlib.redirect_stdout(io.StringIO()):
            replies = [server.reset(env_id, episode["task"])]
            for step in episode["steps"]:
                action = _agentgym_client_action(step["reply"])
                replies.append({"observation": "Error: Only one 'Action' is allowed per response. Please adjust "
                                "your response.", "score": 0, "done": False} if action is None
                               else server.step(env_id, action))
        answers.append([{key: reply.get(key) for key in ("observation", "score", "done")} for reply in replies])
    print(json.dumps(answers))


def _agentgym_client_action(reply: str) -> str | None:
    """BabyAIEnvClient.step's parsing (agentenv/agentenv/envs/babyai.py), restated for the replay."""
    matches = re.findall(r"Action:\s*(.*?)(?=\n|$)", reply, re.DOTALL)
    if len(matches) > 1:
        return None
    return " ".join(re.sub(r"[^A-Za-z0-9, ]+", "", matches[-1] if matches else "").split()).strip()


def differences(episodes: list[dict], answers: list[list[dict]]) -> list[str]:
    found = []
    for episode, theirs in zip(episodes, answers):
        if episode["reset"] != theirs[0]["observation"]:
            found.append(f"task {episode['task']} reset:\n  ours {episode['reset']!r}\n  AgentGym {theirs[0]!r}")
            continue
        for number, (ours, answer) in enumerate(zip(episode["steps"], theirs[1:]), 1):
            if (ours["observation"] != answer["observation"] or ours["done"] != answer["done"]
                    or abs(ours["score"] - float(answer["score"])) > 1e-9):
                found.append(f"task {episode['task']} step {number} {ours['reply']!r}:\n  ours {ours!r}\n"
                             f"  AgentGym {answer!r}")
                break
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="0-399", help="task id range FIRST-LAST")
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--minigrid-dir", help="a folder holding AgentGym's minigrid pin (pip --target)")
    parser.add_argument("--replay", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay:
        _replay_here(args.replay)
        return
    first, last = (int(part) for part in args.tasks.split("-"))
    episodes = record(list(range(first, last + 1)), args.turns)
    found = differences(episodes, replay_in_agentgym(episodes, args.minigrid_dir))
    for text in found[:5]:
        print(text)
    steps = sum(len(episode["steps"]) for episode in episodes)
    print(f"{len(episodes)} episodes, {steps} steps: {len(found)} episodes differ from AgentGym's code")


if __name__ == "__main__":
    main()
