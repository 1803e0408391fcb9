"""The run folder's checkpoint layout, shared by the learner (writes it) and the launcher (reads it).

``<run>/checkpoints/step_<N>/`` holds one checkpoint (``learner/checkpoint.py`` says what is in it);
its ``COMPLETE`` marker is written last, so a folder without it is an interrupted save and is ignored.
"""

from __future__ import annotations

from pathlib import Path

COMPLETE_MARKER = "COMPLETE"


def checkpoint_folder(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of learner step ``step`` lives."""
    return Path(run_dir) / "checkpoints" / f"step_{step}"


def mark_complete(folder: Path, step: int) -> None:
    """The last write of a save: from now on ``latest_complete`` may return ``folder``."""
    (folder / COMPLETE_MARKER).write_text(f"step {step}\n")


def complete_steps(run_dir: Path) -> list[int]:
    """Steps of the run's complete checkpoints, ascending."""
    steps = []
    for folder in (Path(run_dir) / "checkpoints").glob("step_*"):
        number = folder.name.removeprefix("step_")
        if number.isdigit() and (folder / COMPLETE_MARKER).exists():
            steps.append(int(number))
    return sorted(steps)


def latest_complete(run_dir: Path) -> Path | None:
    """The newest ``step_<N>`` folder that has its ``COMPLETE`` marker."""
    steps = complete_steps(run_dir)
    return checkpoint_folder(run_dir, steps[-1]) if steps else None
