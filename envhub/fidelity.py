"""Fidelity check: does an env's ``agentgym`` dialect behave as AgentGym's own server does?

Each native env that speaks AgentGym's dialect ships ``envhub/envs/<name>/fidelity.py`` with a
``fidelity_cases()`` function returning ``FidelityCase``s: scripted episodes written in AgentGym's
action grammar, on fixed tasks, with what AgentGym's server answers at each step (observation
text, score, done) as read from AgentGym's source (``agentenv-<name>`` in WooooDyy/AgentGym),
never guessed. ``python -m envhub check --dialect agentgym [ENV_ID]`` plays them in-process and
reports every step that differs.

Scores: every step of an ``agentgym``-dialect env carries ``info["score"]``, the step's score as
AgentGym's client reports it (its ``StepOutput.reward``: the server's ``reward``, or BabyAI's and
SciWorld's running ``score``; SciWorld's may be negative). AgentGym-RL takes the last step's as the
episode's score; its evaluation (``main_eval.py``) takes the mean (Avg) and the best (Pass) of a
task's n scores, each averaged over tasks. ``reward`` stays the envhub contract's [0, 1] training signal.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from envhub.base import Environment

FIDELITY_MODULES = {
    "textcraft-v0": "envhub.envs.textcraft.fidelity",
    "babyai-v0": "envhub.envs.babyai.fidelity",
    "sciworld-v0": "envhub.envs.sciworld.fidelity",
    "search-v0": "envhub.envs.search.fidelity",
    "webnav-v0": "envhub.envs.webnav.fidelity",
}
"""Env id -> module with ``fidelity_cases()``; a module not (yet) present is reported as missing."""


@dataclass(frozen=True)
class ExpectedStep:
    """What AgentGym's server answers to one action. ``None`` fields are not compared."""

    action: str
    """The reply sent, exactly as an AgentGym agent writes it (including any ``Action:`` line)."""
    observation: str | None = None
    """The whole observation text, when AgentGym's is fixed."""
    observation_contains: tuple[str, ...] = ()
    """Substrings the observation must contain (for observations with varying parts)."""
    score: float | None = None
    """``info["score"]`` after this step (AgentGym's reward field)."""
    done: bool | None = None
    """Whether the episode ended (``terminated or truncated``)."""


@dataclass(frozen=True)
class FidelityCase:
    """One scripted episode and AgentGym's answers to it."""

    name: str
    task_id: str
    steps: tuple[ExpectedStep, ...]
    options: dict[str, Any] = field(default_factory=dict)
    """Constructor options beyond ``dialect="agentgym"`` (e.g. a small corpus for search)."""
    seed: int = 0
    first_observation_contains: tuple[str, ...] = ()
    success: bool | None = None
    """``info["success"]`` of the last step, when the script reaches a terminal step."""
    source: str = ""
    """Where in AgentGym's source the expected answers come from (file and function)."""


async def play_case(env: Environment, case: FidelityCase) -> list[str]:
    """Play ``case`` on a fresh ``env``; return every difference from AgentGym (empty: faithful)."""
    problems: list[str] = []
    observation, _ = await env.reset(case.task_id, case.seed)
    problems += _missing(f"{case.name}: first observation", observation, case.first_observation_contains)
    result = None
    for number, expected in enumerate(case.steps, 1):
        result = await env.step(expected.action)
        where = f"{case.name}: step {number} ({expected.action!r})"
        if expected.observation is not None and result.observation != expected.observation:
            problems.append(f"{where}: observation {result.observation!r}, AgentGym's {expected.observation!r}")
        problems += _missing(f"{where}: observation", result.observation, expected.observation_contains)
        score = result.info.get("score")
        if expected.score is not None and (score is None or abs(float(score) - expected.score) > 1e-6):
            problems.append(f"{where}: score {score!r}, AgentGym's {expected.score!r}")
        done = result.terminated or result.truncated
        if expected.done is not None and done != expected.done:
            problems.append(f"{where}: done {done}, AgentGym's {expected.done}")
    if case.success is not None and (result is None or result.info.get("success") != case.success):
        got = None if result is None else result.info.get("success")
        problems.append(f"{case.name}: success {got!r}, AgentGym's {case.success!r}")
    return problems


def _missing(where: str, text: str, parts: tuple[str, ...]) -> list[str]:
    return [f"{where} lacks {part!r} (got {text[:300]!r})" for part in parts if part not in text]


def cases_for(env_id: str) -> list[FidelityCase]:
    """The fidelity cases of ``env_id``; ``LookupError`` when it has none."""
    if env_id not in FIDELITY_MODULES:
        raise LookupError(f"{env_id} has no AgentGym fidelity cases; envs with some: {', '.join(FIDELITY_MODULES)}")
    try:
        module = importlib.import_module(FIDELITY_MODULES[env_id])
    except ModuleNotFoundError as error:
        if error.name != FIDELITY_MODULES[env_id]:
            raise  # the module is there, something it needs is not
        raise LookupError(f"{env_id}: {error.name} is missing") from None
    return list(module.fidelity_cases())
