"""A BM25 retriever (bm25s + PyStemmer) over a FlashRAG JSONL corpus, built once and shared.

The index of a corpus file is built on first use and saved under
``<cache>/search/bm25/<key>/`` (key: the file's absolute path, size and mtime), so later
processes only load it (memory-mapped). Within a process `shared_retriever` hands every
session the same instance. Building holds an fcntl lock, so concurrent envhub processes build
an index once; it is written to a temp dir and renamed into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

from common.paths import default_cache_dir
from envhub.envs.search.data import CorpusFile, Passage, scan_corpus

INDEX_FORMAT_VERSION = 1
STOPWORDS = "en"
STEMMER_LANGUAGE = "english"

_retrievers: dict[str, BM25Retriever] = {}
_retrievers_lock = threading.Lock()


def search_cache_dir() -> Path:
    """``<cache>/search``."""
    return default_cache_dir() / "search"


@contextlib.contextmanager
def build_lock(name: str) -> Iterator[None]:
    """Exclusive across processes and threads (each call opens its own lock file handle)."""
    lock_dir = search_cache_dir()
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f".{name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _tokenize(texts: list[str]) -> list[list[str]]:
    # A Stemmer per call: PyStemmer objects must not be shared between threads.
    return bm25s.tokenize(texts, stopwords=STOPWORDS, stemmer=Stemmer.Stemmer(STEMMER_LANGUAGE),
                          return_ids=False, show_progress=False)


class BM25Retriever:
    """Top-k BM25 search over one corpus file."""

    def __init__(self, index: bm25s.BM25, corpus: CorpusFile) -> None:
        self.index = index
        self.corpus = corpus

    def __len__(self) -> int:
        return len(self.corpus)

    def search(self, query: str, top_k: int) -> list[Passage]:
        """Up to `top_k` passages, best first; none when no query term occurs in the corpus."""
        query_tokens = _tokenize([query])[0]
        if not query_tokens:
            return []
        scores = np.asarray(self.index.get_scores(query_tokens))
        top_k = min(top_k, len(scores))
        candidates = np.argpartition(-scores, top_k - 1)[:top_k]
        # Ties broken by position, so a query always returns the same passages.
        ranked = sorted(candidates.tolist(), key=lambda position: (-scores[position], position))
        return self.corpus.passages([position for position in ranked if scores[position] > 0])


def _index_dir(corpus_path: Path) -> Path:
    stat = corpus_path.stat()
    fingerprint = f"{corpus_path}|{stat.st_size}|{stat.st_mtime_ns}|v{INDEX_FORMAT_VERSION}"
    return search_cache_dir() / "bm25" / hashlib.sha1(fingerprint.encode()).hexdigest()[:16]


def _build_index(corpus_path: Path, index_dir: Path) -> None:
    offsets, passages = scan_corpus(corpus_path)
    index = bm25s.BM25()
    index.index(_tokenize([f"{p.title}\n{p.text}" for p in passages]), show_progress=False)
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    temp_dir = Path(tempfile.mkdtemp(dir=index_dir.parent, prefix=".building-"))
    try:
        index.save(temp_dir)
        np.save(temp_dir / "offsets.npy", offsets)
        (temp_dir / "source.json").write_text(json.dumps({"corpus_path": str(corpus_path), "passages": len(offsets)}))
        temp_dir.chmod(0o755)  # mkdtemp makes it private; the cache is shared
        os.rename(temp_dir, index_dir)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def load_or_build_retriever(corpus_path: str | Path) -> BM25Retriever:
    """The retriever of a corpus file, building and caching its index if needed (no process cache)."""
    corpus_path = Path(corpus_path).expanduser().resolve()
    index_dir = _index_dir(corpus_path)
    if not index_dir.is_dir():
        with build_lock("bm25"):
            if not index_dir.is_dir():  # another process may have built it while we waited
                _build_index(corpus_path, index_dir)
    index = bm25s.BM25.load(index_dir, mmap=True)
    offsets = np.load(index_dir / "offsets.npy")
    if index.scores["num_docs"] != len(offsets):
        raise RuntimeError(f"index {index_dir} is inconsistent (delete it to rebuild)")
    return BM25Retriever(index, CorpusFile(corpus_path, offsets))


def shared_retriever(corpus_path: str | Path) -> BM25Retriever:
    """One retriever per corpus file and process, shared by every session (thread-safe)."""
    corpus_path = Path(corpus_path).expanduser().resolve()
    key = str(_index_dir(corpus_path))  # a changed file gets a new index, not a stale one
    with _retrievers_lock:
        if key not in _retrievers:
            _retrievers[key] = load_or_build_retriever(corpus_path)
        return _retrievers[key]
