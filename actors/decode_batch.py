"""The CPU engine's continuous batch: rows that decode together, and how newcomers join.

1. ``prefill`` runs a group of newcomers through the model in one forward pass: each row's
   cached prefix (if any) is written into a fresh ``KvSlab`` first, then only the rest of its
   context is fed, left-padded to the group's widest; position ids continue from the prefix.
   A new request's first token is sampled; a running request re-prefilled after a weight
   change (context = prompt + sampled tokens but the last) samples nothing. The rows' KV
   states are returned.
2. ``DecodeBatch.admit`` writes those states into a free row of the running batch.
3. ``DecodeBatch.decode_step`` feeds every row its last sampled token and samples the next.
4. ``DecodeBatch.pop_finished`` frees rows that sampled a stop token, reached
   ``max_new_tokens`` or were cancelled; newcomers reuse free rows, trailing ones are dropped,
   leading columns no live row uses leave the attention window, and the rows are compacted
   when free ones outnumber the live.

Every sampled token records log softmax(logits / temperature) in fp32 and the policy version
of the weights that produced its logits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch

from actors.engine_api import SamplingParams
from actors.kv_slab import KvSlab, RowKv
from actors.prefix_cache import CachedPrefix

_PAD_TOKEN_ID = 0
"""Any valid id: padded positions are masked out of attention."""
_MAX_PADDING_RATIO = 2.0
"""A prefill group's padded tokens may be at most this many times its real tokens."""
_MAX_PREFILL_TOKENS = 16384
"""Padded input tokens of one prefill forward pass (bounds its activation memory)."""
_MIN_FREE_ROWS_TO_COMPACT = 4
"""Free rows between live ones compute idly until reused; compact when more than this and than the live."""


@dataclass(eq=False)
class EngineRequest:
    """One generate() call in flight; its output lists grow as the worker decodes."""

    prompt_token_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    cancelled: bool = False
    """Set on the event loop when the awaiting task is cancelled; the worker drops the row."""

    @property
    def kv_token_count(self) -> int:
        """Tokens whose states are cached: all but the last sampled one, not yet fed back."""
        return len(self.prompt_token_ids) + len(self.token_ids) - 1

    def context_token_ids(self) -> list[int]:
        """The tokens whose states a prefill computes: the prompt, then all sampled tokens but the last."""
        return self.prompt_token_ids + self.token_ids[:-1]

    def record(self, token_id: int, logprob: float, version: int) -> None:
        self.token_ids.append(token_id)
        self.logprobs.append(logprob)
        self.versions.append(version)

    def finish_reason(self) -> str | None:
        if self.token_ids and self.token_ids[-1] in self.params.stop_token_ids:
            return "stop"
        if len(self.token_ids) >= self.params.max_new_tokens:
            return "length"
        return None


@dataclass
class Newcomer:
    """A request about to be prefilled, with the cached states of its prompt's start, if any."""

    request: EngineRequest
    prefix: CachedPrefix | None

    @property
    def reused_token_count(self) -> int:
        return self.prefix.token_count if self.prefix is not None else 0

    @property
    def suffix(self) -> list[int]:
        """The context tokens that must run through the model."""
        return self.request.context_token_ids()[self.reused_token_count :]


def sample_tokens(logits: torch.Tensor, temperatures: list[float], generator: torch.Generator,
                  greedy: list[bool] | None = None) -> tuple[list[int], list[float]]:
    """Sample one token per row of fp32 ``logits`` (the argmax on ``greedy`` rows); return the ids
    and their tempered logprobs.

    Inverse-CDF sampling (one uniform per row against the float64 cumulative probabilities)
    instead of ``torch.multinomial``, which is ~20x slower on CPU (64 rows x 49k vocab: 64 ms
    against 4 ms). A zero-probability token is never drawn: its CDF step is empty.
    """
    temperature_column = torch.tensor(temperatures, dtype=torch.float32)[:, None]
    logprobs = torch.log_softmax(logits / temperature_column, dim=-1)
    cdf = logprobs.exp().to(torch.float64).cumsum_(dim=-1)
    uniform = torch.rand(cdf.shape[0], 1, generator=generator, dtype=torch.float64) * cdf[:, -1:]
    token_ids = torch.searchsorted(cdf, uniform, right=True).clamp_(max=cdf.shape[1] - 1)
    if greedy is not None and any(greedy):
        rows = torch.tensor(greedy)
        token_ids[rows] = logits[rows].argmax(dim=-1, keepdim=True)
    return token_ids.squeeze(1).tolist(), logprobs.gather(1, token_ids).squeeze(1).tolist()


