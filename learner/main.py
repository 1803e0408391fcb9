"""The learner loop (rank 0 is the head).

1. Load the policy, shard it with FSDP2 (``fully_shard``), create AdamW.
2. Start the head (``learner/head.py``): lease service and trajectory ingest over ZeroMQ.
3. Wait until every actor has joined the weight-broadcast group.
4. Until ``run.max_steps``:
   a. take ``groups_per_step`` completed GRPO groups; drop (and count) any group whose oldest
      token is more than ``max_policy_lag`` versions old;
   b. GRPO advantages, PPO-clip loss against the behavior logprobs with a truncated importance
      weight, masked to assistant tokens; AdamW step;
   c. version v becomes v+1; the horizon schedule gives the turn cap for the next leases;
   d. announce v+1 on PUB and broadcast the weights in fixed-size buckets;
   e. tensorboard scalars; a checkpoint when due.
5. Final checkpoint, ``Control(stop)`` to the actors, summary.

Run it through the launcher: ``python launch.py --config configs/smoke.yaml``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

import torch
import yaml
import zmq

from common import protocol
from common.config import Config, to_dict
from common.metrics import MetricsWriter
from common.models import resolve_model
from common.net import free_port
from common.transport import bind_random, configure
from common.weight_sync import WeightBroadcaster
from envhub.registry import task_ids
from learner.batching import collate, split_stale
from learner.checkpoint import save_checkpoint
from learner.head import Group, HeadServer
from learner.horizon import StepwiseHorizon
from learner.model import full_parameters, init_process_group, load_sharded_model
from learner.rollout_metrics import rollout_scalars
from learner.sampler import TaskSampler
from learner.service_metrics import actor_scalars, envhub_scalars
from learner.train_step import train_step

log = logging.getLogger("learner")


class Learner:
    """One learner process; the launcher calls ``setup``, then ``run``; ``progress`` any time."""

    def __init__(self, cfg: Config, run_dir: str, envhub_url: str | None = None, host: str = "127.0.0.1"):
        self.cfg, self.run_dir, self.envhub_url, self.host = cfg, Path(run_dir), envhub_url, host
        self.step, self.version = 0, 0
        self._progress: dict = {"step": 0}
        self._dropped_stale = 0
        self._stop = threading.Event()

    def setup(self) -> dict[str, str]:
        """Bind every socket and the broadcast store; returns the addresses actors connect to."""
        cfg = self.cfg
        torch.manual_seed(cfg.run.seed)
        torch.set_num_threads(cfg.learner.torch_threads)
        init_process_group(0, 1, self.host, free_port(self.host))
        self.model_path = str(resolve_model(cfg.model.name, cfg.model.cache_dir))
        self.model = load_sharded_model(self.model_path, cfg.model.dtype)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.learner.lr,
                                           weight_decay=cfg.learner.weight_decay)
        self.horizon = StepwiseHorizon.from_config(cfg.learner.horizon)
        self.head = HeadServer(self._make_sampler(), self.host, record_dir=self.run_dir / "trajectories")
        self.head.set_policy(self.version, self.horizon.cap_at(0))
        self.pub = configure(zmq.Context.instance().socket(zmq.PUB))
        control_address = bind_random(self.pub, self.host)
        self.broadcaster = WeightBroadcaster(self.host, cfg.actors.count, int(cfg.learner.bucket_mb * 2**20),
                                             cfg.learner.broadcast_timeout_s)
        self.metrics = MetricsWriter(self.run_dir / "tb", cfg.learner.tb_flush_s)
        self.metrics.text("config", "```yaml\n" + yaml.safe_dump(to_dict(cfg), sort_keys=False) + "\n```")
        self.head.start()
        return {"lease": self.head.lease_address, "trajectories": self.head.trajectory_address,
                "control": control_address, "weights": self.broadcaster.address, "model_path": self.model_path}

    def _make_sampler(self) -> TaskSampler:
        r, lc = self.cfg.rollout, self.cfg.learner
        options = self.cfg.envhub.env_options
        env_tasks = {env_id: task_ids(env_id, r.split, **options.get(env_id, {})) for env_id in r.envs}
        return TaskSampler(env_tasks, r.group_size, lc.groups_per_step, lc.max_policy_lag,
                           lc.lease_timeout_s, r.max_episode_tokens, self.cfg.run.seed)

    def run(self) -> dict:
        log.info("waiting for %d actor(s) to join the weight broadcast", self.cfg.actors.count)
        self.broadcaster.connect()
        log.info("all actors joined; training for %d steps", self.cfg.run.max_steps)
        started = time.time()
        while self.step < self.cfg.run.max_steps and not self._stop.is_set():
            groups, wait_s = self._collect_groups()
            if groups is None:
                break
            self._train_on(groups, wait_s)
        self._finish()
        return {**self._progress, "wall_s": time.time() - started, "ledger": self.head.ledger()}

    def _collect_groups(self) -> tuple[list[Group] | None, float]:
        started, groups = time.monotonic(), []
        while len(groups) < self.cfg.learner.groups_per_step:
            if self._stop.is_set():
                return None, 0.0
            try:
                groups.append(self.head.groups.get(timeout=0.5))
            except queue.Empty:
                continue
            fresh, stale = split_stale(groups, self.version, self.cfg.learner.max_policy_lag)
            for group in stale:
                self.head.release(group)
            self._dropped_stale += len(stale)
            groups = fresh
        return groups, time.monotonic() - started

    def _train_on(self, groups: list[Group], wait_s: float) -> None:
        t0 = time.monotonic()
        episodes = [e for g in groups for e in g.episodes]
        scalars = rollout_scalars(episodes, self.version)
        batch = collate(groups)
        if batch is not None:
            scalars.update(train_step(self.model, self.optimizer, batch, self.cfg.learner, self.cfg.rollout.temperature))
        self.head.consume(len(groups))
        self.step += 1
        self.version += 1
        t1 = time.monotonic()
        turn_cap = self.horizon.cap_at(self.step)
        self.head.set_policy(self.version, turn_cap)
        self._broadcast_weights()
        t2 = time.monotonic()
        scalars.update(self._loop_scalars(episodes, wait_s, t1 - t0, t2 - t1, turn_cap))
        scalars.update(envhub_scalars(self.envhub_url))
        scalars.update(actor_scalars(dict(self.head.actor_stats)))
        self.metrics.scalars(scalars, self.step)
        self._update_progress(scalars, turn_cap)
        every = self.cfg.learner.checkpoint_every
        if every and self.step % every == 0 and self.step < self.cfg.run.max_steps:
            self._checkpoint()

    def _broadcast_weights(self) -> None:
        tensors = full_parameters(self.model)
        announce = self.broadcaster.plan(tensors, self.version)
        self.pub.send(protocol.encode(announce))
        self.broadcaster.send(announce, tensors)

    def _loop_scalars(self, episodes, wait_s: float, train_s: float, broadcast_s: float, turn_cap: int) -> dict:
        step_s = wait_s + train_s + broadcast_s
        ledger = self.head.ledger()
        return {
            "time/step_s": step_s, "time/wait_s": wait_s, "time/train_s": train_s, "time/broadcast_s": broadcast_s,
            "perf/samples_per_s": len(episodes) / max(step_s, 1e-9),
            "perf/tokens_per_s": sum(len(e.token_ids) for e in episodes) / max(step_s, 1e-9),
            "horizon/turn_cap": turn_cap, "horizon/stage": self.horizon.stage_at(self.step),
            "async/queue_groups": self.head.groups.qsize(),
            "async/leases_outstanding": ledger.get("outstanding", 0),
            "async/groups_dropped_stale": self._dropped_stale,
            "async/episodes_discarded_late": ledger.get("episodes_discarded_late", 0),
            "async/rejected_messages": ledger.get("rejected_messages", 0),
        }

    def _update_progress(self, scalars: dict, turn_cap: int) -> None:
        self._progress = {
            "step": self.step, "max_steps": self.cfg.run.max_steps, "version": self.version,
            "reward": scalars.get("rollout/reward", 0.0), "success": scalars.get("rollout/success", 0.0),
            "turn_cap": turn_cap, "samples_per_s": scalars["perf/samples_per_s"],
            "policy_lag": scalars.get("async/policy_lag_mean", 0.0),
            "actor_versions": {k: s.weight_version for k, s in self.head.actor_stats.items()},
        }

    def _checkpoint(self) -> Path:
        loop_state = {"step": self.step, "version": self.version, "sampler": self.head.sampler.state_dict(),
                      "horizon": {"stage": self.horizon.stage_at(self.step), "turn_cap": self.horizon.cap_at(self.step)}}
        return save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, loop_state, self.model_path)

    def _finish(self) -> None:
        self.pub.send(protocol.encode(protocol.Control(command="stop")))
        if self.step > 0:
            self._progress["checkpoint"] = str(self._checkpoint())
        self.metrics.close()
        self.head.stop()
        self.pub.close()

    def progress(self) -> dict:
        return dict(self._progress)

    def request_stop(self) -> None:
        self._stop.set()
