"""The actor loop: one asyncio (uvloop) process, one engine, many concurrent episodes.

1. Load the policy (version 0, the same weights the learner starts from) into the CPU engine.
2. Start the control thread: join the weight-broadcast group, subscribe to the head's PUB channel.
3. While not stopped: when ``group_size`` more episodes fit under ``max_concurrent_episodes``,
   ask the head for a lease (DEALER); the head answers when the staleness bound admits one.
   Run the lease's episodes concurrently with every other running episode.
4. Push each finished episode as a ``Trajectory`` (PUSH), and ``ActorStats`` every few seconds.
5. On ``Control(stop)``: cancel what runs, close the sockets, return a summary.
6. When the engine is dead for good (``actors/health.py``): stop leasing, cancel what runs (the
   launcher re-issues those leases), flush what was pushed, and raise ``EngineDead``: the run
   fails with the reason logged, and the launcher restarts the actor.

Started by the launcher (``python launch.py``), one per ``--actors``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import replace

import torch
import uvloop
import zmq
import zmq.asyncio

from actors.build_engine import build_engine, stop_token_ids
from actors.conversation import ConversationStarts
from actors.engine_api import InferenceEngine, SamplingParams
from actors.episode import EpisodeDeps, run_episode
from actors.health import EngineDead, EngineHealth
from actors.weights import ControlThread
from common import protocol
from common.config import Config
from common.models import load_tokenizer
from common.protocol import ActorStats, Control, LeaseRequest, TaskLease
from common.transport import Inbox, configure, connect
from envhub.channel_client import make_env_client

log = logging.getLogger("actor")

_ENGINE_WATCH_S = 0.2
"""How often the actor asks its engine whether it still serves."""
_FLUSH_MS = 2000
"""How long a dying actor's last pushed trajectories may take to leave its socket."""


