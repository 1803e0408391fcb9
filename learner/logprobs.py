"""Token logprobs and entropy of a causal LM at the loss positions, through the LM head in chunks.

The plain path (``learner.losses.token_logprobs``) turns B x T hidden states into [B, T, V]
logits, then float32 copies for log-softmax and entropy: at 16k tokens and a 152k vocabulary each
copy is 10 GB, and several are alive at once. Here (``learner.logprob_chunk_tokens`` > 0):

1. the model runs as usual, except that its LM head, for this call only, receives the final
   hidden states and keeps those of positions whose *next* token is in the loss mask;
2. the head's weight is applied to ``chunk_tokens`` of them at a time, in float32 (hidden states
   and weight upcast first: under bfloat16 compute a bfloat16 matmul would round every logit to
   8 bits, noise of about 1e-2 in each logprob), divided by the temperature, log-softmaxed,
   the sampled token's logprob gathered (and the entropy taken), then freed;
3. with gradients, each chunk is checkpointed: its backward recomputes its logits, so only one
   chunk's [C, V] float32 tensors are alive at a time (two in forward, about four in its
   backward). The gradient is the exact one of the plain path (autograd of the same operations).

The head runs inside the model's forward, so FSDP2 gathers and reduces its weight as it always
does. Only models whose logits are exactly ``lm_head(hidden)`` qualify (Llama, Qwen2/3, SmolLM2);
one that rescales or soft-caps logits after the head is refused: use ``logprob_chunk_tokens: 0``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from learner.losses import entropy_from_logits, token_logprobs

EntropyMode = Literal["grad", "metric", "none"]
"""The entropy of a chunk: with a gradient (the entropy bonus), without one (a metric), or not at all."""


def sequence_logprobs(model: torch.nn.Module, token_ids: torch.Tensor, attention_mask: torch.Tensor,
                      loss_mask: torch.Tensor, temperature: float, chunk_tokens: int,
                      entropy_grad: bool = False, with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, entropy), [B, T] float32, aligned like ``token_logprobs`` (position ``t`` is
    token ``t`` as predicted from position ``t - 1``).

    ``chunk_tokens`` > 0: computed only where ``loss_mask`` is nonzero, 0 elsewhere. 0: the plain
    full-logits path, values everywhere. The entropy carries a gradient only with
    ``entropy_grad`` (the entropy bonus is on); else it is computed without one, as a metric, in
    the same pass over each chunk; ``with_entropy=False`` skips it (zeros; chunked path only).
    """
    if chunk_tokens <= 0:
        head = model.get_output_embeddings()
        float_head = (lambda hidden: F.linear(hidden.float(), head.weight.float(), _float(head.bias))) \
            if isinstance(head, torch.nn.Linear) else None  # float32 logits under bfloat16 compute too
        with _head_forward(head, float_head):
            logits = model(input_ids=token_ids, attention_mask=attention_mask, use_cache=False).logits
        entropy = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature)
        return token_logprobs(logits, token_ids, temperature), entropy
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    _check_plain_head(model)
    # Position t - 1 predicts token t: the hidden states to keep are those before a loss token.
    predicts = F.pad(loss_mask[:, 1:].bool(), (0, 1), value=False)
    rows, columns = torch.nonzero(predicts, as_tuple=True)
    targets = token_ids[rows, columns + 1]
    head = model.get_output_embeddings()

    def logprobs_at_loss_positions(hidden: torch.Tensor) -> torch.Tensor:
        # One float32 copy of the weight for all chunks: its gradient also accumulates in float32.
        entropy_mode = "grad" if entropy_grad else "metric" if with_entropy else "none"
        picked, entropy = _chunked_head(hidden[rows, columns].float(), head.weight.float(), _float(head.bias),
                                        targets, temperature, chunk_tokens, entropy_mode)
        if picked.numel() == 0 and torch.is_grad_enabled():
            # Nothing to score, but the backward must still pass every layer: FSDP's collectives
            # are made in backward, and every rank must make them (a rank's stand-in micro-batch).
            picked = picked + 0.0 * (hidden.sum() + head.weight.sum())
        zeros = hidden.new_zeros(loss_mask.shape, dtype=torch.float32)
        at = (rows, columns + 1)
        return torch.stack([zeros.index_put(at, picked), zeros.index_put(at, entropy)])

    with _head_forward(head, logprobs_at_loss_positions):  # the model's output is ours
        both = model(input_ids=token_ids, attention_mask=attention_mask, use_cache=False).logits
    return both[0], both[1] if entropy_grad else both[1].detach()


@contextlib.contextmanager
def _head_forward(head: torch.nn.Module, forward) -> Iterator[None]:
    """The LM head runs ``forward`` for one model call (None: its own); FSDP2 still gathers and
    reduces its weight, since the head module itself is unchanged."""
    if forward is not None:
        head.forward = forward
    try:
        yield
    finally:
        head.__dict__.pop("forward", None)


def _chunked_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                  temperature: float, chunk_tokens: int, entropy: EntropyMode) -> tuple[torch.Tensor, torch.Tensor]:
    """[N] logprobs of ``targets`` and [N] entropies under ``softmax((hidden @ weight.T + bias) / T)``."""
    picked, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        chunk = (hidden[start:start + chunk_tokens], weight, bias, targets[start:start + chunk_tokens],
                 temperature, entropy)
        if torch.is_grad_enabled():
            chunk_logprobs, chunk_entropy = checkpoint(_head_chunk, *chunk, use_reentrant=False,
                                                       preserve_rng_state=False)
        else:
            chunk_logprobs, chunk_entropy = _head_chunk(*chunk)
        picked.append(chunk_logprobs)
        entropies.append(chunk_entropy)
    if not picked:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty
    return torch.cat(picked), torch.cat(entropies)


def _head_chunk(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                temperature: float, entropy: EntropyMode) -> tuple[torch.Tensor, torch.Tensor]:
    # In place where autograd allows it (linear and the float32 cast keep no output for backward):
    # a chunk then holds two [C, V] float32 tensors at its peak, not four.
    logits = F.linear(hidden, weight, bias).float()
    if temperature != 1.0:
        logits = logits.div_(temperature)
    log_probs = F.log_softmax(logits, dim=-1)
    del logits
    picked = log_probs.gather(-1, targets[:, None]).squeeze(-1)
    if entropy == "grad" and torch.is_grad_enabled():
        return picked, -(log_probs.exp() * log_probs).sum(dim=-1)
    with torch.no_grad():
        if entropy == "metric":
            return picked, -log_probs.exp().mul_(log_probs).sum(dim=-1)
        return picked, torch.zeros_like(picked)


def _float(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.float()


def _check_plain_head(model: torch.nn.Module) -> None:
    config = getattr(model, "config", None)
    rescaled = [name for name in ("final_logit_softcapping", "logit_scale", "logits_scaling")
                if getattr(config, name, None) not in (None, 1, 1.0)]
    head = model.get_output_embeddings()
    if rescaled or not isinstance(head, torch.nn.Linear):
        raise ValueError(f"{type(model).__name__} does more than one linear LM head to make its logits "
                         f"({', '.join(rescaled) or type(head).__name__}): set learner.logprob_chunk_tokens 0")
