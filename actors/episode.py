"""One episode: generate, parse the action, step the env over HTTP, until it ends.

Each turn appends the new observation as a chat-template delta (tokenized alone, loss mask 0)
and the sampled tokens exactly as sampled (loss mask 1, behavior logprobs, policy version per
token). The episode ends on ``terminated``, on ``truncated`` (the lease's turn cap or token
budget, or the env's own limit), at the lease's deadline (status ``timeout``) or on an error
(``env_error``, ``engine_error``, or ``actor_error`` for anything else); the reason and status
travel with it. Every episode returns a trajectory, whatever ended it, of at most the lease's
``max_episode_tokens`` tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from actors.conversation import ConversationStarts
from actors.engine_api import EngineError, InferenceEngine, SamplingParams
from actors.transcript_tokens import TranscriptTokens
from common.chat import ChatTokenBuffer
from common.protocol import TaskLease, Trajectory
from envhub.actions import MalformedAction, extract_action
from envhub.client import EnvClient, EnvClientError

log = logging.getLogger("actor")


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
    deadline_margin_s: float = 0.0
    """The episode is cut this long before its lease's deadline, so that it reaches the head in time."""
    tokens: TranscriptTokens | None = None
    """Openings and observations as token ids (remembered, long ones off the loop); made if not given."""
    eval_sampling: SamplingParams | None = None
    """How held-out (``purpose="eval"``) episodes sample; ``sampling`` if not given."""

    def __post_init__(self) -> None:
        if self.tokens is None:
            self.tokens = TranscriptTokens(self.tokenizer, self.system_prompt or None)

    def sampling_for(self, purpose: str) -> SamplingParams:
        return self.eval_sampling if purpose == "eval" and self.eval_sampling is not None else self.sampling


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
    turn_action_accepted: list[int] = field(default_factory=list)
    env_info: dict = field(default_factory=dict)
    """The latest step's info: its ``score`` (AgentGym's score so far) is the episode's."""
    timings: dict = field(default_factory=lambda: {"generate_s": 0.0, "env_s": 0.0})


class DeadlinePassed(Exception):
    """The lease's deadline (less ``deadline_margin_s``) came before the episode ended."""


async def run_episode(lease: TaskLease, index: int, deps: EpisodeDeps) -> Trajectory:
    started = time.monotonic()
    buf: ChatTokenBuffer | None = None  # the transcript, once its opening fits the token budget
    out = EpisodeOutcome()
    session_id = None
    try:
        t = time.monotonic()
        session = await _create_session(lease, deps)
        out.timings["env_s"] += time.monotonic() - t
        session_id = session.session_id
        buf = await _opened(lease, deps, session.observation)
        await _play(lease, buf, deps, session_id, session.observation, out)
    except DeadlinePassed as exc:
        _fail(out, "timeout", exc)
        out.truncated, out.finish_reason = True, "deadline"
    except EnvClientError as exc:
        _fail(out, _env_failure_status(exc), exc)
    except EngineError as exc:
        _fail(out, "engine_error", exc)
    except Exception as exc:  # the actor's own failure: the head still gets the episode, and why
        log.exception("episode %d of lease %s failed in the actor", index, lease.lease_id)
        _fail(out, "actor_error", f"{type(exc).__name__}: {exc}")
    finally:
        if session_id is not None:
            await _close_quietly(deps.env, session_id)
    out.timings["episode_s"] = time.monotonic() - started
    return _trajectory(lease, index, deps.actor_id, buf, out)


async def _opened(lease: TaskLease, deps: EpisodeDeps, observation: str) -> ChatTokenBuffer:
    """The transcript up to the first generation prompt; ValueError when it alone exceeds the budget."""
    preamble, first_turn = await _opening(lease, deps, observation)
    buf = ChatTokenBuffer(deps.tokenizer, deps.system_prompt or None)
    buf.start(first_turn, preamble, deps.tokens.opening_ids(preamble, first_turn))
    if len(buf) > lease.max_episode_tokens:
        raise ValueError(f"the opening is {len(buf)} tokens, more than the lease's max_episode_tokens "
                         f"{lease.max_episode_tokens}")
    return buf


async def _play(lease: TaskLease, buf: ChatTokenBuffer, deps: EpisodeDeps, session_id: str, observation: str,
                out: EpisodeOutcome) -> None:
    """The turns, cut at the lease's deadline (less the margin): the generate or env step in flight
    is cancelled (a cancelled generate frees its batch row; a cancelled env step leaves a session
    that is closed right after) and DeadlinePassed raised; at once when the deadline has come.
    One timer for the episode, not one per call: arming and cancelling two a turn cost the actor
    more than a fifth of its own time per turn."""
    remaining_s = lease.deadline_unix_s - deps.deadline_margin_s - time.time()
    if remaining_s <= 0:
        raise DeadlinePassed("the lease's deadline passed")
    deadline = asyncio.timeout(remaining_s)
    try:
        async with deadline:
            await _turns(lease, buf, deps, session_id, observation, out)
    except TimeoutError:
        if deadline.expired():
            raise DeadlinePassed("the lease's deadline passed while waiting") from None
        raise


