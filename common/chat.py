"""Multi-turn token buffer: an episode's transcript as token ids, never re-tokenized.

The rule (docs/architecture.md, "Episode"): the first observation is rendered with the chat
template and tokenized once; each sampled turn is appended exactly as sampled; each later
observation is tokenized as the chat-template *delta* only (end-of-turn glue after the
assistant's eos, the new user turn, the generation prompt). For a ChatML template the
delta is
    "\\n<|im_start|>user\\n" + observation + "<|im_end|>\\n<|im_start|>assistant\\n".
The buffer then equals `apply_chat_template(whole_conversation, tokenize=True,
sanitize_control_tokens=True)` whenever the sampled tokens are the tokenization of the
assistant text plus eos, which the tests check.

Control tokens inside observation or system text (an env page that contains
"<|im_end|>") are encoded as plain text, as transformers' `sanitize_control_tokens` does,
so an environment cannot forge turn boundaries.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from transformers.utils.chat_template_utils import mark_control_tokens

from common.wire_checks import sampled_turns_mask

# Plain words: they survive any template and any tokenizer normalization unchanged.
_FIRST_USER_SENTINEL = "LonghorizonFirstUserSentinel"
_ASSISTANT_SENTINEL = "LonghorizonAssistantSentinel"
_NEXT_USER_SENTINEL = "LonghorizonNextUserSentinel"


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be split into per-turn deltas."""


@dataclass(frozen=True)
class ObservationDelta:
    """Template text around a later user turn, cached once per (tokenizer, system prompt)."""

    prefix: str
    """Text between the assistant's eos and the user content (ChatML: "\\n<|im_start|>user\\n")."""
    suffix: str
    """Text after the user content through the generation prompt."""
    control_tokens_re: re.Pattern
    """Matches the control tokens that must be encoded as plain text inside user content."""


def _messages(system_prompt: str | None, *turns: tuple[str, str]) -> list[dict[str, str]]:
    system = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    return system + [{"role": role, "content": content} for role, content in turns]


def _render(tokenizer, messages: list[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _control_tokens_re(tokenizer) -> re.Pattern:
    # The same control-token set apply_chat_template(sanitize_control_tokens=True) uses.
    tokens = sorted(tokenizer._get_control_tokens(tokenizer.chat_template), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, tokens)) or "(?!)")


def compute_observation_delta(tokenizer, system_prompt: str | None) -> ObservationDelta:
    """Split a dummy conversation's rendering into first turn, assistant turn and delta."""
    eos = tokenizer.eos_token
    if not tokenizer.chat_template or not eos:
        raise ChatTemplateError("tokenizer needs a chat_template and an eos_token")
    first_turn = _render(tokenizer, _messages(system_prompt, ("user", _FIRST_USER_SENTINEL)))
    whole = _render(
        tokenizer,
        _messages(
            system_prompt,
            ("user", _FIRST_USER_SENTINEL),
            ("assistant", _ASSISTANT_SENTINEL),
            ("user", _NEXT_USER_SENTINEL),
        ),
    )
    closed_assistant_turn = first_turn + _ASSISTANT_SENTINEL + eos
    if not whole.startswith(closed_assistant_turn):
        raise ChatTemplateError(
            f"chat template cannot be split into per-turn deltas: expected the rendering of "
            f"[user, assistant, user] to start with the first-turn prompt + assistant content + "
            f"eos {eos!r}, got {whole!r}"
        )
    prefix, found, suffix = whole[len(closed_assistant_turn) :].partition(_NEXT_USER_SENTINEL)
    if not found:
        raise ChatTemplateError(f"chat template alters user content; rendering: {whole!r}")
    return ObservationDelta(prefix, suffix, _control_tokens_re(tokenizer))


_DELTA_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def observation_delta(tokenizer, system_prompt: str | None) -> ObservationDelta:
    """`compute_observation_delta`, cached per tokenizer object and system prompt."""
    per_tokenizer = _DELTA_CACHE.setdefault(tokenizer, {})
    if system_prompt not in per_tokenizer:
        per_tokenizer[system_prompt] = compute_observation_delta(tokenizer, system_prompt)
    return per_tokenizer[system_prompt]


