"""Build search-v0's data ahead of serving: `python -m envhub.envs.search [CORPUS_JSONL]`.

Without an argument: the default offline dataset and its BM25 index. With one: the index of
that FlashRAG corpus (worth doing before serving a large dump, since an env reset that has to
build it would outlast the server's per-call deadline). Prints what it built and how long it took.
"""

from __future__ import annotations

import sys
import time

from envhub.envs.search.retriever import shared_retriever
from envhub.envs.search.wiki_offline import default_dataset


def main(argv: list[str]) -> None:
    started_s = time.perf_counter()
    if argv:
        corpus_path = argv[0]
    else:
        dataset = default_dataset()
        corpus_path = str(dataset.corpus_path)
        print(f"default dataset: {dataset.questions_path.parent} ({time.perf_counter() - started_s:.1f} s)")
    retriever = shared_retriever(corpus_path)
    print(f"BM25 index of {corpus_path}: {len(retriever)} passages ({time.perf_counter() - started_s:.1f} s total)")


if __name__ == "__main__":
    main(sys.argv[1:])
