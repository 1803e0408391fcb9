"""The critic for GAE (PPO with a value model): the policy's backbone plus a linear value head.

Built only for an estimator registered with ``critic=True`` (``gae``; ``learner/advantages.py``),
trained with ``learner.algorithm.critic_lr`` (``advantage: gae``). It starts from the same pretrained
weights as the policy (``AutoModel`` of the policy path, i.e. the decoder without its LM head),
is sharded with FSDP2 the same way (each decoder layer, then the root), and has its own AdamW.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AutoModel

from learner.model import computes_in_bfloat16, enable_activation_checkpointing, shard_layers_then_root


class ValueModel(torch.nn.Module):
    """``V(prefix)`` for every position, aligned like ``token_logprobs``.

    ``values[b, t]`` is the value of the prefix *before* token ``t`` (read from the hidden state
    of token ``t - 1``): the state in which the policy chose token ``t``. Position 0 is 0.
    """

    def __init__(self, backbone: torch.nn.Module):
        super().__init__()
        self.backbone = backbone
        hidden_size = backbone.config.hidden_size
        self.value_head = torch.nn.Linear(hidden_size, 1, dtype=next(backbone.parameters()).dtype)
        # Start at V = 0: the first advantages are plain returns, not noise from a random head.
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # use_cache=False: a training forward never decodes further, so a KV cache is only memory
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        values = self.value_head(hidden[:, :-1]).squeeze(-1).float()
        return F.pad(values, (1, 0), value=0.0)


def load_sharded_critic(path: str, dtype: str, mixed_precision: bool = False,
                        activation_checkpointing: bool = False) -> ValueModel:
    """The backbone of the HF model at ``path`` plus a zero value head, sharded with FSDP2
    (precision and checkpointing as ``learner.model.load_sharded_model``)."""
    backbone = AutoModel.from_pretrained(path, dtype=torch.float32)  # float32 master weights
    if activation_checkpointing:
        enable_activation_checkpointing(backbone)
    model = ValueModel(backbone)
    shard_layers_then_root(model, backbone.layers, computes_in_bfloat16(dtype, mixed_precision))
    return model


@dataclass
class Critic:
    """The value model and its optimizer."""

    model: ValueModel
    optimizer: torch.optim.Optimizer

    @classmethod
    def build(cls, path: str, dtype: str, lr: float, weight_decay: float, mixed_precision: bool = False,
              activation_checkpointing: bool = False) -> Critic:
        model = load_sharded_critic(path, dtype, mixed_precision, activation_checkpointing)
        return cls(model, torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay))

    @torch.no_grad()
    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, T] float32 values without gradients (the "old" values GAE uses)."""
        return self.model(input_ids, attention_mask)
