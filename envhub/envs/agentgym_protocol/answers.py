"""Reading AgentGym servers' answers under a family's protocol (families.py): pure functions.

``AgentGymServerError`` for an answer that breaks the protocol, so envhub reports the server's
words instead of a KeyError deep in a step.
"""

from __future__ import annotations

import math
from typing import Any

from envhub.envs.agentgym_protocol.families import ServerFamily
from envhub.envs.agentgym_protocol.remote import AgentGymServerError


def reset_observation(protocol: ServerFamily, answer: Any) -> str | None:
    """The first observation in a /reset answer, composed as the family's AgentGym client does;
    None when the answer holds none (or the family reads it elsewhere)."""
    how = protocol.first_observation
    if how == "reset_or_route":
        return custom_observation(answer)
    text = answer.get("observation") if isinstance(answer, dict) else None
    if not isinstance(text, str):
        return None
    if how == "reset_reply_with_task" and isinstance(answer.get("task_description"), str):
        return f"{answer['task_description']}\n{text}"  # SciworldEnvClient.reset
    if how == "reset_reply_with_actions" and isinstance(answer.get("available_actions"), list):
        return f"{text}\nAVAILABLE ACTIONS: {','.join(map(str, answer['available_actions']))}"  # AlfWorld observe()
    return text if how in ("reset_reply", "reset_reply_with_vocabulary") else None


def with_vocabulary(text: str, vocabulary: Any) -> str | None:
    """Wordle's first observation: WordleEnvClient shows GET /filtered_vocab, the only words the game takes."""
    if not (isinstance(vocabulary, list) and all(isinstance(word, str) for word in vocabulary)):
        return None
    return f"{text}\nThe words the game accepts:\n" + "\n".join(vocabulary)


def custom_observation(answer: Any) -> str | None:
    """The observation in a ``custom`` server's answer (str, or a dict with ``observation``/``state``)."""
    if isinstance(answer, str):
        return answer
    if not isinstance(answer, dict):
        return None
    text = answer.get("observation", answer.get("state"))
    if not isinstance(text, str):
        return None
    parts = [answer["task_description"], text] if isinstance(answer.get("task_description"), str) else [text]
    if isinstance(answer.get("available_actions"), list):
        parts.append("AVAILABLE ACTIONS: " + ", ".join(map(str, answer["available_actions"])))
    return "\n".join(parts)


def step_fields(protocol: ServerFamily, answer: Any, where: str) -> tuple[str, bool, bool]:
    """(observation, terminated, truncated) of a /step answer."""
    answer = answer if isinstance(answer, dict) else {}
    field = protocol.observation_field
    observation = answer.get(field) if field else custom_observation(answer)
    if protocol.done_rule == "done":
        flags = (answer.get("done"), False)
    else:
        flags = (answer.get("terminated"), answer.get("truncated"))
    if not isinstance(observation, str) or not all(isinstance(flag, bool) for flag in flags):
        wanted = "done" if protocol.done_rule == "done" else "terminated and truncated"
        raise AgentGymServerError(f"{where}: the answer lacks a str {field or 'observation'!r} or bool "
                                  f"{wanted}: {str(answer)[:300]}")
    return observation, flags[0], flags[1]


def step_score(protocol: ServerFamily, answer: dict[str, Any], terminated: bool, where: str) -> float:
    """AgentGym's score of the step: what its client returns as ``StepOutput.reward``."""
    raw = answer.get(protocol.score_field)
    raw = 0.0 if raw is None else raw
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise AgentGymServerError(f"{where}: {protocol.score_field} is not a finite number: {raw!r}")
    if protocol.done_rule == "terminated_truncated" and not terminated:
        return 0.0  # WebarenaEnvClient.step counts the reward of a terminated step only
    return float(raw)


def training_reward(protocol: ServerFamily, score: float, best_so_far: float) -> tuple[float, float]:
    """(envhub's [0, 1] reward for this step, the best scaled score so far). A running score pays its
    increases over the best so far, so an episode's rewards sum to the best score it reached."""
    value = min(1.0, max(0.0, score * protocol.score_scale))
    if not protocol.cumulative_score:
        return value, max(best_so_far, value)
    return max(0.0, value - best_so_far), max(best_so_far, value)


def succeeded(protocol: ServerFamily, answer: dict[str, Any], score: float) -> bool:
    """Whether an episode ending with this step was won: the server's own bool ``success`` if it sends
    one, else the family's rule on AgentGym's score."""
    if isinstance(answer.get("success"), bool):
        return answer["success"]
    if protocol.success_rule == "score_positive":
        return score > 0
    return score * protocol.score_scale >= 1.0 - 1e-9
