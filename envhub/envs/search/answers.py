"""Exact-match scoring with SQuAD's answer normalisation (as Search-R1 and FlashRAG use).

Normalise: lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace.
An answer scores 1 when its normal form equals that of any golden answer.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD normal form of an answer."""
    lowered = text.lower()
    without_punctuation = "".join(char for char in lowered if char not in _PUNCTUATION)
    without_articles = _ARTICLES.sub(" ", without_punctuation)
    return " ".join(without_articles.split())


def exact_match(answer: str, golden_answers: Iterable[str]) -> bool:
    """True when `answer` normalises to the same text as any golden answer."""
    normal_answer = normalize_answer(answer)
    return any(normal_answer == normalize_answer(golden) for golden in golden_answers)
