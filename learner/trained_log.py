"""What the learner trained on: ``<run>/trajectories/trained.msgpack``, one ``TrainedSample`` per row.

The trajectory stream says what the actors produced; this record says which of those episodes
an update used, at which learner step and with which advantage (neither is in a ``Trajectory``).
The envhub trajectory viewer (``envhub/ui``) joins the two by ``(lease_id, episode_index)``;
episodes missing here (dropped as stale, failed, eval) show as "not trained". Same length-prefixed
framing as the trajectory stream (``common/recording.py``), so a killed run leaves at most one
torn record, cut off when a resumed run appends.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from common import protocol
from common.protocol import TrainedSample
from common.recording import Recorder
from learner.batching import Batch

TRAINED_FILE = "trained.msgpack"


def trained_samples(batch: Batch, advantages: torch.Tensor, learner_step: int) -> list[TrainedSample]:
    """One record per row of ``batch``; ``advantages`` is the update's ``[B, T]`` token advantages.
    Every action token of the episode gets a value, in order: a token too stale to train on (off
    the batch's loss mask, ``learner/batching.py``) shows 0, as it moved nothing."""
    samples = []
    for row, episode in enumerate(batch.episodes):
        on_actions = torch.from_numpy(episode.loss_mask.astype(bool))
        token_advantages = advantages[row][: len(on_actions)][on_actions.to(advantages.device)]
        token_advantages = token_advantages.detach().to(torch.float32).cpu().numpy()
        mean = float(token_advantages.mean()) if token_advantages.size else 0.0
        samples.append(TrainedSample(
            lease_id=episode.lease_id, group_id=episode.group_id, episode_index=episode.episode_index,
            learner_step=learner_step, advantage=mean, token_advantages=np.ascontiguousarray(token_advantages)))
    return samples


class TrainedLog:
    """Appends the ``TrainedSample`` records of each update to ``<record_dir>/trained.msgpack``."""

    def __init__(self, record_dir: Path):
        self._recorder = Recorder(Path(record_dir) / TRAINED_FILE)

    def record(self, batch: Batch, advantages: torch.Tensor | None, learner_step: int) -> None:
        if advantages is None:  # no update computed advantages (cannot happen after Trainer.step)
            return
        for sample in trained_samples(batch, advantages, learner_step):
            self._recorder.write(protocol.encode(sample))

    def close(self) -> None:
        self._recorder.close()
