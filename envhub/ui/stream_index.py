"""An in-memory index of one run's recorded streams, read incrementally.

``trajectories/trajectories.msgpack`` (actor -> head ``Trajectory`` frames, as received) and
``trajectories/trained.msgpack`` (``TrainedSample`` records, ``learner/trained_log.py``) only ever
grow while a run is live, so each refresh reads just the records appended since the last one and
keeps, per trajectory, a small summary row and the byte offset of its frame; the full message is
read back by offset when a trajectory is opened. A file that shrank (a resumed run cut a torn
record) is re-read from the start. A record that does not decode is skipped and counted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import protocol
from common.protocol import TrainedSample, Trajectory
from common.recording import records_from

TRAJECTORIES_FILE = "trajectories.msgpack"
TRAINED_FILE = "trained.msgpack"  # learner/trained_log.py writes it (not imported: it pulls in torch)


@dataclass(frozen=True, slots=True)
class TrajectoryRow:
    """What the trajectory list shows of one recorded episode (and how to find its frame)."""

    number: int
    offset_bytes: int
    lease_id: str
    group_id: str
    episode_index: int
    env_id: str
    task_id: str
    actor_id: int
    purpose: str
    reward: float
    success: bool
    status: str
    finish_reason: str
    num_turns: int
    turn_cap: int
    num_tokens: int
    num_action_tokens: int
    version_min: int
    version_max: int

    @property
    def key(self) -> tuple[str, int]:
        """What names the episode in ``trained.msgpack``: (lease id, episode index)."""
        return self.lease_id, self.episode_index


@dataclass(frozen=True, slots=True)
class TrainedRow:
    """The update that used an episode; the per-token advantages stay on disk until opened."""

    learner_step: int
    advantage: float
    offset_bytes: int


def read_frame_at(path: Path, offset_bytes: int) -> Any:
    """The decoded message of the record at ``offset_bytes``."""
    for _, _, frame in records_from(path, offset_bytes):
        return protocol.decode(frame)
    raise protocol.ProtocolError(f"{path}: no complete record at byte {offset_bytes}")


def summarize(number: int, offset_bytes: int, episode: Trajectory) -> TrajectoryRow:
    sampled = episode.token_versions[episode.loss_mask.astype(bool)]
    return TrajectoryRow(
        number=number, offset_bytes=offset_bytes, lease_id=episode.lease_id, group_id=episode.group_id,
        episode_index=episode.episode_index, env_id=episode.env_id, task_id=episode.task_id,
        actor_id=episode.actor_id, purpose=episode.purpose, reward=episode.reward, success=episode.success,
        status=episode.status, finish_reason=episode.finish_reason, num_turns=episode.num_turns,
        turn_cap=episode.turn_cap, num_tokens=int(len(episode.token_ids)), num_action_tokens=int(sampled.size),
        version_min=int(sampled.min()) if sampled.size else -1,
        version_max=int(sampled.max()) if sampled.size else -1,
    )


class RunIndex:
    """Summary rows of one run's trajectories and what the learner trained on; thread-safe."""

    def __init__(self, run_dir: Path):
        self.trajectories_path = run_dir / "trajectories" / TRAJECTORIES_FILE
        self.trained_path = run_dir / "trajectories" / TRAINED_FILE
        self.rows: list[TrajectoryRow] = []
        self.trained: dict[tuple[str, int], TrainedRow] = {}
        self.bad_records = 0
        self._read_bytes = {self.trajectories_path: 0, self.trained_path: 0}
        self._lock = threading.Lock()

    def refresh(self) -> None:
        """Read whatever was appended to either stream since the last refresh."""
        with self._lock:
            self._read_new(self.trajectories_path, self._add_trajectory, self.rows.clear)
            self._read_new(self.trained_path, self._add_trained, self.trained.clear)

    def _read_new(self, path: Path, add: Callable[[int, Any], None], forget: Callable[[], None]) -> None:
        size = path.stat().st_size if path.exists() else 0
        if size < self._read_bytes[path]:  # cut or replaced: start over
            forget()
            self._read_bytes[path] = 0
        if size == self._read_bytes[path]:
            return
        for offset, end, frame in records_from(path, self._read_bytes[path]):
            try:
                add(offset, protocol.decode(frame))
            except protocol.ProtocolError:
                self.bad_records += 1
            self._read_bytes[path] = end

    def _add_trajectory(self, offset: int, message: Any) -> None:
        if isinstance(message, Trajectory):
            self.rows.append(summarize(len(self.rows), offset, message))

    def _add_trained(self, offset: int, message: Any) -> None:
        if isinstance(message, TrainedSample):
            trained = TrainedRow(message.learner_step, message.advantage, offset)
            self.trained[(message.lease_id, message.episode_index)] = trained

    def snapshot(self) -> tuple[list[TrajectoryRow], dict[tuple[str, int], TrainedRow]]:
        """Copies of the rows and the trained map, safe to iterate while another request refreshes."""
        with self._lock:
            return list(self.rows), dict(self.trained)

    def trained_row(self, row: TrajectoryRow) -> TrainedRow | None:
        return self.trained.get(row.key)

    def load(self, row: TrajectoryRow) -> tuple[Trajectory, TrainedSample | None]:
        """The full recorded episode of ``row`` and, if it was trained on, its ``TrainedSample``."""
        episode = read_frame_at(self.trajectories_path, row.offset_bytes)
        trained = self.trained_row(row)
        sample = read_frame_at(self.trained_path, trained.offset_bytes) if trained is not None else None
        return episode, sample
