"""One recorded episode as the viewer shows it: turns of env tokens and action tokens, with text.

A ``Trajectory`` carries tokens only (text is never re-tokenized on the way, docs/architecture.md).
Its ``turn_spans`` are the ``[start, end)`` of each sampled assistant turn (loss mask 1); the
tokens before a span are what the environment and the chat template put in front of that turn
(the first observation with the system prompt, then each observation as a template delta), and
anything after the last span is the tail. Action text is decoded as the actor decoded it for the
env (special tokens dropped, stripped); env text keeps the template's special tokens, since
that is what the model read. Only the episode's final reward is recorded, so it sits on the
last turn, where the learner puts the outcome reward too.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from common.protocol import TrainedSample, Trajectory


class TokenText:
    """Decodes token ids with one tokenizer, caching the text of each single token."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._pieces: dict[int, str] = {}

    def pieces(self, token_ids: list[int]) -> list[str]:
        missing = [t for t in set(token_ids) if t not in self._pieces]
        for token_id, piece in zip(missing, self.tokenizer.batch_decode([[t] for t in missing])):
            self._pieces[token_id] = piece
        return [self._pieces[t] for t in token_ids]

    def text(self, token_ids: list[int], skip_special_tokens: bool) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)


def split_turns(num_tokens: int, turn_spans: np.ndarray) -> tuple[list[tuple[range, range]], range]:
    """Per turn ``(env tokens before it, its action tokens)``, and the env tokens after the last turn."""
    turns, previous_end = [], 0
    for start, end in np.asarray(turn_spans).reshape(-1, 2).tolist():
        turns.append((range(previous_end, start), range(start, end)))
        previous_end = end
    return turns, range(previous_end, num_tokens)


def per_token_advantages(episode: Trajectory, trained: TrainedSample | None) -> np.ndarray | None:
    """The trained advantage at every token position (NaN off the loss mask); None if untrained."""
    sampled = episode.loss_mask.astype(bool)
    if trained is None or len(trained.token_advantages) != int(sampled.sum()):
        return None
    out = np.full(len(episode.token_ids), np.nan, dtype=np.float32)
    out[sampled] = trained.token_advantages
    return out


def _floats(values: np.ndarray) -> list[float | None]:
    return [None if math.isnan(v) else round(v, 6) for v in values.astype(float).tolist()]


def token_block(episode: Trajectory, where: range, advantages: np.ndarray | None,
                decoder: TokenText | None, skip_special_tokens: bool) -> dict[str, Any]:
    """Text and per-token columns of the tokens at ``where``."""
    ids = episode.token_ids[where.start:where.stop].tolist()
    if decoder is not None:
        text = decoder.text(ids, skip_special_tokens)
        pieces = decoder.pieces(ids)
    else:
        text, pieces = " ".join(map(str, ids)), [f"[{t}]" for t in ids]
    return {
        "start": where.start, "text": text.strip() if skip_special_tokens else text, "ids": ids, "pieces": pieces,
        "loss_mask": episode.loss_mask[where.start:where.stop].tolist(),
        "versions": episode.token_versions[where.start:where.stop].tolist(),
        "logprobs": _floats(episode.behavior_logprobs[where.start:where.stop]),
        "advantages": _floats(advantages[where.start:where.stop]) if advantages is not None else None,
    }


def describe_turns(episode: Trajectory, trained: TrainedSample | None,
                   decoder: TokenText | None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The turns of ``episode`` and its tail (None when empty), ready for JSON."""
    advantages = per_token_advantages(episode, trained)
    spans, tail = split_turns(len(episode.token_ids), episode.turn_spans)
    turns = []
    for number, (before, action) in enumerate(spans, start=1):
        versions = episode.token_versions[action.start:action.stop]
        turn_advantages = advantages[action.start:action.stop] if advantages is not None else None
        turns.append({
            "turn": number,
            "observation": token_block(episode, before, advantages, decoder, skip_special_tokens=False),
            "action": token_block(episode, action, advantages, decoder, skip_special_tokens=True),
            "policy_versions": [int(versions.min()), int(versions.max())] if versions.size else None,
            "advantage": float(turn_advantages.mean()) if turn_advantages is not None and turn_advantages.size
            else None,
            "reward": episode.reward if number == len(spans) else None,
        })
    tail_block = token_block(episode, tail, advantages, decoder, skip_special_tokens=False) if len(tail) else None
    return turns, tail_block
