"""A warm start for RL on the toy env: a short supervised pass on *random valid* actions.

A random tiny model never writes a well-formed action, so RL from it gets no signal at all. This
pass teaches the format and nothing else: every target action is drawn uniformly from the
actions valid in the current state (``KeyDoorEnv.valid_actions``), whatever the hints say, so
the warm model plays like a random valid agent and has no policy to speak of. The learning test
(``tests/test_learning.py``) starts RL from it.

1. Play ``episodes`` keydoor episodes in process with random valid actions (up to ``turn_cap``).
2. Tokenize each as the actors do (``common/chat.py``): system prompt, observations as chat
   deltas (loss mask 0), each action plus the end-of-turn token (loss mask 1).
3. ``steps`` AdamW steps of cross-entropy on the action tokens, batches of ``batch_size``;
   with ``observation_weight`` > 0, plus that weight times the cross-entropy on the other tokens
   (the env's replies): the model learns to read the game, as a pretrained LM would bring, while
   its actions stay uniformly random.
4. Save the model and tokenizer with ``save_pretrained`` (loadable by ``model.name: <dir>``).

The keydoor options (rooms per task) and the system prompt come from the RL run's config, so
the warm model reads the observations and prompt it will meet.

    python -m launcher.warm_start --out /tmp/keydoor-warm --observation-weight 0.5   # the default job's
    python launch.py --model.name /tmp/keydoor-warm --model.warm_start ""

(``python launch.py`` does both: ``model.warm_start: keydoor`` in configs/default.yaml makes the warm
model once and keeps it in the model cache.)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F

from common.chat import ChatTokenBuffer
from common.config import Config, RolloutSection, load_config
from common.models import build_once, load_model, load_tokenizer, resolve_model
from common.paths import cache_dir_or_default, default_cache_dir
from envhub.envs.keydoor import KeyDoorEnv

GAME_OPTIONS = ("room_pool", "rooms_per_task")
RUN_OBSERVATION_WEIGHT = 0.5
"""The warm start ``model.warm_start: keydoor`` makes, as the learning test's: it also learns the
env's replies (the reading a pretrained model brings), while its actions stay random."""


def random_valid_episode(task_id: int, seed: int, turn_cap: int, rng: random.Random,
                         env_options: dict | None = None) -> list[tuple[str, str]]:
    """(observation, action) pairs of one episode played by uniformly random valid actions."""
    env = KeyDoorEnv(**(env_options or {}))
    observation, _ = asyncio.run(env.reset(str(task_id), seed))
    turns = []
    for _ in range(turn_cap):
        action = rng.choice(env.valid_actions())
        turns.append((observation, action))
        result = asyncio.run(env.step(action))
        if result.terminated or result.truncated:
            break
        observation = result.observation
    return turns


def tokenize_episode(tokenizer, system_prompt: str, turns: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
    """Token ids and loss mask, exactly as an actor's buffer would hold them."""
    buf = ChatTokenBuffer(tokenizer, system_prompt or None)
    for index, (observation, action) in enumerate(turns):
        if index == 0:
            buf.start(observation)
        else:
            buf.append_observation(observation)
        ids = tokenizer.encode(action, add_special_tokens=False) + [tokenizer.eos_token_id]
        buf.append_generated(ids, [0.0] * len(ids), [0] * len(ids))
    return buf.token_ids, buf.as_arrays()["loss_mask"].tolist()


def sft_loss(model, rows: list[tuple[list[int], list[int]]], observation_weight: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy over the action tokens of a right-padded batch, plus
    ``observation_weight`` times the mean over the other tokens (prompt and env replies)."""
    width = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    for row, (token_ids, loss_mask) in enumerate(rows):
        ids[row, : len(token_ids)] = torch.tensor(token_ids)
        mask[row, : len(loss_mask)] = torch.tensor(loss_mask, dtype=torch.float)
        attention[row, : len(token_ids)] = 1
    logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits[:, :-1].float()
    per_token = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    target_mask, real = mask[:, 1:], attention[:, 1:].float()
    action_loss = (per_token * target_mask).sum() / target_mask.sum()
    if not observation_weight:
        return action_loss
    text_mask = real * (1 - target_mask)
    return action_loss + observation_weight * (per_token * text_mask).sum() / text_mask.sum().clamp(min=1)


def warm_start(out_dir: Path, episodes: int = 512, steps: int = 300, batch_size: int = 8, lr: float = 3e-3,
               turn_cap: int = 4, seed: int = 0, system_prompt: str = RolloutSection.system_prompt,
               env_options: dict | None = None, observation_weight: float = 0.0, threads: int = 2) -> float:
    """Train and save the warm model; returns the last batch's loss. ``threads``: torch threads
    for the pass; on 2 idle cores 2 take 0.31 s a step against 0.54 s for 1, and more only wait on
    a 1M model (on busy cores a second thread costs more than it gives: pass 1)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    path = resolve_model("tiny", default_cache_dir())
    tokenizer, model = load_tokenizer(path), load_model(path, "float32")
    episodes_played = (random_valid_episode(rng.randrange(10_000), i, turn_cap, rng, env_options)
                       for i in range(episodes))
    data = [tokenize_episode(tokenizer, system_prompt, turns) for turns in episodes_played]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # Linear decay to 0: the last steps average out the batch noise, so the model ends near the
    # uniform choice among valid actions instead of wherever the last batches pushed it.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    model.train()
    loss = torch.tensor(0.0)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(steps):
            loss = sft_loss(model, rng.sample(data, batch_size), observation_weight)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    finally:
        torch.set_num_threads(previous_threads)
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return float(loss.detach())


def warm_start_for_run(config_path: str | None, out_dir: Path, **kwargs) -> float:
    """``warm_start`` on what the RL run will meet: its keydoor options, its system prompt, and
    episodes as long as its largest turn cap (so the warm model has met contexts as long as the
    run's)."""
    return warm_start(out_dir, **_run_settings(load_config(config_path)), **kwargs)


def _run_settings(cfg: Config) -> dict:
    # Only the options that shape what the agent reads: simulated latency would slow the pass to a crawl.
    options = {k: v for k, v in cfg.envhub.env_options.get("keydoor-v0", {}).items() if k in GAME_OPTIONS}
    return {"turn_cap": max(cfg.learner.horizon.turn_caps), "system_prompt": cfg.rollout.system_prompt,
            "env_options": options}


def cached_warm_model(cfg: Config) -> Path:
    """The warm model a run with ``model.warm_start: keydoor`` starts from, made once per keydoor
    options, prompt and turn cap (about 95 s on 2 cores) and kept in the model cache."""
    settings = _run_settings(cfg) | {"observation_weight": RUN_OBSERVATION_WEIGHT}
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]
    target = cache_dir_or_default(cfg.model.cache_dir) / f"tiny-keydoor-warm-{digest}"
    return build_once(target, lambda out_dir: warm_start(out_dir, **settings))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the warm model")
    parser.add_argument("--config", help="the RL run's config: its keydoor options and system prompt")
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--observation-weight", type=float, default=0.0,
                        help="also learn to predict the env's replies, at this weight (actions stay random)")
    args = parser.parse_args()
    loss = warm_start_for_run(args.config, args.out, episodes=args.episodes, steps=args.steps, lr=args.lr,
                              observation_weight=args.observation_weight)
    print(f"warm model in {args.out} (last batch loss {loss:.3f})")


if __name__ == "__main__":
    main()
