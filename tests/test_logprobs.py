"""Chunked logprobs and entropy at the loss positions: the same values and gradients as full logits."""

from __future__ import annotations

import pytest
import torch

from learner.critic import load_sharded_critic
from learner.logprobs import sequence_logprobs
from learner.model import load_sharded_model

TEMPERATURE = 0.7
LOSS_MASK = torch.tensor([
    [0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0],
    [0, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0],
    [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
], dtype=torch.float32)
LENGTHS = torch.tensor([10, 11, 5])


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    attention = (torch.arange(LOSS_MASK.shape[1])[None, :] < LENGTHS[:, None]).long()
    token_ids = torch.randint(3, 500, LOSS_MASK.shape, generator=torch.Generator().manual_seed(0)) * attention
    return token_ids, attention


def _gradients(model) -> dict[str, torch.Tensor]:
    return {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
            for name, p in model.named_parameters()}


def _run(model, chunk_tokens: int, entropy_grad: bool):
    """Logprobs, entropy and parameter gradients of a loss that weighs each token differently."""
    token_ids, attention = _batch()
    weights = torch.randn(LOSS_MASK.shape, generator=torch.Generator().manual_seed(1))
    model.zero_grad(set_to_none=True)
    logprobs, entropy = sequence_logprobs(model, token_ids, attention, LOSS_MASK, TEMPERATURE, chunk_tokens,
                                          entropy_grad=entropy_grad)
    loss = (weights * logprobs * LOSS_MASK).sum()
    if entropy_grad:
        loss = loss + (weights.flip(0) * entropy * LOSS_MASK).sum()
    loss.backward()
    keep = LOSS_MASK.bool()
    return logprobs.detach()[keep], entropy.detach()[keep], _gradients(model)


def _assert_close(chunked, full, atol: float) -> None:
    (logprobs, entropy, grads), (full_logprobs, full_entropy, full_grads) = chunked, full
    assert torch.allclose(logprobs, full_logprobs, atol=atol) and torch.allclose(entropy, full_entropy, atol=atol)
    assert grads.keys() == full_grads.keys()
    for name, grad in grads.items():
        scale = full_grads[name].abs().max().item()
        assert (grad - full_grads[name]).abs().max().item() <= atol * max(scale, 1.0), name


@pytest.mark.parametrize("chunk_tokens", [1, 5, 4096])  # one token, chunks that do not divide 15, one chunk
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_chunked_logprobs_and_gradients_equal_the_full_logits_computation(model_path, chunk_tokens, entropy_grad):
    model = load_sharded_model(model_path, "float32")
    full = _run(model, 0, entropy_grad)
    _assert_close(_run(model, chunk_tokens, entropy_grad), full, atol=1e-5)


def test_entropy_carries_no_gradient_unless_asked_for(model_path):
    model = load_sharded_model(model_path, "float32")
    token_ids, attention = _batch()
    logprobs, entropy = sequence_logprobs(model, token_ids, attention, LOSS_MASK, TEMPERATURE, 4)
    assert logprobs.requires_grad and not entropy.requires_grad
    assert (entropy[LOSS_MASK.bool()] > 0).all()  # still reported
    assert logprobs.dtype == entropy.dtype == torch.float32


def test_with_mixed_precision_the_loss_logits_are_float32_and_match(model_path):
    model = load_sharded_model(model_path, "float32", mixed_precision=True)
    full, chunked = _run(model, 0, True), _run(model, 5, True)
    # bf16 matmuls of different shapes round differently; the float32 log-softmax keeps it small
    _assert_close(chunked, full, atol=2e-2)


def test_a_micro_batch_without_loss_tokens_still_runs_a_backward(model_path):
    # A rank's stand-in micro-batch must make the same FSDP backward as the others, with zero gradients.
    model = load_sharded_model(model_path, "float32")
    token_ids, attention = _batch()
    logprobs, entropy = sequence_logprobs(model, token_ids, attention, torch.zeros_like(LOSS_MASK), TEMPERATURE, 4)
    assert logprobs.abs().sum() == 0 and entropy.abs().sum() == 0
    logprobs.sum().backward()
    assert all(grad.abs().sum() == 0 for grad in _gradients(model).values())


@pytest.mark.parametrize("chunk_tokens", [0, 4])
def test_training_forwards_build_no_kv_cache(model_path, chunk_tokens):
    # A KV cache in a training forward is memory for a decode that never comes (7B x 32k: gigabytes).
    model = load_sharded_model(model_path, "float32")
    caches = []
    model.register_forward_hook(lambda module, args, kwargs, out: caches.append(
        (kwargs.get("use_cache"), getattr(out, "past_key_values", None))), with_kwargs=True)
    token_ids, attention = _batch()
    sequence_logprobs(model, token_ids, attention, LOSS_MASK, TEMPERATURE, chunk_tokens)
    assert caches == [(False, None)]


def test_the_critics_forward_builds_no_kv_cache(model_path):
    critic = load_sharded_critic(model_path, "float32")
    caches = []
    critic.backbone.register_forward_hook(lambda module, args, kwargs, out: caches.append(
        (kwargs.get("use_cache"), getattr(out, "past_key_values", None))), with_kwargs=True)
    token_ids, attention = _batch()
    critic(token_ids, attention)
    assert caches == [(False, None)]
