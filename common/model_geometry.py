"""Sizes that follow from a Llama/Qwen2-style ``config.json`` alone: parameter counts and KV bytes.

The launcher's memory estimate and the actor's prefix-cache budget both need them, so they live
here, below every role, rather than in either.
"""

from __future__ import annotations


def _attention_shape(model: dict) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim); ``None`` or absent keys take the usual defaults."""
    heads = model["num_attention_heads"]
    return heads, model.get("num_key_value_heads") or heads, model.get("head_dim") or model["hidden_size"] // heads


def parameter_counts(model: dict) -> tuple[int, int]:
    """(all parameters, those of one decoder layer)."""
    hidden, layers = model["hidden_size"], model["num_hidden_layers"]
    heads, kv_heads, head_dim = _attention_shape(model)
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    layer = attention + 3 * hidden * model["intermediate_size"]
    embeddings = model["vocab_size"] * hidden * (1 if model.get("tie_word_embeddings") else 2)
    return embeddings + layers * layer, layer


def kv_bytes_per_token(model: dict, dtype_bytes: int) -> int:
    """Bytes of KV cache one token holds: keys and values of every layer's KV heads."""
    _, kv_heads, head_dim = _attention_shape(model)
    return 2 * model["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes
