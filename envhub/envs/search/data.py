"""FlashRAG-layout JSONL: question sets and passage corpora.

Questions, one JSON object a line: ``{"id", "question", "golden_answers": [str, ...]}`` (an
optional ``metadata`` object is kept). Corpus rows come in either of FlashRAG's layouts:
``{"id", "title", "text"}`` or ``{"id", "contents"}`` with ``contents = title + "\\n" + text``
(wiki dumps often quote the title: ``"\\"Title\\"\\ntext"``; the quotes are dropped).

A corpus is read through byte offsets (`CorpusFile`), so a multi-GB Wikipedia dump is never
held in memory once its index exists: a lookup seeks to the passage's line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


class DataFormatError(ValueError):
    """A question or corpus file does not follow the FlashRAG JSONL layout."""


@dataclass(frozen=True)
class Question:
    """One question of a FlashRAG question set."""

    id: str
    """The row's ``id`` (its line number when the row has none)."""

    question: str
    """Question text shown to the agent."""

    golden_answers: tuple[str, ...]
    """Accepted answers; exact match against any of them wins."""

    metadata: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """Free-form extras from the file (the default set records its source article here)."""


@dataclass(frozen=True)
class Passage:
    """One retrievable passage of a corpus."""

    doc_id: str
    """The row's ``id``."""

    title: str
    """Title of the article the passage belongs to (may be empty)."""

    text: str
    """Passage body, without the title."""

    heading: str | None = field(default=None, compare=False)
    """The first line of a ``contents`` row as written (quotes kept; AgentGym shows it as the
    title); None for a ``title``/``text`` row."""

    def clipped_text(self, max_chars: int | None) -> str:
        """The body, cut at ``max_chars`` (marked " ..."); whole when None."""
        if max_chars is None or len(self.text) <= max_chars:
            return self.text
        return self.text[:max_chars].rstrip() + " ..."


def _json_rows(path: Path) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """(line number, byte offset, object) for every non-blank line of a JSONL file."""
    offset = 0
    with path.open("rb") as lines:
        for line_number, raw_line in enumerate(lines, start=1):
            line_offset, offset = offset, offset + len(raw_line)
            if not raw_line.strip():
                continue
            try:
                row = json.loads(raw_line)
            except json.JSONDecodeError as error:
                raise DataFormatError(f"{path}:{line_number}: not valid JSON ({error.msg})") from None
            if not isinstance(row, dict):
                raise DataFormatError(f"{path}:{line_number}: each line must be a JSON object")
            yield line_number, line_offset, row


def load_questions(path: str | Path) -> list[Question]:
    """Every question of a FlashRAG JSONL question set, in file order."""
    path = Path(path)
    questions = [_parse_question(row, f"{path}:{line}") for line, _, row in _json_rows(path)]
    if not questions:
        raise DataFormatError(f"{path}: holds no questions")
    return questions


def _parse_question(row: dict[str, Any], where: str) -> Question:
    text = row.get("question")
    if not isinstance(text, str) or not text.strip():
        raise DataFormatError(f"{where}: 'question' must be a non-empty string")
    answers = row.get("golden_answers")
    if not (isinstance(answers, list) and answers and all(isinstance(a, str) and a.strip() for a in answers)):
        raise DataFormatError(f"{where}: 'golden_answers' must be a non-empty list of non-empty strings, "
                              f"got {answers!r}")
    metadata = row.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise DataFormatError(f"{where}: 'metadata' must be an object")
    row_id = row.get("id", where.rsplit(":", 1)[-1])
    return Question(str(row_id), text.strip(), tuple(a.strip() for a in answers), metadata)


def parse_passage(row: dict[str, Any], where: str) -> Passage:
    """A corpus row in either FlashRAG layout as a `Passage`."""
    if "id" not in row:
        raise DataFormatError(f"{where}: a corpus row needs an 'id'")
    if isinstance(row.get("text"), str):
        title = row.get("title", "")
        if not isinstance(title, str):
            raise DataFormatError(f"{where}: 'title' must be a string")
        return Passage(str(row["id"]), title.strip(), row["text"].strip())
    if isinstance(row.get("contents"), str):
        heading, _, text = row["contents"].partition("\n")
        title = heading.strip()
        if len(title) >= 2 and title[0] == title[-1] == '"':
            title = title[1:-1]
        return Passage(str(row["id"]), title, text.strip(), heading)
    raise DataFormatError(f"{where}: a corpus row needs 'text' (with an optional 'title') or 'contents'")


def scan_corpus(path: str | Path) -> tuple[np.ndarray, list[Passage]]:
    """Byte offsets of the passage lines and the passages themselves, for indexing."""
    path = Path(path)
    offsets: list[int] = []
    passages: list[Passage] = []
    for line, offset, row in _json_rows(path):
        passages.append(parse_passage(row, f"{path}:{line}"))
        offsets.append(offset)
    if not passages:
        raise DataFormatError(f"{path}: holds no passages")
    return np.asarray(offsets, dtype=np.int64), passages


class CorpusFile:
    """Random access to the passages of a JSONL corpus by position, through byte offsets."""

    def __init__(self, path: str | Path, offsets: np.ndarray) -> None:
        self.path = Path(path)
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets)

    def passages(self, positions: list[int]) -> list[Passage]:
        """The passages at `positions` (0-based rows of the corpus), in that order."""
        found = []
        with self.path.open("rb") as corpus:  # one handle per call: safe from many threads
            for position in positions:
                corpus.seek(int(self.offsets[position]))
                row = json.loads(corpus.readline())
                found.append(parse_passage(row, f"{self.path} (passage {position})"))
        return found
