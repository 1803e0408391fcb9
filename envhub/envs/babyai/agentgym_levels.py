"""The minigrid levels as AgentGym's BabyAI server builds them: its minigrid (< 2.5, i.e. 2.3.1 on
Python 3.11) differs from this env's (3.x) in two ways that change the layouts, both kept here.

1. AgentGym's level 4, ``BabyAI-GoToObjS6-v0``, was registered in minigrid < 2.5 with
   ``room_size=4`` (a registry bug minigrid 3 fixed by adding ``GoToObjS6-v1``, room size 6): its
   layouts are those of ``BabyAI-GoToObjS4-v0``.
2. Levels built on minigrid's ``LevelGen`` (the Synth, Boss, GoToSeq and PickupLoc levels) kept the
   previous mission's ``locked_room`` when a new mission added none (minigrid 3 resets it), and
   AgentGym resets each fresh env twice (``BabyAI.__init__`` and then ``BabyAIEnv.reset``), so the
   first reset can leak into the second. Here the leak is restored (assignments of None to
   ``locked_room`` are ignored, as minigrid < 2.5 never made them after ``__init__``) and every
   reset is AgentGym's double reset from a cleared state.
"""

from __future__ import annotations

from typing import Any

from envhub.envs.babyai.levels import AGENTGYM_SEEDS, LEVELS, make_level, quiet_minigrid

AGENTGYM_LEVEL_IDS: tuple[str, ...] = tuple(
    "BabyAI-GoToObjS4-v0" if level_id == "BabyAI-GoToObjS6-v1" else level_id for level_id, _ in LEVELS)
"""minigrid ids that build AgentGym's 40 levels, in AgentGym's order."""


def agentgym_level_and_seed(task_id: str) -> tuple[str, int]:
    """(minigrid env id, seed) of AgentGym's ``data_idx``; ValueError outside [0, 40 * AGENTGYM_SEEDS)."""
    try:
        number = int(task_id)
    except (TypeError, ValueError):
        raise ValueError(f"babyai-v0: task id must be a decimal integer, got {task_id!r}") from None
    if not 0 <= number < len(LEVELS) * AGENTGYM_SEEDS:
        raise ValueError(f"babyai-v0: task id {number} outside [0, {len(LEVELS) * AGENTGYM_SEEDS})")
    return AGENTGYM_LEVEL_IDS[number % len(LEVELS)], number // len(LEVELS)


class _LeakyLockedRoom:
    """Mixin: ``locked_room`` survives a new mission that adds no locked room (minigrid < 2.5)."""

    @property
    def locked_room(self) -> Any:
        return self.__dict__.get("_agentgym_locked_room")

    @locked_room.setter
    def locked_room(self, room: Any) -> None:
        if room is not None:
            self.__dict__["_agentgym_locked_room"] = room

    def forget_locked_room(self) -> None:
        """A fresh env's state, as AgentGym's ``gymnasium.make`` gives each reset."""
        self.__dict__["_agentgym_locked_room"] = None


def make_agentgym_level(level_id: str) -> Any:
    """A minigrid env (unwrapped) of ``level_id`` that generates layouts as AgentGym's minigrid does."""
    game = make_level(level_id)  # imports minigrid and registers its ids
    import gymnasium
    from minigrid.envs.babyai.core.levelgen import LevelGen

    if not isinstance(game, LevelGen):
        return game
    game.close()
    # Built again from the mixed-in class: an existing env cannot take a new class (its layout differs).
    leaky = type(f"AgentGym{type(game).__name__}", (_LeakyLockedRoom, type(game)), {})
    with quiet_minigrid():
        game = leaky(**gymnasium.spec(level_id).kwargs)
    game.forget_locked_room()
    return game


def reset_as_agentgym(game: Any, seed: int) -> dict[str, Any]:
    """Reset ``game`` twice with ``seed`` from a fresh state, as AgentGym does; the second reset's
    observation (the one its server describes)."""
    if isinstance(game, _LeakyLockedRoom):
        game.forget_locked_room()
    with quiet_minigrid():
        game.reset(seed=seed)
        return game.reset(seed=seed)[0]
