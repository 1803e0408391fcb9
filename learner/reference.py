"""The frozen reference policy for the KL penalty: a copy of the initial policy.

Built only when ``learner.algorithm.kl_coef > 0``. Loaded from the policy's original path (so a
resumed run still measures the KL to the *initial* policy), sharded with FSDP2 like the policy,
in eval mode with every parameter frozen; its logprobs are always computed without gradients.
"""

from __future__ import annotations

import torch

from learner.logprobs import sequence_logprobs
from learner.model import load_sharded_model


def load_reference_model(path: str, dtype: str, mixed_precision: bool = False) -> torch.nn.Module:
    """The HF model at ``path``, sharded, frozen and in eval mode; computing in the same precision
    as the policy, so the KL starts at exactly 0."""
    model = load_sharded_model(path, dtype, mixed_precision=mixed_precision, frozen=True)
    model.requires_grad_(False)
    return model.eval()


@torch.no_grad()
def reference_logprobs(
    model: torch.nn.Module, token_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float,
    loss_mask: torch.Tensor, chunk_tokens: int,
) -> torch.Tensor:
    """[B, T] float32 logprobs of ``token_ids`` under the reference, at the sampling temperature,
    computed as the policy's are (``learner/logprobs.py``; 0 off ``loss_mask`` when chunked)."""
    return sequence_logprobs(model, token_ids, attention_mask, loss_mask, temperature, chunk_tokens,
                             with_entropy=False)[0]