class Actor:
    def __init__(self, cfg: Config, actor_id: int, addresses: dict[str, str], envhub_url: str):
        if cfg.rollout.group_size > cfg.actors.max_concurrent_episodes:
            raise ValueError("rollout.group_size must not exceed actors.max_concurrent_episodes")
        self.cfg, self.actor_id, self.addresses, self.envhub_url = cfg, actor_id, addresses, envhub_url
        self.finished = 0
        self.running = 0
        self._stopped_by = "launcher"
        self.errors: Counter[str] = Counter()
        self.generated_tokens = 0
        self._latencies: list[float] = []
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.engine: InferenceEngine | None = None
        self._health: EngineHealth | None = None
        self._engine_dead: str | None = None  # why, once the engine is dead for good

    def run(self) -> dict:
        """Blocking: runs the event loop until the head says stop."""
        torch.set_num_threads(self.cfg.actors.torch_threads)
        return uvloop.run(self._main())

    def stop(self) -> None:
        """Thread-safe request to stop, heard even before the loop runs; nothing to do once stopped."""
        self._stop_requested = True
        if self._loop is not None and self._stop is not None:
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # the loop is closed: the actor has stopped already
                pass

    async def _main(self) -> dict:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        if self._stop_requested:  # the launcher said stop while this process was still starting
            self._stop.set()
        cfg = self.cfg
        path = self.addresses["model_path"]
        tokenizer = load_tokenizer(path)
        engine = self.engine = build_engine(cfg, path, self.actor_id, int(self.addresses["policy_version"]))
        self._health = EngineHealth(engine, cfg.actors.max_consecutive_engine_errors)
        engine.start()
        control = ControlThread(engine, self.actor_id, self.addresses, cfg.learner.broadcast_timeout_s,
                                self._on_control)
        control.start()
        ctx = zmq.asyncio.Context.instance()
        dealer = configure(ctx.socket(zmq.DEALER))
        connect(dealer, self.addresses["lease"])
        push = configure(ctx.socket(zmq.PUSH))
        connect(push, self.addresses["trajectories"])
        sampling = SamplingParams(cfg.rollout.max_new_tokens, cfg.rollout.temperature, stop_token_ids(tokenizer, path))
        eval_sampling = replace(sampling, greedy=cfg.rollout.eval_greedy)
        async with make_env_client(self.envhub_url, cfg.actors.env_timeout_s, cfg.actors.env_transport) as env:
            conversation = ConversationStarts(env, cfg.rollout.conversation_for)
            deps = EpisodeDeps(self.actor_id, engine, env, tokenizer, sampling, cfg.rollout.system_prompt,
                               conversation, cfg.actors.env_reconnect_s, cfg.actors.lease_deadline_margin_s,
                               eval_sampling=eval_sampling)
            await conversation.check(cfg.rollout.envs, deps.tokens.opening_ids, cfg.rollout.max_episode_tokens)
            tasks = [asyncio.create_task(self._lease_loop(dealer, push, deps)),
                     asyncio.create_task(self._stats_loop(push, engine)),
                     asyncio.create_task(self._engine_watch())]
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            deps.tokens.close()
        control.stop()
        engine.stop()
        dealer.close()
        if self._engine_dead is not None:
            push.setsockopt(zmq.LINGER, _FLUSH_MS)  # the episodes pushed so far still reach the head
        push.close()
        if control.error is not None:
            raise RuntimeError("actor control thread failed") from control.error
        if self._engine_dead is not None:
            raise EngineDead(self._engine_dead)
        return {"actor_id": self.actor_id, "episodes": self.finished, "weight_version": engine.version,
                "versions_received": control.versions_applied, "weight_group_failures": control.failures,
                "weight_resends_ignored": control.resends_ignored,
                "errors": dict(self.errors), "tokenize": deps.tokens.stats(),
                "stopped_by": self._stopped_by}

    def _on_control(self, message: Control) -> None:
        """Called from the control thread."""
        if message.command == "stop":
            self._stopped_by = "head"
            self.stop()

    async def _lease_loop(self, dealer, push, deps: EpisodeDeps) -> None:
        room = asyncio.Semaphore(self.cfg.actors.max_concurrent_episodes)
        inbox, running = Inbox(f"actor-{self.actor_id}"), set()
        try:
            while True:
                for _ in range(self.cfg.rollout.group_size):
                    await room.acquire()
                await dealer.send(protocol.encode(LeaseRequest(actor_id=self.actor_id, max_leases=1)))
                lease = inbox.parse(await dealer.recv(), TaskLease)
                if lease is None:
                    self.errors["bad_lease"] += 1
                    for _ in range(self.cfg.rollout.group_size):  # give back the slots taken for it
                        room.release()
                    continue
                await _hold_one_slot_per_episode(room, lease.group_size - self.cfg.rollout.group_size)
                if self.cfg.run.mode == "sync":
                    await _serving_version(deps.engine, lease.policy_version, self.cfg.learner.broadcast_timeout_s)
                for index in range(lease.group_size):
                    task = asyncio.create_task(self._episode(lease, index, deps, push, room))
                    running.add(task)
                    task.add_done_callback(running.discard)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _episode(self, lease: TaskLease, index: int, deps: EpisodeDeps, push, room: asyncio.Semaphore) -> None:
        self.running += 1
        try:
            trajectory = await run_episode(lease, index, deps)
            await push.send(protocol.encode(trajectory))
            self.finished += 1
            self.generated_tokens += int(trajectory.loss_mask.sum())
            self._latencies.append(trajectory.timings.get("episode_s", 0.0))
            if trajectory.status != "ok":
                self.errors[trajectory.status] += 1
            self._health.observe(trajectory.status, trajectory.error)
            self._check_engine()
        finally:
            self.running -= 1
            room.release()

    async def _engine_watch(self) -> None:
        """An engine may die between episodes (a weight update fails while no episode runs)."""
        while True:
            await asyncio.sleep(_ENGINE_WATCH_S)
            self._check_engine()

    def _check_engine(self) -> None:
        reason = self._health.dead_reason()
        if reason is not None and self._engine_dead is None:
            self._engine_dead = reason
            log.error("actor %d: engine dead (%s); stopping so that the launcher restarts this actor",
                      self.actor_id, reason)
            self._stop.set()

    async def _stats_loop(self, push, engine: InferenceEngine) -> None:
        last_tokens, last_t = 0, time.monotonic()
        while True:
            await asyncio.sleep(self.cfg.actors.stats_interval_s)
            now = time.monotonic()
            latencies, self._latencies = self._latencies, []
            stats = ActorStats(
                actor_id=self.actor_id, weight_version=engine.version, episodes_running=self.running,
                episodes_finished=self.finished, engine_queue_depth=engine.queue_depth,
                tokens_per_s=(self.generated_tokens - last_tokens) / (now - last_t),
                episode_latency_s_mean=sum(latencies) / len(latencies) if latencies else 0.0,
                errors=dict(self.errors),
            )
            last_tokens, last_t = self.generated_tokens, now
            await push.send(protocol.encode(stats))


async def _serving_version(engine: InferenceEngine, version: int, timeout_s: float) -> None:
    """Sync mode: start a lease's episodes on the weights it was issued for. The head leases the
    next batch once the broadcast is out; the engine applies it at its next step boundary."""
    deadline_s = time.monotonic() + timeout_s
    while engine.version < version and time.monotonic() < deadline_s:
        await asyncio.sleep(0.005)
    if engine.version < version:
        log.warning("sync mode: still serving version %d, lease is for %d; starting anyway", engine.version, version)


async def _hold_one_slot_per_episode(room: asyncio.Semaphore, extra: int) -> None:
    """Slots were taken for ``rollout.group_size`` episodes; an eval lease may have more or fewer."""
    for _ in range(extra):
        await room.acquire()
    for _ in range(-extra):
        room.release()
