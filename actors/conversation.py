"""How an episode opens: the env's conversation start under the run's settings.

Each env declares its instruction and worked examples (``envhub.base.ConversationStart``); the actor
fetches them once per env from envhub and renders, as AgentGym's clients do, ``user: instruction``,
``assistant: acknowledgement``, the example turns, then the first observation. With the
conversation start off, the instruction is prepended to the first observation and no example is
shown (one user turn, the layout of a plain prompt).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from common.config import ConfigError
from envhub.base import ConversationStart
from envhub.client import EnvClient, EnvClientError

log = logging.getLogger("actor")

Turns = list[tuple[str, str]]


class ConversationStarts:
    """Per-env conversation starts, fetched from envhub on first use and kept for the actor's life."""

    def __init__(self, env: EnvClient, settings_for: Callable[[str], tuple[bool, int | None]]) -> None:
        self._env = env
        self._settings_for = settings_for
        self._starts: dict[str, ConversationStart] = {}
        self._fetching: dict[str, asyncio.Lock] = {}

    async def opening(self, env_id: str, task_id: str, first_observation: str) -> tuple[Turns, str]:
        """(turns before the first observation, the first user turn's text) for an episode of ``env_id``'s
        task ``task_id`` (which picks its examples when the run shows fewer than the env has).
        Raises ``EnvClientError`` when envhub cannot say, ``ValueError`` when the run asks for
        more examples than the env has."""
        start = await self._start(env_id)
        enabled, num_examples = self._settings_for(env_id)
        if enabled:
            return start.turns(num_examples, task_id), first_observation
        if not start.instruction:
            return [], first_observation
        return [], f"{start.instruction}\n\n{first_observation}"

    async def check(self, env_ids: list[str], opening_ids: Callable[[Turns, str], Sequence[int]] | None = None,
                    max_episode_tokens: int | None = None) -> None:
        """Fetch every env's start now and check the run's settings against it: a run that asks an
        env for more examples than it has, or whose start alone (tokenized by ``opening_ids``) leaves
        no room in ``max_episode_tokens``, fails at start, saying so, not episode by episode."""
        for env_id in env_ids:
            try:
                start = await self._start(env_id)
            except EnvClientError as error:  # a server being restarted: the episodes fetch it later
                log.warning("conversation start of %s not fetched yet: %s", env_id, error)
                continue
            enabled, num_examples = self._settings_for(env_id)
            try:
                turns, first_turn = (start.turns(num_examples), "") if enabled else ([], start.instruction)
            except ValueError as error:
                raise ConfigError(f"{env_id}: {error} (rollout.num_examples / conversation_per_env)") from None
            if opening_ids is not None and max_episode_tokens is not None:
                length = len(opening_ids(turns, first_turn))
                if length >= max_episode_tokens:  # every episode would fail before its first observation
                    raise ConfigError(f"{env_id}: its conversation start alone is {length} tokens, no room in "
                                      f"rollout.max_episode_tokens {max_episode_tokens} (raise it, or show "
                                      "fewer examples: rollout.num_examples)")

    async def _start(self, env_id: str) -> ConversationStart:
        if env_id not in self._starts:
            async with self._fetching.setdefault(env_id, asyncio.Lock()):  # one fetch per env, not per episode
                if env_id not in self._starts:
                    self._starts[env_id] = await self._env.conversation_start(env_id)
        return self._starts[env_id]