def _check_preamble(preamble: Sequence[tuple[str, str]]) -> None:
    """User and assistant turns in alternation, from a user turn, so the first observation that
    follows is a user turn after an assistant one, as every later observation is."""
    for i, (role, text) in enumerate(preamble):
        _require_text(text)
        if role != ("user", "assistant")[i % 2]:
            raise ValueError(f"preamble turn {i} is {role!r}; turns alternate user, assistant from a user turn")
    if len(preamble) % 2:
        raise ValueError("preamble must end with an assistant turn (the first observation is the next user turn)")


def check_opening(preamble: Sequence[tuple[str, str]], first_observation: str) -> None:
    """What ``ChatTokenBuffer.start`` requires of its texts (``TypeError``, ``ValueError``)."""
    _require_text(first_observation)
    _check_preamble(preamble)


def _require_text(observation: object) -> None:
    if not isinstance(observation, str):
        raise TypeError(f"observation must be str, got {type(observation).__name__}")


class ChatTokenBuffer:
    """One episode's transcript as token ids, with what the learner needs of its sampled turns.

    Call order: start(obs), then append_generated(...) and append_observation(obs) in
    alternation. `token_ids` is the transcript so far; `turn_spans` holds [start, end) of each
    sampled turn. ``as_arrays`` adds the loss mask (1 only on sampled tokens), the behavior
    logprobs (0.0 on every other token) and the versions (-1 on every other token).

    Only the ids, the spans and the sampled tokens' logprobs and versions are kept as the
    episode runs: the rest follows from the spans, and is laid out once, by ``as_arrays``.
    Extending four lists a turn, then converting them element by element, was a fifth of an
    actor's own time per turn.
    """

    def __init__(self, tokenizer, system_prompt: str | None = None):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self._delta = observation_delta(tokenizer, system_prompt)  # fails early on a bad template
        self._eos_id = tokenizer.eos_token_id  # transformers' attribute lookup costs ~4 us, every turn
        self.token_ids: list[int] = []
        self.turn_spans: list[list[int]] = []
        self._sampled_logprobs: list[float] = []
        self._sampled_versions: list[int] = []
        self._expecting = "start"

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def assistant_token_count(self) -> int:
        """Number of sampled (loss-masked) tokens."""
        return len(self._sampled_versions)

    def _require(self, step: str, caller: str) -> None:
        if self._expecting != step:
            raise RuntimeError(f"{caller}() called while the buffer expects {self._expecting}()")

    def start(self, first_observation: str, preamble: Sequence[tuple[str, str]] = (),
              token_ids: Sequence[int] | None = None) -> None:
        """Tokenize [system?, *preamble, user(first_observation)] plus the generation prompt, once.

        ``preamble``: (role, text) turns before the first observation, alternating user and
        assistant from a user turn (the env's instruction and worked examples): context, loss mask 0.
        ``token_ids``: ``opening_token_ids`` of the same arguments, worked out earlier (a cache).
        """
        self._require("start", "start")
        check_opening(preamble, first_observation)
        if token_ids is None:
            token_ids = opening_token_ids(self.tokenizer, self.system_prompt, preamble, first_observation)
        self.token_ids.extend(token_ids)
        self._expecting = "append_generated"

    def append_generated(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        version_per_token: Sequence[int],
    ) -> None:
        """Append one sampled assistant turn exactly as sampled (loss mask 1)."""
        self._require("append_generated", "append_generated")
        if not len(token_ids):
            raise ValueError("append_generated() got no tokens; end the episode instead")
        if not len(token_ids) == len(logprobs) == len(version_per_token):
            raise ValueError(
                f"token_ids, logprobs and version_per_token differ in length: "
                f"{len(token_ids)}, {len(logprobs)}, {len(version_per_token)}"
            )
        # Converted before anything is appended: a value that is no number leaves the buffer as it was.
        ids, logprobs = list(map(int, token_ids)), list(map(float, logprobs))
        versions = list(map(int, version_per_token))
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self._sampled_logprobs.extend(logprobs)
        self._sampled_versions.extend(versions)
        self.turn_spans.append([start, len(self.token_ids)])
        self._expecting = "append_observation"

    def append_observation(self, text: str, max_total_tokens: int | None = None,
                           delta_ids: Sequence[int] | None = None) -> bool:
        """Append the template delta for a new user turn; repair a length-cut turn first. With
        ``max_total_tokens``, only if the transcript then holds no more tokens than that: returns
        False, appending nothing, when it would. ``delta_ids``: ``encode_observation_delta`` of
        ``text``, worked out earlier (a cache, a worker thread)."""
        self._require("append_observation", "append_observation")
        _require_text(text)
        # Cut at max_tokens: close the turn so the transcript stays well formed.
        repair = [self._eos_id] if self.token_ids[-1] != self._eos_id else []
        if delta_ids is None:
            delta_ids = encode_observation_delta(self.tokenizer, self._delta, text)
        if max_total_tokens is not None and len(self) + len(repair) + len(delta_ids) > max_total_tokens:
            return False
        self.token_ids.extend(repair)
        self.token_ids.extend(delta_ids)
        self._expecting = "append_generated"
        return True

    def as_arrays(self) -> dict[str, np.ndarray]:
        """The transcript as numpy arrays, ready for the wire."""
        n = len(self.token_ids)
        turn_spans = np.array(self.turn_spans, dtype=np.int32).reshape(-1, 2)
        # The head's own rule (the loss mask is exactly the sampled turns), so the two agree by construction.
        sampled = sampled_turns_mask(turn_spans, n)
        # Lists are made arrays before the masked assignment and ids read with fromiter: each about
        # twice as fast as numpy's own conversion of a list (~4 us an episode of 800 tokens).
        logprobs = np.zeros(n, np.float32)
        logprobs[sampled] = np.array(self._sampled_logprobs, np.float32)
        versions = np.full(n, -1, np.int32)
        versions[sampled] = np.array(self._sampled_versions, np.int32)
        return {"token_ids": np.fromiter(self.token_ids, np.int32, n), "loss_mask": sampled.view(np.uint8),
                "logprobs": logprobs, "versions": versions, "turn_spans": turn_spans}


