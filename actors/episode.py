"""One episode: generate, parse the action, step the env over HTTP, until it ends.

Each turn appends the new observation as a chat-template delta (tokenized alone, loss mask 0)
and the sampled tokens exactly as sampled (loss mask 1, behavior logprobs, policy version per
token). The episode ends on ``terminated``, on ``truncated`` (the lease's turn cap or token
budget, or the env's own limit) or on an error; the reason and status travel with it.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from actors.conversation import ConversationStarts
from actors.engine_api import EngineError, InferenceEngine, SamplingParams
from common.chat import ChatTokenBuffer
from common.protocol import TaskLease, Trajectory
from envhub.actions import MalformedAction, extract_action
from envhub.client import EnvClient, EnvClientError


@dataclass
class EpisodeDeps:
    """What every episode of an actor shares."""

    actor_id: int
    engine: InferenceEngine
    env: EnvClient
    tokenizer: object
    sampling: SamplingParams
    system_prompt: str | None
    conversation: ConversationStarts
    """Each env's instruction and worked examples, rendered before the first observation."""
    env_reconnect_s: float = 0.0
    """How long a new episode waits for an envhub server that refuses connections (restarting)."""


@dataclass
class EpisodeOutcome:
    """How the episode went, filled in turn by turn."""

    reward: float = 0.0
    success: bool = False
    terminated: bool = False
    truncated: bool = False
    finish_reason: str = ""
    status: str = "ok"
    error: str = ""
    num_turns: int = 0
    turn_rewards: list[float] = field(default_factory=list)
    turn_observations: list[int] = field(default_factory=list)
    turn_action_parsed: list[int] = field(default_factory=list)
    env_info: dict = field(default_factory=dict)
    timings: dict = field(default_factory=lambda: {"generate_s": 0.0, "env_s": 0.0})


async def run_episode(lease: TaskLease, index: int, deps: EpisodeDeps) -> Trajectory:
    started = time.monotonic()
    buf = ChatTokenBuffer(deps.tokenizer, deps.system_prompt or None)
    out = EpisodeOutcome()
    session_id = None
    try:
        t = time.monotonic()
        session = await _create_session(lease, deps)
        out.timings["env_s"] += time.monotonic() - t
        session_id = session.session_id
        preamble, first_turn = await _opening(lease, deps, session.observation)
        buf.start(first_turn, preamble)
        await _play(lease, buf, deps, session_id, session.observation, out)
    except EnvClientError as exc:
        _fail(out, _env_failure_status(exc), exc)
    except EngineError as exc:
        _fail(out, "engine_error", exc)
    finally:
        if session_id is not None:
            await _close_quietly(deps.env, session_id)
    out.timings["episode_s"] = time.monotonic() - started
    return _trajectory(lease, index, deps.actor_id, buf, out)


async def _play(lease: TaskLease, buf: ChatTokenBuffer, deps: EpisodeDeps, session_id: str, observation: str,
                out: EpisodeOutcome) -> None:
    while True:
        if out.num_turns >= lease.turn_cap:
            out.truncated, out.finish_reason = True, "turn_cap"
            return
        if len(buf) + deps.sampling.max_new_tokens > lease.max_episode_tokens:
            out.truncated, out.finish_reason = True, "token_budget"
            return
        t = time.monotonic()
        gen = await deps.engine.generate(list(buf.token_ids), deps.sampling)
        out.timings["generate_s"] += time.monotonic() - t
        buf.append_generated(gen.token_ids, gen.logprobs, gen.versions)
        action = deps.tokenizer.decode(gen.token_ids, skip_special_tokens=True).strip()
        t = time.monotonic()
        result = await deps.env.step(session_id, action)
        out.timings["env_s"] += time.monotonic() - t
        out.num_turns += 1
        out.reward += result.reward
        out.turn_rewards.append(float(result.reward))
        out.turn_observations.append(observation_fingerprint(observation))
        out.turn_action_parsed.append(int(action_parsed(action, result.info)))
        out.env_info = dict(result.info)
        if result.terminated or result.truncated:
            out.success = bool(result.info.get("success", False))
            out.terminated, out.truncated = result.terminated, result.truncated
            out.finish_reason = "terminated" if result.terminated else "env_truncated"
            return
        buf.append_observation(result.observation)
        observation = result.observation


