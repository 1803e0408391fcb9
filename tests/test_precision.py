"""bfloat16 on the learner: float32 logits in the loss, float32 master weights whatever model.dtype says."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from learner.logprobs import sequence_logprobs
from learner.model import full_parameters, load_sharded_model
from learner.train_step import Trainer
from tests.test_train_step import LOSS_MASK, TEMPERATURE, make_batch, make_cfg


@pytest.mark.parametrize("chunk_tokens", [0, 4])  # the plain full-logits path and the chunked one
def test_under_bfloat16_compute_the_loss_logits_are_float32(model_path, chunk_tokens):
    model = load_sharded_model(model_path, "float32", mixed_precision=True)
    batch = make_batch(model)
    head = model.get_output_embeddings()
    seen = []  # the bfloat16 hidden states and head weight the head was given
    head.register_forward_pre_hook(lambda module, args: seen.append((args[0].detach(), module.weight.detach())))
    with torch.no_grad():
        logprobs, _ = sequence_logprobs(model, batch.token_ids, batch.attention_mask, LOSS_MASK, TEMPERATURE,
                                        chunk_tokens)
    (hidden, weight), = seen
    assert hidden.dtype == weight.dtype == torch.bfloat16
    # The exact logprobs of those bfloat16 inputs, in float64.
    exact = F.log_softmax(hidden[:, :-1].double() @ weight.double().T / TEMPERATURE, dim=-1)
    exact = exact.gather(-1, batch.token_ids[:, 1:, None]).squeeze(-1)
    on_loss = LOSS_MASK[:, 1:].bool()
    worst = (logprobs[:, 1:].double() - exact)[on_loss].abs().max().item()
    assert worst < 1e-5, f"logprobs off by {worst:.2e}: the head's matmul rounded the logits to bfloat16"


def _three_steps(model_path: str, dtype: str, optimizer: str, mixed_precision: bool):
    """(the change of each master weight, the dtypes of master weights and optimizer state)."""
    cfg = make_cfg(lr=1e-5, learner={"mixed_precision": mixed_precision, "max_grad_norm": 1e9})
    trainer = Trainer.build(model_path, dtype, cfg, TEMPERATURE)
    if optimizer == "sgd":
        trainer.optimizer = torch.optim.SGD(trainer.policy.parameters(), lr=1e-5)
    masters = {k: v.detach().clone() for k, v in full_parameters(trainer.policy).items()}
    batch = make_batch(trainer.policy, behavior_shift=0.0)
    for _ in range(3):
        trainer.step(batch)
    dtypes = {v.dtype for v in masters.values()} | {s.dtype for state in trainer.optimizer.state.values()
                                                    for s in state.values() if s.dim() > 0}
    return {k: v - masters[k] for k, v in full_parameters(trainer.policy).items()}, dtypes


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_with_model_dtype_bfloat16_small_updates_reach_the_float32_master_weights(model_path, optimizer):
    bf16, dtypes = _three_steps(model_path, "bfloat16", optimizer, mixed_precision=False)
    # The same compute, spelled as float32 with mixed precision: model.dtype bfloat16 implies it.
    fp32, _ = _three_steps(model_path, "float32", optimizer, mixed_precision=True)
    moved = sum(int((d != 0).sum()) for d in bf16.values()) / sum(d.numel() for d in bf16.values())
    assert moved > 0.5, f"only {moved:.1%} of the weights moved: the updates rounded away in bfloat16"
    for name, delta in bf16.items():
        assert torch.allclose(delta, fp32[name], rtol=0, atol=1e-9), name
    assert dtypes == {torch.float32}  # master weights and AdamW's moments
