"""One optimizer step on a batch: current logprobs, GRPO advantages, corrected PPO loss."""

from __future__ import annotations

import torch

from learner.advantages import grpo_advantages, sequence_to_token_advantages
from learner.batching import Batch
from learner.config import LearnerConfig
from learner.losses import entropy_from_logits, masked_mean, ppo_clip_loss, token_logprobs


def train_step(model, optimizer, batch: Batch, cfg: LearnerConfig, temperature: float) -> dict[str, float]:
    """Forward, loss, backward, clip, step. Returns ``learner/`` and ``optim/`` scalars."""
    model.train()
    logits = model(input_ids=batch.token_ids, attention_mask=batch.attention_mask).logits.float()
    logprobs = token_logprobs(logits, batch.token_ids, temperature)
    seq_adv = grpo_advantages(batch.rewards, batch.group_index, std_norm=cfg.grpo_std_norm)
    advantages = sequence_to_token_advantages(seq_adv, batch.loss_mask)
    # One gradient step per batch: the proximal policy is the current one before the step.
    loss, stats = ppo_clip_loss(
        logprobs, logprobs.detach(), batch.behavior_logprobs, advantages, batch.loss_mask,
        clip_eps=cfg.clip_eps, is_cap=cfg.is_cap,
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    with torch.no_grad():
        entropy = masked_mean(entropy_from_logits(logits.detach(), temperature), batch.loss_mask)
    out = {f"learner/{k}": float(v) for k, v in stats.items()}
    out.update({
        "learner/loss": float(loss.detach()),
        "learner/entropy": float(entropy),
        "learner/advantage_abs_mean": float(masked_mean(advantages.abs(), batch.loss_mask)),
        "optim/grad_norm": float(_to_local(grad_norm)),
        "optim/lr": optimizer.param_groups[0]["lr"],
    })
    return out


def _to_local(value: torch.Tensor) -> torch.Tensor:
    # clip_grad_norm_ over DTensor parameters returns a DTensor.
    return value.full_tensor() if hasattr(value, "full_tensor") else value
