"""The warm start's supervised pass: the action loss always, the env's replies only when asked."""

import asyncio
import random
import re

import torch

from common.config import RolloutSection
from common.models import load_model, load_tokenizer, resolve_model
from common.paths import default_cache_dir
from envhub.envs.keydoor import KeyDoorEnv
from launcher.warm_start import random_valid_episode, sft_loss, tokenize_episode


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


def test_valid_actions_are_the_commands_admissible_where_the_agent_stands():
    # The warm start copies random picks among these: to do so the model must read where it is
    # (the key lies here, this is the hall), while no admissible move is preferred over another.
    rng, kinds = random.Random(0), set()
    for task in range(30):
        env = KeyDoorEnv(room_pool=["kitchen", "garden"], rooms_per_task=2)
        observation, info = asyncio.run(env.reset(str(task), 0))
        key_room = re.search(r"jingles in the (\w+)", observation).group(1)
        for _ in range(12):
            actions = env.valid_actions()
            in_hall = info["room"] == "hall"
            assert ("open door" in actions) == in_hall and ("go hall" in actions) == (not in_hall)
            assert ("take key" in actions) == (info["room"] == key_room and not info["has_key"])
            action = rng.choice(actions)
            kinds.add(action if not action.startswith("go ") else "go")
            result = asyncio.run(env.step(action))
            if result.terminated:
                break
            info = result.info
    assert kinds == {"go", "take key", "open door"}