def opening_token_ids(tokenizer, system_prompt: str | None, preamble: Sequence[tuple[str, str]],
                      first_observation: str) -> list[int]:
    """The transcript's opening as ``ChatTokenBuffer.start`` lays it down: the chat template of
    [system?, *preamble, user(first_observation)] with the generation prompt, control tokens in the
    texts encoded as plain text. Texts holding no control-token string (nearly all) are rendered and
    go straight through the Rust tokenizer: the same ids, a third of the cost of the sanitizing path."""
    messages = _messages(system_prompt, *preamble, ("user", first_observation))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    control_tokens = observation_delta(tokenizer, system_prompt).control_tokens_re
    if backend is not None and not any(control_tokens.search(m["content"]) for m in messages):
        return backend.encode(_render(tokenizer, messages), add_special_tokens=False).ids
    return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False,
                                         sanitize_control_tokens=True)


def plain_delta_text(tokenizer, delta: ObservationDelta, text: str) -> str | None:
    """The delta's whole text when the Rust tokenizer alone encodes it as ``encode_observation_delta``
    does (no control-token string in ``text``, so nothing to sanitize); None otherwise."""
    if getattr(tokenizer, "backend_tokenizer", None) is None or delta.control_tokens_re.search(text):
        return None
    return delta.prefix + text + delta.suffix


def encode_observation_delta(tokenizer, delta: ObservationDelta, text: str) -> list[int]:
    """The delta's token ids. Text holding control-token strings (``<|im_end|>`` typed by an env)
    goes through transformers' sanitizing path, which encodes them as plain text; other text (nearly
    all) straight through the Rust tokenizer: same ids, a fraction of the cost (the sanitizing path
    was ~40 % of an actor's per-turn overhead)."""
    plain = plain_delta_text(tokenizer, delta, text)
    if plain is not None:
        return tokenizer.backend_tokenizer.encode(plain, add_special_tokens=False).ids
    marked = mark_control_tokens(text, delta.control_tokens_re)
    return tokenizer(delta.prefix + marked + delta.suffix, add_special_tokens=False,
                     sanitize_control_tokens=True)["input_ids"]