async def _turns(lease: TaskLease, buf: ChatTokenBuffer, deps: EpisodeDeps, session_id: str, observation: str,
                 out: EpisodeOutcome) -> None:
    while True:
        if out.num_turns >= lease.turn_cap:
            out.truncated, out.finish_reason = True, "turn_cap"
            return
        if len(buf) + deps.sampling.max_new_tokens > lease.max_episode_tokens:
            out.truncated, out.finish_reason = True, "token_budget"
            return
        t = time.monotonic()
        # The transcript itself, not a copy: an engine copies what it keeps (``InferenceEngine.generate``).
        gen = await deps.engine.generate(buf.token_ids, deps.sampling_for(lease.purpose))
        out.timings["generate_s"] += time.monotonic() - t
        buf.append_generated(gen.token_ids, gen.logprobs, gen.versions)
        action = deps.tokens.reply_text(gen.token_ids).strip()
        t = time.monotonic()
        result = await deps.env.step(session_id, action)
        out.timings["env_s"] += time.monotonic() - t
        out.num_turns += 1
        out.reward += result.reward
        out.turn_rewards.append(float(result.reward))
        out.turn_observations.append(observation_fingerprint(observation))
        parsed = action_parsed(action, result.info)
        out.turn_action_parsed.append(int(parsed))
        out.turn_action_accepted.append(int(action_accepted(parsed, result.info)))
        out.env_info = result.info  # the last step's; its score is read once, at the end
        if result.terminated or result.truncated:
            out.success = bool(result.info.get("success", False))
            out.terminated, out.truncated = result.terminated, result.truncated
            out.finish_reason = "terminated" if result.terminated else "env_truncated"
            return
        # The transcript never holds more than max_episode_tokens: an observation that would take
        # it past the budget is left out, and the episode ends after the turn that earned it (its
        # reward counts). One that fits but leaves no room for a reply ends it at the loop's top.
        delta_ids = await deps.tokens.delta_ids(result.observation)
        if not buf.append_observation(result.observation, lease.max_episode_tokens, delta_ids):
            out.truncated, out.finish_reason = True, "token_budget"
            return
        observation = result.observation


async def _opening(lease: TaskLease, deps: EpisodeDeps, observation: str) -> tuple[list, str]:
    try:
        return await deps.conversation.opening(lease.env_id, lease.task_id, observation)
    except ValueError as exc:  # more examples asked for than the env has (actors check it at start)
        raise EnvClientError(None, f"{lease.env_id}: conversation start: {exc}") from exc


def action_parsed(reply: str, info: dict) -> bool:
    """Whether the reply held an action in the env's format: the env's own ``action_parsed`` when it
    says (every built-in env does), else whether AgentGym's ``Action:`` line is there."""
    said = info.get("action_parsed")
    if isinstance(said, bool):
        return said
    return not isinstance(extract_action(reply), MalformedAction)


def action_accepted(parsed: bool, info: dict) -> bool:
    """Whether the env carried the action out: a parsed one that the env's own ``action_valid`` does
    not refuse (an env that does not say accepts every parsed action)."""
    said = info.get("action_valid")
    return parsed and (said if isinstance(said, bool) else True)


def reported_score(info: dict) -> float | None:
    """The env's ``info["score"]`` as a float; ``None`` when it reports none, or one that is not a
    finite number (a broken score must not reach the wire, where it would reject the episode)."""
    score = info.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        return None
    return float(score)


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


def _fail(out: EpisodeOutcome, status: str, error: object) -> None:
    out.status, out.finish_reason, out.error = status, status, str(error)[:500]


async def _close_quietly(env: EnvClient, session_id: str) -> None:
    try:
        await env.close(session_id)
    except Exception as exc:  # the server reaps idle sessions; the episode's outcome is already decided
        log.debug("closing session %s failed: %r", session_id, exc)


_NO_TRANSCRIPT = {"token_ids": np.zeros(0, np.int32), "loss_mask": np.zeros(0, np.uint8),
                  "logprobs": np.zeros(0, np.float32), "versions": np.zeros(0, np.int32),
                  "turn_spans": np.zeros((0, 2), np.int32)}
"""An episode that failed before its opening fitted the budget has no tokens to show."""


def _trajectory(lease: TaskLease, index: int, actor_id: int, buf: ChatTokenBuffer | None,
                out: EpisodeOutcome) -> Trajectory:
    arrays = buf.as_arrays() if buf is not None else _NO_TRANSCRIPT
    return Trajectory(
        lease_id=lease.lease_id, group_id=lease.group_id, env_id=lease.env_id, task_id=lease.task_id,
        actor_id=actor_id, episode_index=index, group_size=lease.group_size,
        token_ids=arrays["token_ids"], loss_mask=arrays["loss_mask"],
        behavior_logprobs=arrays["logprobs"], token_versions=arrays["versions"],
        turn_spans=arrays["turn_spans"].reshape(-1, 2).astype(np.int32, copy=False),
        turn_rewards=np.asarray(out.turn_rewards, dtype=np.float32),
        turn_observations=np.asarray(out.turn_observations, dtype=np.uint64),
        turn_action_parsed=np.asarray(out.turn_action_parsed, dtype=np.uint8),
        turn_action_accepted=np.asarray(out.turn_action_accepted, dtype=np.uint8),
        reward=float(min(max(out.reward, 0.0), 1.0)), success=out.success,
        score=reported_score(out.env_info) if out.status == "ok" else None,
        terminated=out.terminated, truncated=out.truncated, finish_reason=out.finish_reason,
        status=out.status, error=out.error, num_turns=out.num_turns, turn_cap=lease.turn_cap,
        timings=out.timings, env_info=_plain(out.env_info), purpose=lease.purpose,
    )


def _plain(info: dict) -> dict:
    """Keep only msgpack-able plain values of the env's info."""
    return {k: v for k, v in info.items() if isinstance(v, (str, int, float, bool, type(None), list, dict))}
