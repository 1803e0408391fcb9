"""An actor's transcript tokenization: remembered, and off the event loop when it is long.

Every turn of every episode tokenizes its observation as a chat-template delta
(``common/chat.py``), on the one thread that runs all of the actor's episodes. Two things make
that thread the actor's bottleneck, and this module takes both away:

- Observations repeat. Of a random policy's later observations in textcraft-v0 and babyai-v0,
  about 95 % had been seen among the 1,024 before (groups play one task eight times; "Could not
  find enough items" comes back all the time), and every episode of a group opens with the same
  instruction, examples and first observation. Their token ids are remembered, in a bounded
  least-recently-used map, so a repeat costs a lookup instead of the Rust tokenizer (~45 us for a
  100-character observation, and a chat-template rendering for an opening).
- Long observations stall everyone. The Rust tokenizer's ``encode`` keeps the GIL: a 20 kB web
  page holds the event loop for ~7 ms, while every other episode waits for its step reply or its
  generation to be read. ``encode_batch`` lets go of the GIL, so a long observation is tokenized by
  it on a worker thread while the loop goes on (and, with cores to spare, in parallel).

The ids are exactly those ``ChatTokenBuffer`` would work out itself (``tests/test_transcript_tokens.py``).
"""

from __future__ import annotations

import asyncio
import os
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from common.chat import check_opening, encode_observation_delta, observation_delta, opening_token_ids, plain_delta_text

CACHE_ENTRIES = 2048
"""Remembered observations: at most ~20 MB, ids kept as int32."""
MAX_CACHED_CHARS = 4096
"""Longer observations are tokenized every time: a web page seldom comes back, and would crowd out the rest."""
OPENING_ENTRIES = 256
"""Remembered openings: one per task in flight is what repeats (a group plays its task 8 times); at
most ~16 MB."""
MAX_OPENING_CHARS = 32768
"""An opening holds the env's instruction and a worked example: 1.5 kB (textcraft) to 6 kB (webnav)."""
OFFLOAD_MIN_CHARS = 2048
"""From this length on, an observation is tokenized on a worker thread (~0.7 ms of tokenizing, far
more than the hand-over, ~50 us); shorter ones inline."""
WORKERS = max(1, min(4, (os.cpu_count() or 2) - 1))
"""Tokenizing threads: one core is left to the event loop, whose stalls they exist to end."""


class LruCache:
    """A bounded map that forgets the least recently used entry first; counts its hits and misses."""

    def __init__(self, entries: int):
        self._entries = entries
        self._values: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key):
        value = self._values.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
            self._values.move_to_end(key)
        return value

    def put(self, key, value) -> None:
        self._values[key] = value
        if len(self._values) > self._entries:
            self._values.popitem(last=False)


class TranscriptTokens:
    """Token ids of episode openings and observation deltas for one tokenizer and system prompt."""

    def __init__(self, tokenizer, system_prompt: str | None, cache_entries: int = CACHE_ENTRIES,
                 offload_min_chars: int = OFFLOAD_MIN_CHARS, opening_entries: int = OPENING_ENTRIES):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self._delta = observation_delta(tokenizer, system_prompt)
        self._openings = LruCache(opening_entries)
        self._observations = LruCache(cache_entries)
        # A worker thread shares the Rust tokenizer with the loop's thread: safe while nobody changes
        # its settings, which transformers does on a call when truncation or padding is set on it.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        plain = backend is not None and backend.truncation is None and backend.padding is None
        self._offload_min_chars = offload_min_chars if plain else None
        self._executor: ThreadPoolExecutor | None = None  # made on the first long observation
        # Straight from the Rust tokenizer when transformers would add nothing (no clean-up of spaces).
        plain_decode = backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
        self._decoder = backend if plain_decode else tokenizer
        self.offloaded = 0

    def opening_ids(self, preamble: Sequence[tuple[str, str]], first_observation: str) -> Sequence[int]:
        """``ChatTokenBuffer.start``'s ids for this opening (inline: a chat template is rendered in
        Python, which keeps the GIL whatever thread runs it)."""
        key = (tuple(preamble), first_observation)
        cacheable = sum(len(text) for _, text in preamble) + len(first_observation) <= MAX_OPENING_CHARS
        ids = self._openings.get(key) if cacheable else None
        if ids is None:
            check_opening(preamble, first_observation)
            ids = array("i", opening_token_ids(self.tokenizer, self.system_prompt, preamble, first_observation))
            if cacheable:
                self._openings.put(key, ids)
        return ids

    async def delta_ids(self, text: str) -> Sequence[int]:
        """``ChatTokenBuffer.append_observation``'s delta ids for the observation ``text``."""
        cacheable = len(text) <= MAX_CACHED_CHARS
        ids = self._observations.get(text) if cacheable else None
        if ids is None:
            ids = await self._encode(text)
            if cacheable:
                self._observations.put(text, ids)
        return ids

    async def _encode(self, text: str) -> array:
        long = self._offload_min_chars is not None and len(text) >= self._offload_min_chars
        plain = plain_delta_text(self.tokenizer, self._delta, text) if long else None
        if plain is None:
            return array("i", encode_observation_delta(self.tokenizer, self._delta, text))
        if self._executor is None:
            self._executor = ThreadPoolExecutor(WORKERS, thread_name_prefix="tokenize")
        self.offloaded += 1
        backend = self.tokenizer.backend_tokenizer
        encodings = await asyncio.get_running_loop().run_in_executor(
            self._executor, lambda: backend.encode_batch([plain], add_special_tokens=False))
        return array("i", encodings[0].ids)

    def reply_text(self, token_ids: Sequence[int]) -> str:
        """``tokenizer.decode(token_ids, skip_special_tokens=True)``, from the Rust tokenizer itself
        when transformers would add nothing to it: a fifth of the cost."""
        return self._decoder.decode(token_ids, skip_special_tokens=True)

    def stats(self) -> dict[str, int]:
        return {"opening_hits": self._openings.hits, "opening_misses": self._openings.misses,
                "observation_hits": self._observations.hits, "observation_misses": self._observations.misses,
                "observations_offloaded": self.offloaded}

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