async def _opening(lease: TaskLease, deps: EpisodeDeps, observation: str) -> tuple[list, str]:
    try:
        return await deps.conversation.opening(lease.env_id, observation)
    except ValueError as exc:  # more examples asked for than the env has (actors check it at start)
        raise EnvClientError(None, f"{lease.env_id}: conversation start: {exc}") from exc


def action_parsed(reply: str, info: dict) -> bool:
    """Whether the reply held an action in the env's format: the env's own ``action_parsed`` when it
    says (every built-in env does), else whether AgentGym's ``Action:`` line is there."""
    said = info.get("action_parsed")
    if isinstance(said, bool):
        return said
    return not isinstance(extract_action(reply), MalformedAction)


def observation_fingerprint(observation: str) -> int:
    """64 bits of BLAKE2b of the text: equal observations, equal fingerprints, in every process."""
    return int.from_bytes(hashlib.blake2b(observation.encode(), digest_size=8).digest(), "little")


async def _create_session(lease: TaskLease, deps: EpisodeDeps):
    """A refused connection reached no server (one being restarted): wait for it, up to
    ``env_reconnect_s``, instead of failing every new lease at once while it comes back. Any
    other failure, and every failure of a running episode's step, ends the episode."""
    deadline_s, delay_s = time.monotonic() + deps.env_reconnect_s, 0.1
    while True:
        try:
            return await deps.env.create(lease.env_id, lease.task_id, lease.seed)
        except EnvClientError as exc:
            if not exc.connection_refused or time.monotonic() + delay_s > deadline_s:
                raise
        await asyncio.sleep(delay_s)
        delay_s = min(2 * delay_s, 2.0)


def _env_failure_status(exc: EnvClientError) -> str:
    """A missed deadline (server 504 or client-side time-out) is ``timeout``; the rest ``env_error``."""
    timed_out = exc.status_code in (408, 504) or (exc.status_code is None and "timeout" in str(exc).lower())
    return "timeout" if timed_out else "env_error"


def _fail(out: EpisodeOutcome, status: str, exc: Exception) -> None:
    out.status, out.finish_reason, out.error = status, status, str(exc)[:500]


async def _close_quietly(env: EnvClient, session_id: str) -> None:
    try:
        await env.close(session_id)
    except EnvClientError:
        pass  # the server reaps idle sessions; the episode's outcome is already decided


def _trajectory(lease: TaskLease, index: int, actor_id: int, buf: ChatTokenBuffer, out: EpisodeOutcome) -> Trajectory:
    arrays = buf.as_arrays()
    return Trajectory(
        lease_id=lease.lease_id, group_id=lease.group_id, env_id=lease.env_id, task_id=lease.task_id,
        actor_id=actor_id, episode_index=index, group_size=lease.group_size,
        token_ids=arrays["token_ids"], loss_mask=arrays["loss_mask"],
        behavior_logprobs=arrays["logprobs"], token_versions=arrays["versions"],
        turn_spans=arrays["turn_spans"].reshape(-1, 2).astype(np.int32),
        turn_rewards=np.asarray(out.turn_rewards, dtype=np.float32),
        turn_observations=np.asarray(out.turn_observations, dtype=np.uint64),
        turn_action_parsed=np.asarray(out.turn_action_parsed, dtype=np.uint8),
        reward=float(min(max(out.reward, 0.0), 1.0)), success=out.success,
        terminated=out.terminated, truncated=out.truncated, finish_reason=out.finish_reason,
        status=out.status, error=out.error, num_turns=out.num_turns, turn_cap=lease.turn_cap,
        timings=out.timings, env_info=_plain(out.env_info), purpose=lease.purpose,
    )


def _plain(info: dict) -> dict:
    """Keep only msgpack-able plain values of the env's info."""
    return {k: v for k, v in info.items() if isinstance(v, (str, int, float, bool, type(None), list, dict))}
