"""Replay: feed the learner a recorded trajectory stream instead of live actors.

``python launch.py --replay <run>/trajectories ...`` trains on the groups of a recorded run in
the order they completed there, with no actors and no envhub, to debug the learner alone and to
make learner runs reproducible (the resume tests rely on it). A group is complete when all of its
``group_size`` episodes are in the stream; incomplete ones (a run killed mid-group) are skipped,
and so are validation episodes (``purpose == "eval"``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from common.protocol import ProtocolError, TaskLease, Trajectory
from common.recording import read_messages
from learner.group import Group


def recorded_groups(path: Path) -> Iterator[Group]:
    """Complete groups of every ``*.msgpack`` stream under ``path`` (a file or a folder), in order."""
    files = sorted(path.glob("*.msgpack")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"no recorded trajectory stream (*.msgpack) under {path}")
    open_groups: dict[str, list[Trajectory]] = {}
    for file in files:
        for message in _messages_of(file):
            if not isinstance(message, Trajectory) or message.purpose == "eval":
                continue  # validation episodes are recorded but never trained on
            episodes = open_groups.setdefault(message.lease_id, [])
            episodes.append(message)
            if len(episodes) == message.group_size:
                yield Group(lease=_lease_of(message), episodes=open_groups.pop(message.lease_id))


def _messages_of(file: Path) -> Iterator:
    """A recording is the user's own file: a record that does not decode (another schema version, a
    corrupted byte) stops the replay, naming the file and the record."""
    index = -1
    try:
        for index, message in enumerate(read_messages(file)):
            yield message
    except ProtocolError as exc:
        raise ProtocolError(f"{file}, record {index + 1}: {exc}", exc.reason) from None


def _lease_of(episode: Trajectory) -> TaskLease:
    return TaskLease(lease_id=episode.lease_id, group_id=episode.group_id, env_id=episode.env_id,
                     task_id=episode.task_id, seed=0, group_size=episode.group_size, turn_cap=episode.turn_cap,
                     max_episode_tokens=0, policy_version=0, deadline_unix_s=0.0)


class ReplaySource:
    """The learner's data source in replay mode (``learner/data_source.py``): no leases, no actors,
    and the recorded tokens train as they are."""

    max_policy_lag = None

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._groups = recorded_groups(self.path)
        self.cursor = 0
        self.counters: Counter[str] = Counter()

    def get(self, timeout_s: float) -> Group | None:
        """The next recorded group; ``None`` when the stream is exhausted."""
        group = next(self._groups, None)
        if group is not None:
            self.cursor += 1
        return group

    @property
    def exhausted_is_final(self) -> bool:
        return True

    def release(self, group: Group) -> None:
        self.counters["released"] += 1

    def consume(self, n_groups: int) -> None:
        self.counters["consumed"] += n_groups

    def check_alive(self) -> None:
        pass  # a recording cannot die; its end is ``get`` returning None

    def set_policy(self, version: int, turn_cap: int) -> None:
        pass  # nothing samples tasks in replay

    def expect_version(self, version: int) -> None:
        pass  # no episode is made under the learner's weights

    def join_requests(self) -> dict[int, int]:
        return {}

    def scalars(self) -> dict[str, float]:
        return {}

    def ledger(self) -> dict[str, int]:
        return {"replayed_groups": self.cursor, **self.counters}

    def state_dict(self) -> dict:
        return {"replay_cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        """Skip the groups a resumed run already trained on."""
        for _ in range(state.get("replay_cursor", 0)):
            if self.get(0.0) is None:
                break

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
