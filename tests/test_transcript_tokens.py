"""TranscriptTokens: remembered and off-the-loop tokenization gives exactly the ids the transcript
would work out itself, repeats cost no tokenizer call, and a long observation never stops the
actor's event loop while it is tokenized."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from actors.transcript_tokens import MAX_CACHED_CHARS, TranscriptTokens
from common.chat import ChatTokenBuffer
from tests.test_chat import OBSERVATIONS, PREAMBLE, REPLIES, TRICKY_OBSERVATIONS, sampled_turn, template_ids

WEB_PAGE = "\n".join(f"[{i}] link 'Product {i}: stainless kettle, 1.7 l' <|im_end|>" if i == 7 else
                     f"[{i}] link 'Product {i}: stainless kettle, 1.7 l, héllo 日本語'" for i in range(400))
"""A long observation (about 20 kB) with a control-token string inside: sanitized, so inline."""
LONG_PLAIN = WEB_PAGE.replace("<|im_end|>", "end")
"""The same page without it: tokenized on a worker thread."""


def transcript(tokenizer, system_prompt, observations, tokens: TranscriptTokens | None) -> ChatTokenBuffer:
    """An episode's transcript, its ids from ``tokens`` when given, else worked out by the buffer."""
    buffer = ChatTokenBuffer(tokenizer, system_prompt)
    opening = tokens.opening_ids(PREAMBLE, observations[0]) if tokens else None
    buffer.start(observations[0], PREAMBLE, opening)
    for turn, (reply, observation) in enumerate(zip(REPLIES * 4, observations[1:])):
        token_ids = sampled_turn(tokenizer, reply, cut=turn == 1)
        buffer.append_generated(token_ids, [-1.0] * len(token_ids), [0] * len(token_ids))
        delta = asyncio.run(tokens.delta_ids(observation)) if tokens else None
        buffer.append_observation(observation, None, delta)
    return buffer


@pytest.mark.parametrize("system_prompt", [None, "You are an agent in a text game."])
def test_the_ids_are_the_transcripts_own(tokenizer, system_prompt):
    observations = OBSERVATIONS + TRICKY_OBSERVATIONS + [WEB_PAGE, LONG_PLAIN, OBSERVATIONS[1], LONG_PLAIN]
    tokens = TranscriptTokens(tokenizer, system_prompt, offload_min_chars=1024)
    try:
        with_tokens = transcript(tokenizer, system_prompt, observations, tokens)
        again = transcript(tokenizer, system_prompt, observations, tokens)  # every text now remembered
    finally:
        tokens.close()
    plain = transcript(tokenizer, system_prompt, observations, None)

    assert with_tokens.token_ids == plain.token_ids == again.token_ids
    assert with_tokens.turn_spans == plain.turn_spans
    for name, array in with_tokens.as_arrays().items():
        np.testing.assert_array_equal(array, plain.as_arrays()[name])
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
        [{"role": role, "content": text} for role, text in PREAMBLE] + [{"role": "user", "content": observations[0]}]
    assert with_tokens.token_ids[:len(template_ids(tokenizer, messages, sanitize_control_tokens=True))] == \
        template_ids(tokenizer, messages, sanitize_control_tokens=True)
    stats = tokens.stats()
    assert stats["opening_misses"] == 1 and stats["opening_hits"] == 1
    later = observations[1:] * 2  # both episodes' later observations, in order
    remembered = [text for text in later if len(text) <= MAX_CACHED_CHARS]  # web pages are not
    assert stats["observation_hits"] == len(remembered) - len(set(remembered))
    assert stats["observations_offloaded"] == later.count(LONG_PLAIN), \
        "only a long text without control tokens leaves the loop"


def test_a_repeat_is_remembered_and_the_memory_is_bounded(tokenizer):
    tokens = TranscriptTokens(tokenizer, None, cache_entries=2)
    first = asyncio.run(tokens.delta_ids("You take the key."))
    assert asyncio.run(tokens.delta_ids("You take the key.")) is first
    asyncio.run(tokens.delta_ids("The door opens."))
    asyncio.run(tokens.delta_ids("Nothing happens."))  # a third text: the least recently used goes
    again = asyncio.run(tokens.delta_ids("You take the key."))

    assert again == first and again is not first
    assert tokens.stats()["observation_hits"] == 1 and tokens.stats()["observation_misses"] == 4


def test_a_long_observation_leaves_the_event_loop_free(tokenizer):
    """While a 20 kB page is tokenized, other episodes' coroutines go on running."""
    tokens = TranscriptTokens(tokenizer, None)

    async def tokenize_while_ticking() -> tuple[Sequence[int], int]:
        ticks, done = 0, asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0)

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ticks_before = ticks
        ids = await tokens.delta_ids(LONG_PLAIN * 4)
        done.set()
        await ticking
        return ids, ticks - ticks_before

    try:
        ids, ticks = asyncio.run(tokenize_while_ticking())
    finally:
        tokens.close()
    buffer = ChatTokenBuffer(tokenizer, None)
    assert list(ids) == buffer_delta(buffer, LONG_PLAIN * 4)
    assert tokens.stats()["observations_offloaded"] == 1
    assert ticks > 0, "the event loop stood still while the page was tokenized"


def buffer_delta(buffer: ChatTokenBuffer, text: str) -> list[int]:
    buffer.start("hello")
    buffer.append_generated([buffer.tokenizer.eos_token_id], [0.0], [0])
    before = len(buffer)
    buffer.append_observation(text)
    return buffer.token_ids[before:]


def test_reply_text_is_the_tokenizers_decoding(tokenizer):
    tokens = TranscriptTokens(tokenizer, None)
    for text in ["Action: go north", "Thought: héllo 日本語 🙂\nAction: craft 1 stick"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert tokens.reply_text(ids) == tokenizer.decode(ids, skip_special_tokens=True)
