"""The learner loop on rank 0, the head (ranks 1..N-1 run ``learner/follower.py``).

1. Join the learner group, load the policy and shard it with FSDP2 (``fully_shard``); AdamW.
   With ``--resume``: model, optimizer, RNG, step, sampler and horizon from the latest checkpoint.
   Live runs first ask envhub for the task lists (``learner/task_lists.py``); the learner imports
   no env code.
2. Start the data source (``learner/data_source.py``): the head (``learner/head.py``: leases and
   trajectory ingest over ZeroMQ) or, with ``--replay``, a recorded trajectory stream
   (``learner/replay.py``).
3. Until ``run.max_steps`` (or ``run.max_wall_s`` seconds):
   a. take ``groups_per_step`` completed GRPO groups; sampled tokens more than ``max_policy_lag``
      versions old leave the loss mask (counted), a group with no fresh token left is dropped
      (counted; ``learner/group_collector.py``, ``learner/batching.py``);
   b. broadcast the batch to the followers; advantages, PPO-clip loss against the behavior
      logprobs with a truncated importance weight, masked to assistant tokens; AdamW step;
   c. version v becomes v+1 (every step trains: a group with no ok episode is released before it
      joins one); the horizon schedule gives the turn cap for the next leases;
   d. announce v+1 on PUB and broadcast the weights in fixed-size buckets to the weight group,
      re-formed first when actors asked to join (start, restart, a failed receive;
      ``learner/weight_publisher.py``);
      (``run.mode: sync`` admits the next batch's leases only now, with a lag bound of 0: the
      reference systems' loop, for comparison);
   e. validation (``learner.eval_every``): log the eval round that completed, start one when due
      (``learner/eval_scheduler.py``; never waits for eval episodes);
   f. tensorboard scalars (``learner/step_metrics.py``; envhub's are polled off this path,
      ``learner/service_metrics.py``); a checkpoint when due.
4. With ``learner.eval_at_end``, one more validation round on the final policy, waited for (and with
   ``eval_at_start`` one on the untrained policy before step 1).
5. Final checkpoint, ``Control(stop)`` to the actors and followers, summary.

Run it through the launcher: ``python launch.py --config configs/smoke.yaml``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import torch

from common.config import Config
from common.models import resolve_model
from common.net import free_port
from common.run_folder import latest_complete
from envhub.client import TaskList
from learner.batching import collate
from learner.data_source import DataSource
from learner.distributed import Command, broadcast_batch, broadcast_command
from learner.eval_scheduler import EvalScheduler
from learner.evaluation import EvalRounds, build_eval_rounds
from learner.group import Group
from learner.group_collector import GroupCollector
from learner.head import HeadServer
from learner.horizon import build_horizon
from learner.model import init_process_group, use_deterministic_algorithms
from learner.policy import ShardedPolicy
from learner.replay import ReplaySource
from learner.rollout_metrics import rollout_scalars
from learner.sampler import TaskSampler
from learner.service_metrics import EnvhubStats
from learner.step_metrics import StepMetrics, timing_scalars
from learner.task_lists import fetch_task_lists, task_ids_of
from learner.trained_log import TrainedLog
from learner.weight_publisher import ActorPublisher, NoActors, PolicyPublisher

log = logging.getLogger("learner")


class Learner:
    """Rank 0; the launcher calls ``setup``, then ``run``; ``progress`` at any time."""

    def __init__(self, cfg: Config, run_dir: str, envhub_urls: list[str] | None = None,
                 master: tuple[str, int] | None = None, host: str = "127.0.0.1"):
        self.cfg, self.run_dir, self.envhub_urls, self.host = cfg, Path(run_dir), list(envhub_urls or []), host
        self.master = master
        self.source: DataSource
        self.publisher: PolicyPublisher
        self.step, self.version = 0, 0
        self.metrics: StepMetrics | None = None  # made in setup
        self._stop = threading.Event()

    # ------------------------------------------------------------------ setup

    def setup(self) -> dict[str, str]:
        """Collective with the followers' ``setup``; returns the addresses actors connect to."""
        cfg = self.cfg
        torch.manual_seed(cfg.run.seed)
        torch.set_num_threads(cfg.learner.torch_threads)
        use_deterministic_algorithms(self.cfg.run.deterministic)
        task_lists, eval_rounds = (None, None) if cfg.run.replay else self._ask_envhub()  # before the model: fail fast
        init_process_group(0, cfg.learner.num_ranks, *(self.master or (self.host, free_port(self.host))))
        self.model_path = str(resolve_model(cfg.model.name, cfg.model.cache_dir))
        self.policy = ShardedPolicy(cfg, self.model_path)
        self.horizon = build_horizon(cfg.learner.horizon, cfg.run.max_steps)
        if task_lists is None:
            self.source, self.publisher = ReplaySource(cfg.run.replay), NoActors()
        else:
            head = self._make_head(task_lists)
            self.source, self.publisher = head, self._make_publisher(head)
        actor_model_path = self._maybe_resume()
        self.source.set_policy(self.version, self.horizon.cap_at(self.step))
        self.metrics = StepMetrics(cfg, self.run_dir, self.model_path)
        self.trained_log = TrainedLog(self.run_dir / "trajectories")  # which episodes each step used
        self.source.start()
        self.evals = EvalScheduler(eval_rounds, self.source, self.metrics.writer, cfg.learner, self._stop)
        self.evals.after_step(self.step)
        self.envhub_stats = EnvhubStats(self.envhub_urls)
        self.envhub_stats.start()
        self.collector = GroupCollector(self.source, cfg.learner.groups_per_step, self._stop,
                                        on_stale=lambda: self.publisher.resend_if_behind(self.version, self.step))
        if task_lists is None:
            return {"model_path": actor_model_path}
        return self._write_endpoints(self.source, self.publisher, actor_model_path)

    def _ask_envhub(self) -> tuple[dict[str, TaskList], EvalRounds | None]:
        """The training task lists and the validation rounds, from the run's first envhub server."""
        if not self.envhub_urls:
            raise ValueError("a live learner needs an envhub server to list its tasks; the launcher passes their URLs")
        url, envs = self.envhub_urls[0], self.cfg.rollout.envs
        train_split = self.cfg.rollout.split
        lists = fetch_task_lists(url, envs, train_split)

        def tasks_of_split(split: str) -> dict[str, list[str]]:  # eval on the training split: no second listing
            return task_ids_of(lists if split == train_split else fetch_task_lists(url, envs, split))

        return lists, build_eval_rounds(self.cfg, tasks_of_split)

    def _make_head(self, task_lists: dict[str, TaskList]) -> HeadServer:
        r, lc = self.cfg.rollout, self.cfg.learner
        # Sync mode is lag 0: a batch's groups are leased, generated and trained at one version.
        max_policy_lag = 0 if self.cfg.run.mode == "sync" else lc.max_policy_lag
        sampler = TaskSampler(task_ids_of(task_lists), r.group_size, lc.groups_per_step, max_policy_lag,
                              lc.lease_timeout_s, r.max_episode_tokens, self.cfg.run.seed,
                              max_group_reissues=lc.max_group_reissues,
                              env_max_turns={env_id: tasks.max_turns for env_id, tasks in task_lists.items()},
                              draw_training=self.cfg.run.max_steps > 0, eval_turn_cap=lc.eval_turn_cap)
        return HeadServer(sampler, self.host, self.run_dir / "trajectories", vocab_size=self.policy.vocab_size,
                          max_message_bytes=int(lc.max_message_mb * 2**20))

    def _make_publisher(self, head: HeadServer) -> ActorPublisher:
        return ActorPublisher(self.cfg, self.host, self.policy.weights_for_actors, head.join_requests,
                              head.take_join_requests)

    def _write_endpoints(self, head: HeadServer, publisher: ActorPublisher, actor_model_path: str) -> dict[str, str]:
        addresses = {"lease": head.lease_address, "trajectories": head.trajectory_address,
                     "control": publisher.control_address, "weights": publisher.broadcaster.address,
                     "model_path": actor_model_path, "policy_version": str(self.version),
                     "weights_device": publisher.weights_device}
        # Where a live run listens, for tools that attach to it (and the tests that attack it).
        (self.run_dir / "endpoints.json").write_text(json.dumps(addresses, indent=1))
        return addresses

    def _maybe_resume(self) -> str:
        """Restore from the latest complete checkpoint; returns the weights actors must start from."""
        if not self.cfg.run.resume:
            return self.model_path
        folder = latest_complete(self.run_dir)
        if folder is None:
            raise FileNotFoundError(f"--resume: no checkpoint with a COMPLETE marker under {self.run_dir}")
        state = self.policy.load(folder)
        self.step, self.version = state["step"], state["version"]
        self.source.load_state_dict(state["source"])
        self.horizon.restore(state["horizon"], self.step)
        log.info("resumed from %s at step %d", folder, self.step)
        return str(folder / "hf")

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict:
        log.info("training from step %d to %d", self.step, self.cfg.run.max_steps)
        started = time.time()
        self.evals.before_training(self.step)
        while self.step < self.cfg.run.max_steps and not self._stop.is_set() and not self._out_of_time(started):
            groups, wait_s = self.collector.collect(self.version)
            if groups is None:
                break
            self._train_on(groups, wait_s)
        self.evals.after_training(self.step)
        self._finish()
        return {**self.metrics.progress, "wall_s": time.time() - started, "ledger": self.source.ledger(),
                "eval": self.evals.logged}

    def _train_on(self, groups: list[Group], wait_s: float) -> None:
        t0 = time.monotonic()
        episodes = self.collector.take_failed_episodes() + [e for g in groups for e in g.episodes]
        scalars = rollout_scalars(episodes, self.version)
        scalars.update(self._update_policy(groups))
        t1 = time.monotonic()
        turn_cap = self._publish_policy(scalars)
        self.evals.after_step(self.step)  # after the broadcast: a new round's episodes start on the new weights
        t2 = time.monotonic()
        scalars.update(timing_scalars(episodes, wait_s, t1 - t0, t2 - t1), **self._state_scalars(turn_cap))
        self.metrics.record(self.step, self.version, scalars, episodes, turn_cap)
        every = self.cfg.learner.checkpoint_every
        if every and self.step % every == 0 and self.step < self.cfg.run.max_steps:
            self._checkpoint()

    def _update_policy(self, groups: list[Group]) -> dict[str, float]:
        """One optimizer step on ``groups`` (every group has an ok episode: ``GroupCollector``);
        version v becomes v+1."""
        batch = collate(groups, self.cfg.learner.algorithm.format_coef, self.collector.min_version(self.version))
        self.collector.stale_tokens += batch.stale_tokens
        sampled = sum(int(e.loss_mask.sum()) for e in batch.episodes)
        scalars = {"async/stale_token_frac": batch.stale_tokens / max(sampled, 1)}
        broadcast_command(Command.TRAIN, self.step)
        scalars.update(self.policy.train(broadcast_batch(batch)))
        self.trained_log.record(batch, self.policy.trainer.last_advantages, self.step + 1)
        self.source.consume(len(groups))
        self.step += 1
        self.version += 1
        return scalars

    def _publish_policy(self, scalars: dict[str, float]) -> int:
        """The new version and the horizon's turn cap to the data source, the weights to the actors;
        returns the turn cap. The adaptive schedule decides on what this step saw."""
        self.horizon.observe(self.step, scalars["horizon/truncated_at_cap"], scalars["rollout/success"])
        turn_cap = self.horizon.cap_at(self.step)
        sync = self.cfg.run.mode == "sync"
        if not sync:  # async: new leases start at once, on the weights the actors have
            self.source.set_policy(self.version, turn_cap)
        self.source.expect_version(self.version)
        self.publisher.publish(self.version)
        if sync:  # sync: the next batch is leased only once the new weights are out
            self.source.set_policy(self.version, turn_cap)
        return turn_cap

    def _state_scalars(self, turn_cap: int) -> dict[str, float]:
        """The horizon's and every collaborator's own scalars (envhub's: the latest poll)."""
        return {"horizon/turn_cap": turn_cap, "horizon/stage": self.horizon.stage_at(self.step),
                **self.collector.scalars(), **self.source.scalars(), **self.publisher.scalars(),
                **self.envhub_stats.scalars()}

    def _out_of_time(self, started: float) -> bool:
        limit_s = self.cfg.run.max_wall_s
        if limit_s and time.time() - started >= limit_s:
            log.info("run.max_wall_s (%.0f s) reached at step %d", limit_s, self.step)
            return True
        return False

    def _checkpoint(self) -> Path:
        broadcast_command(Command.CHECKPOINT, self.step)
        loop_state = {"step": self.step, "version": self.version, "source": self.source.state_dict(),
                      "horizon": self.horizon.checkpoint_state(self.step)}
        return self.policy.save(self.run_dir, self.step, loop_state)

    def _finish(self) -> None:
        self.publisher.stop_actors()
        if self.step > 0:
            self.metrics.progress["checkpoint"] = str(self._checkpoint())
        broadcast_command(Command.STOP, self.step)
        self.evals.after_step(self.step, start=False)
        self.envhub_stats.stop()
        self.metrics.close()
        self.trained_log.close()
        self.source.stop()
        self.publisher.close()

    # ------------------------------------------------------------------ the launcher's calls

    def progress(self) -> dict:
        return {"step": 0} if self.metrics is None else dict(self.metrics.progress)

    def request_stop(self) -> None:
        self._stop.set()

    def actor_lost(self, actor_id: int) -> int:
        """The launcher saw actor ``actor_id`` die: re-issue its leases now (returns how many), and
        leave it out of the next weight group."""
        lost = self.source.actor_lost(actor_id)
        self.publisher.actor_lost(actor_id)
        log.warning("actor %d died; %d lease(s) re-issued", actor_id, lost)
        return lost
