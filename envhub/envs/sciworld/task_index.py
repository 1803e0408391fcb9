"""ScienceWorld's tasks and variations as one deterministic list of task numbers.

Tasks are taken in sorted name order and each task's variations in order, so task number
``offset(task) + variation`` names one (task, variation) pair: 0 is ``boil`` variation 0,
7206 is the last ``use-thermometer`` variation. Splits are ScienceWorld's own
(``get_variations_train/dev/test``: each task's variations cut into three contiguous blocks),
plus ``all``.

The table below is scienceworld 1.2.3's, so the registry knows the tasks without starting a
JVM; `jvm_pool` checks it against the simulator when the first JVM starts, and
tests/test_env_sciworld.py checks the split boundaries too.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from dataclasses import dataclass

# (task name, variations, train variations, dev variations); test takes the rest.
TASK_TABLE: tuple[tuple[str, int, int, int], ...] = (
    ("boil", 30, 14, 7),
    ("change-the-state-of-matter-of", 30, 14, 7),
    ("chemistry-mix", 32, 16, 8),
    ("chemistry-mix-paint-secondary-color", 36, 18, 9),
    ("chemistry-mix-paint-tertiary-color", 36, 18, 9),
    ("find-animal", 300, 150, 75),
    ("find-living-thing", 300, 150, 75),
    ("find-non-living-thing", 300, 150, 75),
    ("find-plant", 300, 150, 75),
    ("freeze", 30, 14, 7),
    ("grow-fruit", 126, 62, 31),
    ("grow-plant", 126, 62, 31),
    ("identify-life-stages-1", 14, 6, 3),
    ("identify-life-stages-2", 10, 4, 2),
    ("inclined-plane-determine-angle", 168, 84, 42),
    ("inclined-plane-friction-named-surfaces", 1386, 692, 346),
    ("inclined-plane-friction-unnamed-surfaces", 162, 80, 40),
    ("lifespan-longest-lived", 125, 62, 31),
    ("lifespan-longest-lived-then-shortest-lived", 125, 62, 31),
    ("lifespan-shortest-lived", 125, 62, 31),
    ("measure-melting-point-known-substance", 436, 218, 109),
    ("measure-melting-point-unknown-substance", 300, 150, 75),
    ("melt", 30, 14, 7),
    ("mendelian-genetics-known-plant", 120, 60, 30),
    ("mendelian-genetics-unknown-plant", 480, 240, 120),
    ("power-component", 20, 10, 5),
    ("power-component-renewable-vs-nonrenewable-energy", 20, 10, 5),
    ("test-conductivity", 900, 450, 225),
    ("test-conductivity-of-unknown-substances", 600, 300, 150),
    ("use-thermometer", 540, 270, 135),
)
SPLIT_NAMES = ("train", "dev", "test")


@dataclass(frozen=True)
class SciWorldTask:
    """One task number resolved to what the simulator loads."""

    number: int
    """Position in the enumeration (the envhub task id, as an int)."""

    name: str
    """ScienceWorld task name, e.g. ``find-living-thing``."""

    variation: int
    """Variation index within the task (``load(name, variation, ...)``)."""

    split: str
    """``train``, ``dev`` or ``test``: ScienceWorld's split of this variation."""


@functools.cache
def _offsets() -> tuple[int, ...]:
    """Task number of each task's variation 0, plus the total at the end."""
    return tuple(itertools.accumulate((row[1] for row in TASK_TABLE), initial=0))


def num_tasks() -> int:
    """How many (task, variation) pairs there are."""
    return _offsets()[-1]


def _split_of(variation: int, train: int, dev: int) -> str:
    return "train" if variation < train else "dev" if variation < train + dev else "test"


def lookup(number: int) -> SciWorldTask:
    """The (task, variation) behind task number ``number``; ValueError outside the list."""
    if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < num_tasks():
        raise ValueError(f"sciworld: task number must be an int in [0, {num_tasks()}), got {number!r}")
    row = bisect.bisect_right(_offsets(), number) - 1
    name, _, train, dev = TASK_TABLE[row]
    variation = number - _offsets()[row]
    return SciWorldTask(number, name, variation, _split_of(variation, train, dev))


@functools.cache
def task_splits() -> dict[str, range | tuple[int, ...]]:
    """Task numbers per split: ScienceWorld's train/dev/test (interleaved across tasks) and ``all``.
    Tuples, not lists: the result is cached and shared."""
    numbers: dict[str, list[int]] = {name: [] for name in SPLIT_NAMES}
    for offset, (_, variations, train, dev) in zip(_offsets(), TASK_TABLE):
        for variation in range(variations):
            numbers[_split_of(variation, train, dev)].append(offset + variation)
    return {**{name: tuple(found) for name, found in numbers.items()}, "all": range(num_tasks())}


def task_number(name: str, variation: int) -> int:
    """Inverse of `lookup`: the task number of (name, variation)."""
    for offset, (row_name, variations, _, _) in zip(_offsets(), TASK_TABLE):
        if row_name == name:
            if not 0 <= variation < variations:
                raise ValueError(f"sciworld: {name} has variations 0..{variations - 1}, got {variation}")
            return offset + variation
    raise ValueError(f"sciworld: unknown task {name!r}")
