"""babyai-v0's ``agentgym`` dialect: one episode as AgentGym's BabyAI server and client play it.

Read from AgentGym's source (WooooDyy/AgentGym), and checked by running that source on random
episodes (all agree, on minigrid 2.3.1 with agentgym_levels.py's level building):
- the client (agentenv/agentenv/envs/babyai.py, ``BabyAIEnvClient.step``) takes the text after the
  reply's only ``Action:`` (to the end of that line), keeps letters, digits, commas and spaces and
  squeezes the spaces; two or more ``Action:`` lines get an error and reach no server (score 0);
- the server (agentenv-babyai/agentenv_babyai/environment.py, ``BabyAI.step``/``update`` and
  ``BabyAIEnv.step``) lower-cases the action; "check ..." lists the actions; an action outside this
  turn's table gets its refusal text or "The action is not recognized. Please check valid actions.";
  an accepted one runs its primitives in minigrid, stopping after the first that leaves the agent's
  view image unchanged (that step still counts);
- reward: minigrid's reward of the last primitive run (``1 - 0.9 * steps / max_steps`` on success);
  done: minigrid's ``terminated`` of that primitive, forced back to false when the reward is at most
  0.5 ("The task is completed." is still appended); minigrid's time limit is ignored;
- score (what the client reports, what AgentGym-RL keeps): the server adds the current reward to a
  running total at every step, refused ones included.

The training reward (``StepResult.reward``, in [0, 1]) pays out the score clipped to [0, 1] as it
rises: over an episode it sums to the highest clipped score reached. That is AgentGym-RL's training
reward (the final score) clipped to [0, 1], whenever the score never falls; it falls only after a
late success (reward <= 0.5), when a multi-``Action:`` reply follows (the client scores it 0) or the
success came so late that minigrid's reward is negative. Late successes can pile the score above 1.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from envhub.base import StepResult
from envhub.envs.agentgym_protocol.replies import ONE_ACTION_ONLY, single_line_client_action
from envhub.envs.babyai.agentgym_actions import ActionTable, build_action_table
from envhub.envs.babyai.agentgym_levels import agentgym_level_and_seed, make_agentgym_level, reset_as_agentgym
from envhub.envs.babyai.agentgym_scene import describe_scene, read_scene

MANY_ACTIONS = ONE_ACTION_ONLY
UNRECOGNIZED = "The action is not recognized. Please check valid actions."
NO_CHANGE = "No change in state."
COMPLETED = "\n The task is completed."
DONE_MIN_REWARD = 0.5
"""AgentGym keeps an episode going when the success reward is at most this (a slow success)."""


client_action = single_line_client_action
"""The action AgentGym's client sends for a reply; None when it sends none (several actions)."""


def mission_text(mission: str) -> str:
    """AgentGym's goal line words sequences with "and" (``BabyAI.reset``)."""
    return mission.replace("then", "and").replace("after you", "and")


def available_list(table: ActionTable) -> str:
    return "\nAvailable actions: [" + ", ".join(f'"{name}"' for name in table.primitives) + "]"


class AgentGymGame:
    """One BabyAI episode at a time under AgentGym's rules; minigrid levels are kept for reuse."""

    def __init__(self) -> None:
        self._levels: dict[str, Any] = {}
        self._game: Any = None
        self._level_id, self._level_seed = "", 0
        self._table = ActionTable()
        self._state_text = ""
        self._image: Any = None
        self._reward = self._score = self._paid = 0.0
        self._done = True

    def reset(self, task_id: str) -> tuple[str, dict[str, Any]]:
        self._level_id, self._level_seed = agentgym_level_and_seed(task_id)
        if self._level_id not in self._levels:
            self._levels[self._level_id] = make_agentgym_level(self._level_id)
        self._game = self._levels[self._level_id]
        self._image = reset_as_agentgym(self._game, self._level_seed)["image"]
        self._look()
        self._reward = self._score = self._paid = 0.0
        self._done = False
        observation = f"Your goal: {mission_text(self._game.mission)}\n{self._state_text}{available_list(self._table)}"
        return observation, self._info(parsed=True, valid=True)

    def step(self, reply: str) -> StepResult:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        action = client_action(reply)
        if action is None:  # the client answers itself; AgentGym-RL records score 0 for this turn
            return StepResult(MANY_ACTIONS, 0.0, False, False,
                              self._info(parsed=False, valid=False) | {"score": 0.0, "success": False})
        valid = self._server_step(action.lower().strip())
        self._score += self._reward
        clipped = min(max(self._score, 0.0), 1.0)
        reward = max(clipped - self._paid, 0.0)
        self._paid += reward
        observation = self._state_text + available_list(self._table)
        return StepResult(observation, reward, self._done, False, self._info(parsed=bool(action), valid=valid))

    def _server_step(self, action: str) -> bool:
        """AgentGym's ``BabyAI.step`` on the client's action; whether it was accepted."""
        if "check" in action:
            self._state_text = "You can take the following actions: " + ", ".join(self._table.primitives)
            return True
        if action not in self._table.primitives:
            self._state_text = NO_CHANGE if action == "" else self._table.refusals.get(action, UNRECOGNIZED)
            return False
        primitives = self._table.primitives[action]
        if not primitives:
            self._state_text = NO_CHANGE
            return True
        reward, terminated = self._run(primitives)
        self._look()
        self._reward = float(reward)
        self._done = bool(terminated) and self._reward > DONE_MIN_REWARD
        if terminated:
            self._state_text += COMPLETED
        return True

    def _run(self, primitives: list[int]) -> tuple[float, bool]:
        """Step minigrid through ``primitives``, stopping after one that leaves the view image unchanged
        (AgentGym's ``verify_action``); the last primitive's (reward, terminated)."""
        for primitive in primitives:
            observation, reward, terminated, _, _ = self._game.step(primitive)
            if not np.any(observation["image"] != self._image):
                break
            self._image = observation["image"]
        self._image = observation["image"]
        return reward, terminated

    def _look(self) -> None:
        scene = read_scene(self._game, self._image)
        self._table = build_action_table(scene)
        self._state_text = describe_scene(scene)

    def _info(self, parsed: bool, valid: bool) -> dict[str, Any]:
        return {
            "success": self._score > 0.0, "score": float(self._score), "action_parsed": parsed, "action_valid": valid,
            "level": self._level_id, "level_seed": self._level_seed, "primitive_steps": int(self._game.step_count),
            "max_primitive_steps": int(self._game.max_steps),
        }

    def close(self) -> None:
        for game in self._levels.values():
            game.close()
        self._levels.clear()
        self._game = None
        self._done = True
