"""ScienceWorld's tasks and variations as numbered lists, one per dialect (pure data, no JVM).

A task number names one (task, variation) pair: ``offset(task) + variation``, the tasks taken in
an order fixed by the dialect and each task's variations in order.

- ``agentgym``: AgentGym's ``data_idx`` (agentenv-sciworld/agentenv_sciworld/environment.py,
  ``SciWorldEnv.__init__``): ScienceWorld's task-id order (its ``tasks.json``: 1-1 boil, 1-2 melt,
  ...) less seven tasks AgentGym leaves out (5-1/5-2 growing plants and fruit, 9-1..9-3 the inclined
  planes, 10-1/10-2 Mendelian genetics): 23 tasks, 4,639 variations. 0 is ``boil`` variation 0,
  4638 the last ``identify-life-stages-2`` variation.
- ``lenient``: all 30 tasks in sorted name order, 7,207 variations.

Splits are ScienceWorld's own (``get_variations_train/dev/test``: each task's variations cut into
three contiguous blocks), plus ``all``. AgentGym's own item lists (2,120 train / 200 test ids,
published as data sets, not in its source) are not reproduced.

The table below is scienceworld 1.2.3's, so the registry knows the tasks without starting a
JVM; `jvm_pool` checks it against the simulator when the first JVM starts, and
tests/test_env_sciworld.py checks the split boundaries and the AgentGym order too.
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

# ScienceWorld's task ids (scienceworld/tasks.json, in file order) of the tasks AgentGym serves.
AGENTGYM_TASKS: tuple[tuple[str, str], ...] = (
    ("1-1", "boil"), ("1-2", "melt"), ("1-3", "freeze"), ("1-4", "change-the-state-of-matter-of"),
    ("2-1", "use-thermometer"), ("2-2", "measure-melting-point-known-substance"),
    ("2-3", "measure-melting-point-unknown-substance"), ("3-1", "power-component"),
    ("3-2", "power-component-renewable-vs-nonrenewable-energy"), ("3-3", "test-conductivity"),
    ("3-4", "test-conductivity-of-unknown-substances"), ("4-1", "find-living-thing"),
    ("4-2", "find-non-living-thing"), ("4-3", "find-plant"), ("4-4", "find-animal"),
    ("6-1", "chemistry-mix"), ("6-2", "chemistry-mix-paint-secondary-color"),
    ("6-3", "chemistry-mix-paint-tertiary-color"), ("7-1", "lifespan-longest-lived"),
    ("7-2", "lifespan-shortest-lived"), ("7-3", "lifespan-longest-lived-then-shortest-lived"),
    ("8-1", "identify-life-stages-1"), ("8-2", "identify-life-stages-2"),
)
AGENTGYM_EXCLUDED_IDS = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})
"""The task ids AgentGym's server skips (``exceptions`` in its ``SciWorldEnv.__init__``)."""

DIALECTS = ("agentgym", "lenient")


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


def _split_of(variation: int, train: int, dev: int) -> str:
    return "train" if variation < train else "dev" if variation < train + dev else "test"


class TaskIndex:
    """Task numbers over ``TASK_TABLE``'s rows taken in a given order of task names."""

    def __init__(self, task_names: tuple[str, ...]) -> None:
        rows = {row[0]: row for row in TASK_TABLE}
        unknown = [name for name in task_names if name not in rows]
        if unknown:
            raise ValueError(f"sciworld: unknown task(s) {unknown}")
        self.rows = tuple(rows[name] for name in task_names)
        self.offsets = tuple(itertools.accumulate((row[1] for row in self.rows), initial=0))
        """Task number of each task's variation 0, plus the total at the end."""

    def num_tasks(self) -> int:
        """How many (task, variation) pairs there are."""
        return self.offsets[-1]

    def lookup(self, number: int) -> SciWorldTask:
        """The (task, variation) behind task number ``number``; ValueError outside the list."""
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < self.num_tasks():
            raise ValueError(f"sciworld: task number must be an int in [0, {self.num_tasks()}), got {number!r}")
        row = bisect.bisect_right(self.offsets, number) - 1
        name, _, train, dev = self.rows[row]
        variation = number - self.offsets[row]
        return SciWorldTask(number, name, variation, _split_of(variation, train, dev))

    @functools.cached_property
    def splits(self) -> dict[str, range | tuple[int, ...]]:
        """Task numbers per split: ScienceWorld's train/dev/test (interleaved across tasks) and ``all``.
        Tuples, not lists: the result is cached and shared."""
        numbers: dict[str, list[int]] = {name: [] for name in SPLIT_NAMES}
        for offset, (_, variations, train, dev) in zip(self.offsets, self.rows):
            for variation in range(variations):
                numbers[_split_of(variation, train, dev)].append(offset + variation)
        return {**{name: tuple(found) for name, found in numbers.items()}, "all": range(self.num_tasks())}

    def task_number(self, name: str, variation: int) -> int:
        """Inverse of `lookup`: the task number of (name, variation)."""
        for offset, (row_name, variations, _, _) in zip(self.offsets, self.rows):
            if row_name == name:
                if not 0 <= variation < variations:
                    raise ValueError(f"sciworld: {name} has variations 0..{variations - 1}, got {variation}")
                return offset + variation
        raise ValueError(f"sciworld: task {name!r} is not in this dialect's task list")


AGENTGYM_INDEX = TaskIndex(tuple(name for _, name in AGENTGYM_TASKS))
LENIENT_INDEX = TaskIndex(tuple(sorted(row[0] for row in TASK_TABLE)))


def index_for(dialect: str) -> TaskIndex:
    """The task numbering of ``dialect`` (``agentgym`` or ``lenient``)."""
    if dialect not in DIALECTS:
        raise ValueError(f"sciworld: option dialect must be one of {', '.join(DIALECTS)}, got {dialect!r}")
    return AGENTGYM_INDEX if dialect == "agentgym" else LENIENT_INDEX
