"""The recorded trajectory stream: ``<run>/trajectories/*.msgpack``, replayable into the learner.

Each record is one wire frame exactly as received, prefixed by its length (uint32, little
endian), so a run killed in the middle of a write leaves at most one torn record at the end:
readers stop before it and a resumed run cuts it off before appending.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import protocol

log = logging.getLogger(__name__)
_LENGTH = struct.Struct("<I")


class Recorder:
    """Appends frames to one stream file; every record is flushed to the OS as it is written."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(path)
        self._file = open(path, "ab")

    def write(self, frame: bytes) -> None:
        self._file.write(_LENGTH.pack(len(frame)) + frame)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def records_from(path: Path, offset_bytes: int = 0) -> Iterator[tuple[int, int, bytes]]:
    """``(record offset, end offset, frame)`` of every complete record at or after ``offset_bytes``:
    the one reader of the framing (replay, the torn-tail cut and the viewer's index all use it). It
    stops before an incomplete record: torn, or still being written by a live run."""
    with open(path, "rb") as f:
        f.seek(offset_bytes)
        while len(header := f.read(_LENGTH.size)) == _LENGTH.size:
            (length,) = _LENGTH.unpack(header)
            frame = f.read(length)
            if len(frame) < length:
                return
            yield offset_bytes, offset_bytes + _LENGTH.size + length, frame
            offset_bytes += _LENGTH.size + length


def read_frames(path: Path) -> Iterator[bytes]:
    """Every complete frame of a stream file, in order."""
    end = 0
    for _, end, frame in records_from(path):
        yield frame
    if end < path.stat().st_size:
        log.warning("%s: torn last record ignored", path)


def read_messages(path: Path) -> Iterator[Any]:
    """Decoded protocol messages of a stream file (a malformed record raises ProtocolError)."""
    for frame in read_frames(path):
        yield protocol.decode(frame)


def _cut_torn_tail(path: Path) -> None:
    if not path.exists():
        return
    complete = max((end for _, end, _ in records_from(path)), default=0)
    if complete < path.stat().st_size:
        log.warning("%s: cutting a torn last record (%d bytes)", path, path.stat().st_size - complete)
        with open(path, "r+b") as f:
            f.truncate(complete)
