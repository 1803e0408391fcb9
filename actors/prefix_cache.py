"""Finished requests' KV states keyed by their token ids, so a later prompt that extends one is
prefilled from where it left off (an episode's next turn = previous prompt + sampled tokens +
observation delta).

Bounded LRU by tokens. An entry is *taken* (removed) when reused: the request that extends it
stores a longer entry when it finishes, which supersedes the old one.

Entries are valid for one policy version only: keys and values computed with older weights
would make the new request's logprobs those of neither version, so the engine clears the
cache whenever it applies new weights (and re-prefills running requests, so what they store
when they finish comes from the new weights only).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from actors.kv_slab import RowKv


@dataclass(frozen=True)
class CachedPrefix:
    """The KV states of the first ``token_count`` tokens of some sequence."""

    token_count: int
    """Tokens whose states ``kv`` holds."""
    kv: RowKv
    """Per layer (keys, values), each (kv_heads, token_count, head_dim)."""

    def truncated(self, token_count: int) -> CachedPrefix:
        """The states of the first ``token_count`` tokens (views, no copy)."""
        return CachedPrefix(token_count, [(k[:, :token_count], v[:, :token_count]) for k, v in self.kv])


class PrefixCache:
    """LRU of token-id sequences -> their KV states, holding at most ``max_tokens`` tokens in all."""

    def __init__(self, max_tokens: int):
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self.token_count = 0
        """Tokens held now."""
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self._entries_per_length: Counter[int] = Counter()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, token_ids: Sequence[int], prefix: CachedPrefix) -> None:
        """Remember ``prefix`` as the states of ``token_ids``, evicting the least recently stored."""
        held = prefix.kv[0][0].shape[1] if prefix.kv else 0
        if not prefix.token_count == held == len(token_ids):
            raise ValueError(f"prefix says {prefix.token_count} tokens, holds {held}, key has {len(token_ids)}")
        if not token_ids or len(token_ids) > self.max_tokens:
            return
        key = tuple(token_ids)
        self._remove(key)
        self._entries[key] = prefix
        self._entries_per_length[len(key)] += 1
        self.token_count += len(key)
        while self.token_count > self.max_tokens:
            self._remove(next(iter(self._entries)))

    def take(self, prompt_token_ids: Sequence[int]) -> CachedPrefix | None:
        """Remove and return the longest entry whose tokens start ``prompt_token_ids``.

        At most ``len(prompt) - 1`` tokens are reused: the last prompt token must run through
        the model to give the first sampled token's logits.
        """
        prompt = tuple(prompt_token_ids)
        for length in sorted(self._entries_per_length, reverse=True):
            if length > len(prompt):
                continue
            key = prompt[:length]
            if key in self._entries:
                prefix = self._entries[key]
                self._remove(key)
                if length == len(prompt):
                    return prefix.truncated(length - 1) if length > 1 else None
                return prefix
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._entries_per_length.clear()
        self.token_count = 0

    def _remove(self, key: tuple[int, ...]) -> None:
        if self._entries.pop(key, None) is None:
            return
        self.token_count -= len(key)
        self._entries_per_length[len(key)] -= 1
        if self._entries_per_length[len(key)] == 0:
            del self._entries_per_length[len(key)]
