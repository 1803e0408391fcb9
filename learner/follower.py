"""Learner ranks 1..N-1: hold a shard of the policy and follow rank 0's commands.

1. Join the learner's process group and shard the policy with FSDP2 like rank 0.
2. Loop: receive a command from rank 0;
   train -> receive the batch, train on this rank's rows, join the weight gather;
   gather -> join the weight gather of a resend; checkpoint -> join the sharded save; stop -> return.

Started by the launcher when ``--learner-gpus`` is above 1.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from common.config import Config
from common.models import resolve_model
from common.run_folder import latest_complete
from learner.distributed import Command, broadcast_batch, broadcast_command
from learner.model import init_process_group, use_deterministic_algorithms
from learner.policy import ShardedPolicy

log = logging.getLogger("learner")


class Follower:
    def __init__(self, cfg: Config, run_dir: str, rank: int, master: tuple[str, int]):
        self.cfg, self.run_dir, self.rank, self.master = cfg, Path(run_dir), rank, master

    def setup(self) -> dict:
        """Collective with rank 0's ``setup``: the group forms when every rank has joined."""
        torch.manual_seed(self.cfg.run.seed)
        torch.set_num_threads(self.cfg.learner.torch_threads)
        use_deterministic_algorithms(self.cfg.run.deterministic)
        init_process_group(self.rank, self.cfg.learner.num_ranks, *self.master)
        self.policy = ShardedPolicy(self.cfg, str(resolve_model(self.cfg.model.name, self.cfg.model.cache_dir)))
        if self.cfg.run.resume:
            self.policy.load(latest_complete(self.run_dir))
        return {"rank": self.rank}

    def run(self) -> dict:
        steps = 0
        while True:
            command, step = broadcast_command()
            if command is Command.TRAIN:
                self.policy.train(broadcast_batch(None))
                if not self.cfg.run.replay:
                    self.policy.weights_for_actors().drain()  # rank 0 gathers the weights for the actors
                steps += 1
            elif command is Command.GATHER:
                self.policy.weights_for_actors().drain()  # rank 0 resends the weights to actors that missed them
            elif command is Command.CHECKPOINT:
                self.policy.save(self.run_dir, step, loop_state={})
            else:
                log.info("rank %d: stop after %d steps", self.rank, steps)
                return {"rank": self.rank, "steps": steps, "stopped_by": "head"}

    def request_stop(self) -> None:
        pass  # rank 0 decides when to stop and tells every follower
