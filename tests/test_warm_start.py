"""The warm start's supervised pass: the action loss always, the env's replies only when asked."""

import random

import torch

from common.config import RolloutSection
from common.models import load_model, load_tokenizer, resolve_model
from common.paths import default_cache_dir
from learner.warm_start import random_valid_episode, sft_loss, tokenize_episode


def reply_loss_after_training(observation_weight: float) -> float:
    """Cross-entropy on the env's reply tokens after a few steps at ``observation_weight``."""
    torch.manual_seed(0)
    rng = random.Random(0)
    path = resolve_model("tiny", default_cache_dir())
    tokenizer, model = load_tokenizer(path), load_model(path, "float32")
    rows = [tokenize_episode(tokenizer, RolloutSection.system_prompt, random_valid_episode(task, 0, 4, rng))
            for task in range(4)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(15):
        optimizer.zero_grad()
        sft_loss(model, rows, observation_weight).backward()
        optimizer.step()
    with torch.no_grad():
        return float(sft_loss(model, rows, 1.0) - sft_loss(model, rows, 0.0))


def test_observation_weight_teaches_the_model_to_read_the_replies():
    assert reply_loss_after_training(1.0) < 0.8 * reply_loss_after_training(0.0)
