"""search-v0 (Deep Search): Search-R1-style question answering over a local BM25 corpus.

Modules: data.py (FlashRAG JSONL), retriever.py (bm25s index, built once and shared),
answers.py (exact match), wiki_offline.py (the default offline dataset), env.py (the env),
agentgym_dialect.py (AgentGym's SearchQA server: the default dialect), fidelity.py (its fidelity cases).
"""