def prefill_width(tokens: int) -> int:
    """The width a prefill of ``tokens`` runs at: a multiple of 16 up to 128, beyond that one of 8
    steps per doubling (at most 1/8 padding). On CPU, bfloat16 matmuls (oneDNN) keep ~2 MB of
    SmolLM2's for good for every new row count they meet: 400 prefills of free widths grew an
    engine by 940 MB and rising, of rounded widths by 290 MB, all of it in the first 100 (README,
    "Memory over a run")."""
    if tokens <= 128:
        return -(-tokens // 16) * 16
    step = 1 << (tokens.bit_length() - 4)
    return -(-tokens // step) * step


def prefill_groups(newcomers: list[Newcomer]) -> list[list[Newcomer]]:
    """Split newcomers into forward passes of similar width, so padding stays bounded."""
    ordered = sorted(newcomers, key=lambda n: len(n.suffix), reverse=True)
    groups: list[list[Newcomer]] = []
    real_tokens = width = 0
    for newcomer in ordered:
        tokens = len(newcomer.suffix)
        padded = (len(groups[-1]) + 1) * width if groups else 0
        if groups and padded <= _MAX_PADDING_RATIO * (real_tokens + tokens) and padded <= _MAX_PREFILL_TOKENS:
            groups[-1].append(newcomer)
            real_tokens += tokens
        else:
            groups.append([newcomer])
            real_tokens = width = tokens
    return groups


@torch.inference_mode()
def prefill(model: torch.nn.Module, newcomers: list[Newcomer], version: int,
            generator: torch.Generator) -> list[RowKv]:
    """Run the newcomers' uncached tokens, sample new requests' first token, return the rows' states."""
    width = prefill_width(max(len(n.suffix) for n in newcomers))  # left-padded, masked
    longest_prefix = max(n.reused_token_count for n in newcomers)
    slab = KvSlab(model.config.num_hidden_layers, len(newcomers), longest_prefix + width)
    slab.set_num_rows(len(newcomers))
    slab.start_at(longest_prefix)
    for row, newcomer in enumerate(newcomers):
        if newcomer.prefix is not None:
            slab.write_row(row, newcomer.prefix.kv)
    input_ids = torch.full((len(newcomers), width), _PAD_TOKEN_ID, dtype=torch.long)
    input_mask = torch.zeros((len(newcomers), width), dtype=torch.bool)
    position_ids = torch.zeros((len(newcomers), width), dtype=torch.long)
    for row, newcomer in enumerate(newcomers):
        suffix, start = newcomer.suffix, newcomer.reused_token_count
        input_ids[row, width - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
        input_mask[row, width - len(suffix) :] = True
        position_ids[row, width - len(suffix) :] = torch.arange(start, start + len(suffix))
    logits = slab.forward(model, input_ids, input_mask, position_ids)
    fresh = [row for row, n in enumerate(newcomers) if not n.request.token_ids]
    if fresh:
        requests = [newcomers[row].request for row in fresh]
        temperatures = [r.params.temperature for r in requests]
        token_ids, logprobs = sample_tokens(logits[torch.tensor(fresh)], temperatures, generator,
                                            [r.params.greedy for r in requests])
        for request, token_id, logprob in zip(requests, token_ids, logprobs):
            request.record(token_id, logprob, version)
    return [slab.row_kv(row) for row in range(len(newcomers))]


class DecodeBatch:
    """Running requests, one slab row each; rows join and leave between decode steps."""

    def __init__(self, model: torch.nn.Module, generator: torch.Generator):
        self._model, self._generator = model, generator
        self._slab = KvSlab(model.config.num_hidden_layers)
        self._rows: list[EngineRequest | None] = []

    def __len__(self) -> int:
        return sum(request is not None for request in self._rows)

    @property
    def requests(self) -> list[EngineRequest]:
        return [request for request in self._rows if request is not None]

    def admit(self, request: EngineRequest, kv: RowKv) -> None:
        """Join the batch in the first free row; ``kv`` holds the states of all but the last sampled token."""
        row = next((i for i, r in enumerate(self._rows) if r is None), len(self._rows))
        if row == len(self._rows):
            self._rows.append(None)
        self._slab.write_row(row, kv)
        self._rows[row] = request

    @torch.inference_mode()
    def decode_step(self, version: int) -> None:
        """Feed every row its last sampled token; sample the next one (free rows compute idly)."""
        rows = self._rows
        input_ids = torch.tensor([[r.token_ids[-1] if r is not None else _PAD_TOKEN_ID] for r in rows])
        position_ids = torch.tensor([[r.kv_token_count if r is not None else 0] for r in rows])
        input_mask = torch.ones((len(rows), 1), dtype=torch.bool)
        logits = self._slab.forward(self._model, input_ids, input_mask, position_ids)
        live = [i for i, r in enumerate(rows) if r is not None]
        if len(live) < len(rows):
            logits = logits[torch.tensor(live)]
        requests = [rows[i] for i in live]
        token_ids, logprobs = sample_tokens(logits, [r.params.temperature for r in requests], self._generator,
                                            [r.params.greedy for r in requests])
        for request, token_id, logprob in zip(requests, token_ids, logprobs):
            request.record(token_id, logprob, version)

    def pop_finished(self, keep_states: bool) -> list[tuple[EngineRequest, str, RowKv | None]]:
        """Free finished and cancelled rows; return the finished ones, with their states if asked."""
        finished = []
        for row, request in enumerate(self._rows):
            if request is None:
                continue
            reason = request.finish_reason()
            if reason is not None:
                finished.append((request, reason, self._slab.row_kv(row) if keep_states else None))
            if reason is not None or request.cancelled:
                self._slab.clear_row(row)
                self._rows[row] = None
        self._tidy()
        return finished

    def drop_all(self) -> list[EngineRequest]:
        """Empty the batch and return the requests it held (they fail, or are re-prefilled after new weights)."""
        requests = self.requests
        self._rows = []
        self._slab = KvSlab(self._model.config.num_hidden_layers)
        return requests

    def _tidy(self) -> None:
        while self._rows and self._rows[-1] is None:
            self._rows.pop()
        self._slab.set_num_rows(len(self._rows))
        live = [i for i, r in enumerate(self._rows) if r is not None]
        self._slab.trim(max((self._rows[i].kv_token_count for i in live), default=0))
        if len(self._rows) - len(live) > max(_MIN_FREE_ROWS_TO_COMPACT, len(live)):
            self._slab.compact(live)
            self._rows = [self._rows[i] for i in live]
