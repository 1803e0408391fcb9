"""The learner loop on rank 0, the head (ranks 1..N-1 run ``learner/follower.py``).

1. Join the learner group, load the policy and shard it with FSDP2 (``fully_shard``); AdamW.
   With ``--resume``: model, optimizer, RNG, step, sampler and horizon from the latest checkpoint.
2. Start the data source: the head (``learner/head.py``: leases and trajectory ingest over
   ZeroMQ) or, with ``--replay``, a recorded trajectory stream (``learner/replay.py``).
3. Until ``run.max_steps`` (or ``run.max_wall_s`` seconds):
   a. take ``groups_per_step`` completed GRPO groups; sampled tokens more than ``max_policy_lag``
      versions old leave the loss mask (counted), a group with no fresh token left is dropped
      (counted; ``learner/batching.py``);
   b. broadcast the batch to the followers; advantages, PPO-clip loss against the behavior
      logprobs with a truncated importance weight, masked to assistant tokens; AdamW step;
   c. version v becomes v+1 (every step trains: a group with no ok episode is released before it
      joins one); the horizon schedule gives the turn cap for the next leases;
   d. announce v+1 on PUB and broadcast the weights in fixed-size buckets to the weight group,
      re-formed first when actors asked to join (start, restart, a failed receive);
      (``run.mode: sync`` admits the next batch's leases only now, with a lag bound of 0: the
      reference systems' loop, for comparison);
   e. tensorboard scalars; a checkpoint when due;
   f. validation (``learner.eval_every``): log the eval round that completed, start one when due
      (``learner/evaluation.py``; never waits for eval episodes).
4. With ``learner.eval_at_end``, one more validation round on the final policy, waited for (and with
   ``eval_at_start`` one on the untrained policy before step 1).
5. Final checkpoint, ``Control(stop)`` to the actors and followers, summary.

Run it through the launcher: ``python launch.py --config configs/smoke.yaml``.
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
from pathlib import Path

import torch
import yaml
import zmq

from common import protocol
from common.config import Config, to_dict
from common.metrics import MetricsWriter
from common.models import load_tokenizer, resolve_model
from common.net import free_port
from common.transport import bind_random, configure
from common.weight_sync import WeightBroadcaster
from envhub import registry
from envhub.envs.agentgym import register_configured_servers
from envhub.registry import task_ids
from learner.batching import collate, split_stale, stale_token_count
from learner.checkpoint import latest_complete
from learner.distributed import Command, broadcast_batch, broadcast_command
from learner.evaluation import build_eval_rounds
from learner.head import Group, HeadServer
from learner.horizon import build_horizon
from learner.model import init_process_group, use_deterministic_algorithms
from learner.policy import ShardedPolicy
from learner.replay import ReplaySource
from learner.rollout_metrics import rollout_scalars
from learner.sample_text import samples_markdown
from learner.sampler import TaskSampler
from learner.service_metrics import actor_scalars, envhub_scalars
from learner.trained_log import TrainedLog
from learner.weight_publisher import WeightPublisher

log = logging.getLogger("learner")

_RESEND_INTERVAL_S = 2.0
"""At most one weight resend this often: stale groups arrive in bursts, one resend serves them all."""
_TREND_STEPS = 3
"""Steps averaged at the start and at the end of the success trend in the progress line."""


class Learner:
    """Rank 0; the launcher calls ``setup``, then ``run``; ``progress`` at any time."""

    def __init__(self, cfg: Config, run_dir: str, envhub_url: str | None = None,
                 master: tuple[str, int] | None = None, host: str = "127.0.0.1"):
        self.cfg, self.run_dir, self.envhub_url, self.host = cfg, Path(run_dir), envhub_url, host
        self.master = master
        self.step, self.version, self._dropped_stale, self._stale_tokens = 0, 0, 0, 0
        self._dropped_failed, self._failed_episodes = 0, []  # groups with no ok episode; metrics-only
        self._last_resend_s, self._weight_resends = 0.0, 0
        self._progress: dict = {"step": 0}
        self._success_curve: list[float] = []
        self._stop = threading.Event()
        self.live = not cfg.run.replay

    def setup(self) -> dict[str, str]:
        """Collective with the followers' ``setup``; returns the addresses actors connect to."""
        cfg = self.cfg
        torch.manual_seed(cfg.run.seed)
        torch.set_num_threads(cfg.learner.torch_threads)
        use_deterministic_algorithms(self.cfg.run.deterministic)
        register_configured_servers(cfg.envhub.env_options)  # agentgym-<name>-vN ids: their task lists
        init_process_group(0, cfg.learner.num_ranks, *(self.master or (self.host, free_port(self.host))))
        self.model_path = str(resolve_model(cfg.model.name, cfg.model.cache_dir))
        self._tokenizer = None  # loaded for the first sample text
        self.policy = ShardedPolicy(cfg, self.model_path)
        self.horizon = build_horizon(cfg.learner.horizon, cfg.run.max_steps)
        self.source = self._make_head() if self.live else ReplaySource(cfg.run.replay)
        actor_model_path = self._maybe_resume()
        self.source.set_policy(self.version, self.horizon.cap_at(self.step))
        self.metrics = MetricsWriter(self.run_dir / "tb", cfg.learner.tb_flush_s)
        self.trained_log = TrainedLog(self.run_dir / "trajectories")  # which episodes each step used
        self.metrics.text("config", "```yaml\n" + yaml.safe_dump(to_dict(cfg), sort_keys=False) + "\n```")
        self.source.start()
        self.evaluation = build_eval_rounds(cfg) if self.live else None
        self._evaluate()
        if not self.live:
            return {"model_path": actor_model_path}
        self.pub = configure(zmq.Context.instance().socket(zmq.PUB))
        control_address = bind_random(self.pub, self.host)
        self.broadcaster = WeightBroadcaster(self.host, int(cfg.learner.bucket_mb * 2**20),
                                             cfg.learner.broadcast_timeout_s, weights_device(cfg))
        self.weights = WeightPublisher(self.pub, self.broadcaster, self.source.take_join_requests)
        addresses = {"lease": self.source.lease_address, "trajectories": self.source.trajectory_address,
                     "control": control_address, "weights": self.broadcaster.address, "model_path": actor_model_path,
                     "policy_version": str(self.version), "weights_device": weights_device(cfg)}
        # Where a live run listens, for tools that attach to it (and the tests that attack it).
        (self.run_dir / "endpoints.json").write_text(json.dumps(addresses, indent=1))
        return addresses

    def _make_head(self) -> HeadServer:
        return HeadServer(self._make_sampler(), self.host, self.run_dir / "trajectories",
                          vocab_size=self.policy.vocab_size,
                          max_message_bytes=int(self.cfg.learner.max_message_mb * 2**20))

    def _make_sampler(self) -> TaskSampler:
        r, lc = self.cfg.rollout, self.cfg.learner
        options = self.cfg.envhub.env_options
        env_tasks = {env_id: task_ids(env_id, r.split, **options.get(env_id, {})) for env_id in r.envs}
        return TaskSampler(env_tasks, r.group_size, lc.groups_per_step, self.max_policy_lag,
                           lc.lease_timeout_s, r.max_episode_tokens, self.cfg.run.seed,
                           max_group_reissues=lc.max_group_reissues,
                           env_max_turns={env_id: registry.spec(env_id).max_turns for env_id in r.envs})

    @property
    def max_policy_lag(self) -> int:
        """Sync mode is lag 0: a batch's groups are leased, generated and trained at one version."""
        return 0 if self.cfg.run.mode == "sync" else self.cfg.learner.max_policy_lag

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

    def run(self) -> dict:
        log.info("training from step %d to %d", self.step, self.cfg.run.max_steps)
        started = time.time()
        if self.live and self.cfg.learner.eval_at_start and self.step == 0:
            self._validate_and_wait()  # the untrained policy, before any update reaches the actors
        while self.step < self.cfg.run.max_steps and not self._stop.is_set() and not self._out_of_time(started):
            groups, wait_s = self._collect_groups()
            if groups is None:
                break
            self._train_on(groups, wait_s)
        if self.live and self.cfg.learner.eval_at_end and not self._stop.is_set():
            self._validate_and_wait()
        self._finish()
        return {**self._progress, "wall_s": time.time() - started, "ledger": self.source.ledger()}

    def _out_of_time(self, started: float) -> bool:
        limit_s = self.cfg.run.max_wall_s
        if limit_s and time.time() - started >= limit_s:
            log.info("run.max_wall_s (%.0f s) reached at step %d", limit_s, self.step)
            return True
        return False

    def _collect_groups(self) -> tuple[list[Group] | None, float]:
        started, groups = time.monotonic(), []
        while len(groups) < self.cfg.learner.groups_per_step:
            if self._stop.is_set():
                return None, 0.0
            group = self.source.get(timeout_s=0.5)
            if group is None:
                if self.source.exhausted_is_final:
                    log.info("replay stream exhausted at step %d", self.step)
                    return None, 0.0
                continue
            if not any(e.status == "ok" for e in group.episodes):
                self._drop_failed(group)
                continue
            groups.append(group)
            if self.live:
                groups = self._drop_stale(groups)
        return groups, time.monotonic() - started

    def _drop_failed(self, group: Group) -> None:
        """A group none of whose episodes ended ok (an envhub server died under it) has nothing to
        train on: release it rather than spend a step on it. Every step then trains and publishes
        a new version; the staleness admission relies on that (a step that consumed groups
        without a new version froze the admission bound, and a live run stalled). Its episodes
        still count in the next step's rollout metrics, so the errors show."""
        self.source.release(group)
        self._dropped_failed += 1
        self._failed_episodes.extend(group.episodes)
        first = group.episodes[0]  # a group completes with all its episodes
        log.warning("group %s (%s) has no ok episode (%s: %s): dropped untrained", group.lease.group_id,
                    group.lease.env_id, first.status, first.error[:200])

    def _drop_stale(self, groups: list[Group]) -> list[Group]:
        """Release (and count) the groups with no fresh token left; stale tokens of the others are
        masked by ``collate``. Any stale token may mean actors lack the current weights."""
        fresh, stale = split_stale(groups, self.version, self.max_policy_lag)
        for group in stale:
            self.source.release(group)
        self._dropped_stale += len(stale)
        min_version = self.version - self.max_policy_lag
        if stale or any(stale_token_count(e, min_version) for g in fresh for e in g.episodes if e.status == "ok"):
            self._resend_if_actors_behind()
        return fresh

    def _resend_if_actors_behind(self) -> None:
        """Stale groups while some actor lacks the current weights (the last broadcast failed or
        reached nobody, an actor restarted on the initial weights and asked to join): send them
        again now. Waiting for the next step's broadcast could wait forever, since that step
        needs fresh groups from those very actors (a lone restarted actor stalled a run so)."""
        if not (self.weights.actors_behind or self.source.has_join_requests()):
            return
        if time.monotonic() - self._last_resend_s < _RESEND_INTERVAL_S:
            return
        self._last_resend_s = time.monotonic()
        self._weight_resends += 1
        log.info("groups too stale to train on while actors are behind: resending version %d", self.version)
        broadcast_command(Command.GATHER, self.step)
        self._broadcast_weights()

    def _train_on(self, groups: list[Group], wait_s: float) -> None:
        t0 = time.monotonic()
        episodes, self._failed_episodes = self._failed_episodes + [e for g in groups for e in g.episodes], []
        scalars = rollout_scalars(episodes, self.version)
        # Every group has an ok episode (``_drop_failed``); replay trains on the recorded tokens as they are.
        min_version = self.version - self.max_policy_lag if self.live else None
        batch = collate(groups, self.cfg.learner.algorithm.format_coef, min_version)
        self._stale_tokens += batch.stale_tokens
        sampled = sum(int(e.loss_mask.sum()) for e in batch.episodes)
        scalars["async/stale_token_frac"] = batch.stale_tokens / max(sampled, 1)
        broadcast_command(Command.TRAIN, self.step)
        scalars.update(self.policy.train(broadcast_batch(batch)))
        self.trained_log.record(batch, self.policy.trainer.last_advantages, self.step + 1)
        self.source.consume(len(groups))
        self.step += 1
        self.version += 1
        t1 = time.monotonic()
        # The adaptive schedule decides on what this step saw.
        self.horizon.observe(self.step, scalars["horizon/truncated_at_cap"], scalars["rollout/success"])
        turn_cap = self.horizon.cap_at(self.step)
        sync = self.cfg.run.mode == "sync"
        if not sync:  # async: new leases start at once, on the weights the actors have
            self.source.set_policy(self.version, turn_cap)
        if self.live:
            self.source.expect_version(self.version)
            self._broadcast_weights()
        if sync:  # sync: the next batch is leased only once the new weights are out
            self.source.set_policy(self.version, turn_cap)
        self._evaluate()  # after the broadcast: a new round's episodes start on the new weights
        t2 = time.monotonic()
        scalars.update(self._loop_scalars(episodes, wait_s, t1 - t0, t2 - t1, turn_cap))
        self.metrics.scalars(scalars, self.step)
        self._log_samples(episodes)
        self._update_progress(scalars, turn_cap)
        every = self.cfg.learner.checkpoint_every
        if every and self.step % every == 0 and self.step < self.cfg.run.max_steps:
            self._checkpoint()

    def _log_samples(self, episodes: list) -> None:
        every = self.cfg.learner.sample_text_every
        if not every or not episodes or self.step % every:
            return
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.model_path)
        for tag, markdown in samples_markdown(episodes, self._tokenizer).items():
            self.metrics.text(tag, markdown, self.step)

    def _evaluate(self, start: bool = True) -> None:
        """Log the eval round that completed (at the step it started); start one when due."""
        if self.evaluation is None:
            return
        for step, scalars in self.evaluation.collect(self.source.eval_groups):
            self.metrics.scalars(scalars, step)
        if start:
            self.evaluation.maybe_start(self.step, self.source)

    def _validate_and_wait(self) -> None:
        """A validation round of the policy at this step, waited for (``learner.eval_at_start``,
        ``eval_at_end``): a round in flight from an earlier step is finished first; the actors keep
        serving training leases meanwhile."""
        deadline_s = time.monotonic() + self.cfg.learner.eval_end_timeout_s
        started = self.evaluation.in_flight_step == self.step
        while time.monotonic() < deadline_s and not self._stop.is_set():
            self.source.check_alive()  # a dead head would otherwise be waited on for the whole timeout
            self._evaluate(start=False)
            if not self.evaluation.in_flight:
                if started:
                    return
                self.evaluation.start(self.step, self.source)
                started = True
            time.sleep(0.2)
        log.warning("the validation round of step %d did not complete within %.0f s", self.step,
                    self.cfg.learner.eval_end_timeout_s)

    def _broadcast_weights(self) -> None:
        """Send the new version to the weight group (``learner/weight_publisher.py``)."""
        # gathered bucket by bucket as they are sent, a collective: the followers gather too
        self.weights.publish(self.policy.weights_for_actors(), self.version)

    def _loop_scalars(self, episodes, wait_s: float, train_s: float, broadcast_s: float, turn_cap: int) -> dict:
        step_s = wait_s + train_s + broadcast_s
        ledger = self.source.ledger()
        out = {
            "time/step_s": step_s, "time/wait_s": wait_s, "time/train_s": train_s, "time/broadcast_s": broadcast_s,
            "perf/samples_per_s": len(episodes) / max(step_s, 1e-9),
            "perf/tokens_per_s": sum(len(e.token_ids) for e in episodes) / max(step_s, 1e-9),
            "horizon/turn_cap": turn_cap, "horizon/stage": self.horizon.stage_at(self.step),
            "async/groups_dropped_stale": self._dropped_stale, "async/groups_dropped_failed": self._dropped_failed,
            "async/stale_tokens_masked": self._stale_tokens,
        }
        if self.live:
            out.update({
                "async/queue_groups": self.source.groups.qsize(),
                "async/leases_outstanding": ledger.get("outstanding", 0),
                "async/episodes_discarded_late": ledger.get("episodes_discarded_late", 0),
                "async/groups_abandoned": ledger.get("abandoned", 0),
                "async/rejected_messages": ledger.get("rejected_messages", 0),
                "async/weight_group_size": len(self.broadcaster.members),
                "async/weight_group_generation": self.broadcaster.generation,
                "async/broadcast_failures": self.weights.failures,
                "async/weight_resends": self._weight_resends,
                **envhub_scalars(self.envhub_url), **actor_scalars(dict(self.source.actor_stats)),
            })
        return out

    def _update_progress(self, scalars: dict, turn_cap: int) -> None:
        success = scalars.get("rollout/success", 0.0)
        self._success_curve.append(round(success, 4))
        self._progress = {
            "step": self.step, "max_steps": self.cfg.run.max_steps, "version": self.version,
            "reward": scalars.get("rollout/reward", 0.0), "success": success,
            # One step's success is noisy; the start and the recent mean show whether it learns.
            "success_first_steps": statistics.mean(self._success_curve[:_TREND_STEPS]),
            "success_last_steps": statistics.mean(self._success_curve[-_TREND_STEPS:]),
            "success_curve": list(self._success_curve),
            "valid_action_frac": scalars.get("rollout/valid_action_frac"),
            "turn_cap": turn_cap, "samples_per_s": scalars["perf/samples_per_s"],
            "policy_lag": scalars.get("async/policy_lag_mean", 0.0),
        }

    def _checkpoint(self) -> Path:
        broadcast_command(Command.CHECKPOINT, self.step)
        loop_state = {"step": self.step, "version": self.version, "source": self.source.state_dict(),
                      "horizon": self.horizon.checkpoint_state(self.step)}
        return self.policy.save(self.run_dir, self.step, loop_state)

    def _finish(self) -> None:
        if self.live:
            self.pub.send(protocol.encode(protocol.Control(command="stop")))
        if self.step > 0:
            self._progress["checkpoint"] = str(self._checkpoint())
        broadcast_command(Command.STOP, self.step)
        self._evaluate(start=False)
        self.metrics.close()
        self.trained_log.close()
        self.source.stop()
        if self.live:
            self.pub.close()

    def progress(self) -> dict:
        return dict(self._progress)

    def request_stop(self) -> None:
        self._stop.set()

    def actor_lost(self, actor_id: int) -> int:
        """The launcher saw actor ``actor_id`` die: re-issue its leases now (returns how many)."""
        lost = self.source.actor_lost(actor_id)
        log.warning("actor %d died; %d lease(s) re-issued", actor_id, lost)
        return lost


def weights_device(cfg: Config) -> str:
    """Where the weight group's buffers live: GPU memory (NCCL) when vLLM actors and the learner
    have GPUs, else CPU memory (gloo). The learner decides and tells the actors, so both agree."""
    return "cuda" if cfg.actors.engine == "vllm" and torch.cuda.is_available() else "cpu"
