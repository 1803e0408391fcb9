"""The 40 BabyAI levels of babyai-v0, how task ids map to (level, seed), and the task splits.

The level list and its order are AgentGym's agentenv-babyai list (``all_levels`` in
agentenv_babyai/environment.py, so results compare with the AgentGym/AgentGym-RL papers), except that
minigrid 3 renamed ``GoToObjS6-v0`` to ``GoToObjS6-v1``. The agentgym dialect builds the levels as
AgentGym's minigrid (< 2.5) did: envhub/envs/babyai/agentgym_levels.py.

Task ids, per dialect (the minigrid level is reset with the seed, so a task id alone fixes the
layout and the mission):
- ``agentgym``: AgentGym's ``data_idx`` (``BabyAIEnv.reset``): level ``id % 40`` of the list (its
  ``all_levels[id % 40 + 1]``), seed ``id // 40``. Ids 0-39999 (seeds 0-999); ``test`` is ids 0-399
  (seeds 0-9, every level ten times), ``train`` the rest. AgentGym's own item lists (AgentEval's 90 BabyAI test items,
  AgentGym-RL's AgentItemId/babyai_train.json) are not in its repositories; low ids are held out so
  that AgentEval-style small ids are never trained on.
- ``lenient``: ``level_index * seeds_per_level + seed_offset``, the last ``test_seeds_per_level``
  offsets of each level held out.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from typing import Any

LEVELS: tuple[tuple[str, str], ...] = (
    # (minigrid env id, family); the family names the minigrid module that defines the level.
    ("BabyAI-GoToRedBallGrey-v0", "goto"),  # 0
    ("BabyAI-GoToRedBall-v0", "goto"),
    ("BabyAI-GoToRedBallNoDists-v0", "goto"),
    ("BabyAI-GoToObjS6-v1", "goto"),
    ("BabyAI-GoToLocalS8N7-v0", "goto"),
    ("BabyAI-GoToObjMazeS7-v0", "goto"),  # 5
    ("BabyAI-GoToImpUnlock-v0", "goto"),
    ("BabyAI-GoToSeqS5R2-v0", "goto"),
    ("BabyAI-GoToRedBlueBall-v0", "goto"),
    ("BabyAI-GoToDoor-v0", "goto"),
    ("BabyAI-GoToObjDoor-v0", "goto"),  # 10
    ("BabyAI-Open-v0", "open"),
    ("BabyAI-OpenRedDoor-v0", "open"),
    ("BabyAI-OpenDoorLoc-v0", "open"),
    ("BabyAI-OpenRedBlueDoorsDebug-v0", "open"),
    ("BabyAI-OpenDoorsOrderN4Debug-v0", "open"),  # 15
    ("BabyAI-Pickup-v0", "pickup"),
    ("BabyAI-UnblockPickup-v0", "pickup"),
    ("BabyAI-PickupLoc-v0", "pickup"),
    ("BabyAI-PickupDistDebug-v0", "pickup"),
    ("BabyAI-PickupAbove-v0", "pickup"),  # 20
    ("BabyAI-PutNextLocalS6N4-v0", "putnext"),
    ("BabyAI-PutNextS7N4Carrying-v0", "putnext"),
    ("BabyAI-Unlock-v0", "unlock"),
    ("BabyAI-UnlockLocalDist-v0", "unlock"),
    ("BabyAI-KeyInBox-v0", "unlock"),  # 25
    ("BabyAI-UnlockPickupDist-v0", "unlock"),
    ("BabyAI-BlockedUnlockPickup-v0", "unlock"),
    ("BabyAI-UnlockToUnlock-v0", "unlock"),
    ("BabyAI-ActionObjDoor-v0", "other"),
    ("BabyAI-FindObjS7-v0", "other"),  # 30
    ("BabyAI-KeyCorridorS6R3-v0", "other"),
    ("BabyAI-OneRoomS20-v0", "other"),
    ("BabyAI-MoveTwoAcrossS8N9-v0", "other"),
    ("BabyAI-SynthS5R2-v0", "synth"),
    ("BabyAI-SynthLoc-v0", "synth"),  # 35
    ("BabyAI-SynthSeq-v0", "synth"),
    ("BabyAI-MiniBossLevel-v0", "synth"),
    ("BabyAI-BossLevel-v0", "synth"),
    ("BabyAI-BossLevelNoUnlock-v0", "synth"),  # 39
)
FAMILIES: tuple[str, ...] = ("goto", "open", "pickup", "putnext", "unlock", "other", "synth")


@dataclass(frozen=True)
class TaskLayout:
    """How task ids are laid out over levels and seeds (the env's options)."""

    seeds_per_level: int = 1000
    """Task ids per level: level i owns ids [i * seeds_per_level, (i + 1) * seeds_per_level)."""

    test_seeds_per_level: int = 100
    """The last this-many seed offsets of every level form the held-out test split."""

    def __post_init__(self) -> None:
        for name in ("seeds_per_level", "test_seeds_per_level"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"babyai-v0: {name} must be an int, got {value!r}")
        if not 0 < self.test_seeds_per_level < self.seeds_per_level:
            raise ValueError(f"babyai-v0: need 0 < test_seeds_per_level < seeds_per_level, got "
                             f"{self.test_seeds_per_level} and {self.seeds_per_level}")

    @property
    def train_seeds_per_level(self) -> int:
        return self.seeds_per_level - self.test_seeds_per_level

    def level_and_seed(self, task_id: str) -> tuple[str, int]:
        """(minigrid env id, seed) of a task id; ValueError for ids outside the 40 levels."""
        try:
            number = int(task_id)
        except (TypeError, ValueError):
            raise ValueError(f"babyai-v0: task id must be a decimal integer, got {task_id!r}") from None
        level_index, seed_offset = divmod(number, self.seeds_per_level)
        if number < 0 or level_index >= len(LEVELS):
            raise ValueError(f"babyai-v0: task id {number} outside [0, {len(LEVELS) * self.seeds_per_level})")
        return LEVELS[level_index][0], seed_offset

    def splits(self) -> dict[str, range | list[int]]:
        """``train``/``test`` over all levels, and ``<family>``/``<family>_test`` per level family."""
        result: dict[str, range | list[int]] = {
            "train": self._task_ids(range(len(LEVELS)), test=False),
            "test": self._task_ids(range(len(LEVELS)), test=True),
        }
        for family in FAMILIES:
            indices = [index for index, (_, level_family) in enumerate(LEVELS) if level_family == family]
            result[family] = self._task_ids(indices, test=False)
            result[f"{family}_test"] = self._task_ids(indices, test=True)
        return result

    def _task_ids(self, level_indices: Any, test: bool) -> list[int]:
        offsets = (range(self.train_seeds_per_level, self.seeds_per_level) if test
                   else range(self.train_seeds_per_level))
        return [index * self.seeds_per_level + offset for index in level_indices for offset in offsets]


AGENTGYM_SEEDS = 1000
"""Seeds offered per level under the agentgym dialect (AgentGym's own range is unbounded)."""
AGENTGYM_TEST_SEEDS = 10
"""Seeds 0-9 of every level (task ids 0-399) form the agentgym ``test`` split."""


def agentgym_splits() -> dict[str, range | list[int]]:
    """``train``/``test`` and ``<family>``/``<family>_test`` over AgentGym's interleaved task ids."""
    test = range(AGENTGYM_TEST_SEEDS * len(LEVELS))
    train = range(test.stop, AGENTGYM_SEEDS * len(LEVELS))
    result: dict[str, range | list[int]] = {"train": train, "test": test}
    for family in FAMILIES:
        result[family] = [n for n in train if LEVELS[n % len(LEVELS)][1] == family]
        result[f"{family}_test"] = [n for n in test if LEVELS[n % len(LEVELS)][1] == family]
    return result


@contextlib.contextmanager
def quiet_minigrid():
    """Swallow what minigrid prints ("Sampling rejected: ...") while generating a level.

    Wraps only short synchronous calls (a level reset takes milliseconds), so no coroutine can
    print in the window; logging handlers keep the streams they were built with and are unaffected.
    """
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


def make_level(level_id: str) -> Any:
    """A fresh (unwrapped) minigrid env of a BabyAI level; minigrid is imported on first use."""
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    with quiet_minigrid():
        import gymnasium
        import minigrid  # noqa: F401  (registers the BabyAI-* ids with gymnasium)

        return gymnasium.make(level_id).unwrapped
