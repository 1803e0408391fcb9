"""Format bench: does a model's first reply hold an action the env can parse, and can it be done?

For each env and each prompt setting (conversation start off, instruction only, instruction and
one worked example), the first observation of held-out tasks is rendered exactly as the actors
render it (``actors/conversation.py`` + ``ChatTokenBuffer``), the model samples one reply per
task at the run's temperature, and the env itself judges the reply on a real envhub server: the
share of replies that parse as an action (``action_parsed``) and the share the env could carry out
(``action_valid``, where the env says so, else the parsed share). Ratios, not timings: the
baseline of each row is the same model and env with the conversation start off.

    python -m tests.bench.format_bench [--models smollm2-135m tiny] [--envs babyai-v0 textcraft-v0] [--samples 24]
        [--quick] [--json PATH]

``--quick``: 8 samples per env and setting, keydoor, TextCraft and BabyAI only; ``--json PATH`` also
writes the rows for ``run_all.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as a script, not with -m: import the project from the repo root as -m does
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from actors.conversation import ConversationStarts
from common.chat import ChatTokenBuffer
from common.config import RolloutSection
from common.config.envhub import EnvhubConfig
from common.models import default_cache_dir, load_model, load_tokenizer, resolve_model
from envhub import registry
from envhub.client import EnvClient
from tests.bench.run_all import write_json
from tests.servers import running_hub

QUICK_ENVS = ("keydoor-v0", "textcraft-v0", "babyai-v0")
DEFAULT_ENVS = ("keydoor-v0", "textcraft-v0", "babyai-v0", "sciworld-v0", "search-v0")
SPLITS = {"keydoor-v0": "test", "textcraft-v0": "depth1_test", "babyai-v0": "goto_test", "sciworld-v0": "test",
          "search-v0": "test", "webnav-v0": "test"}
SETTINGS = (("off", False, 0), ("instruction", True, 0), ("1 example", True, 1), ("2 examples", True, 2))
SYSTEM_PROMPT = RolloutSection().system_prompt


@dataclass
class Shares:
    parsed: float
    valid: float
    won: float
    """Replies that finished the task at once (a BabyAI goal in view, ``go to`` it)."""


def first_prompts(tokenizer, openings: list[tuple[list, str]]) -> list[list[int]]:
    """Token ids of each episode's opening through the generation prompt, as the actors build them."""
    prompts = []
    for preamble, first_turn in openings:
        buffer = ChatTokenBuffer(tokenizer, SYSTEM_PROMPT)
        buffer.start(first_turn, preamble)
        prompts.append(list(buffer.token_ids))
    return prompts


@torch.inference_mode()
def sample_replies(model, tokenizer, prompts: list[list[int]], max_new_tokens: int, temperature: float,
                   batch_size: int = 8) -> list[str]:
    """One sampled reply per prompt (left-padded batches of transformers' generate)."""
    replies = []
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i:i + batch_size]
        width = max(map(len, chunk))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=True,
                             temperature=temperature, top_k=0, top_p=1.0, pad_token_id=pad,
                             eos_token_id=tokenizer.eos_token_id)
        replies += tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return replies


async def judge(env: EnvClient, env_id: str, task_ids: list[str], replies: list[str]) -> Shares:
    """Each reply stepped once in a fresh session of its task: the env's own verdict."""
    parsed = valid = won = 0
    for task_id, reply in zip(task_ids, replies):
        session = await env.create(env_id, task_id, 0)
        try:
            result = await env.step(session.session_id, reply.strip())
        finally:
            await env.close(session.session_id)
        parsed += bool(result.info.get("action_parsed"))
        valid += bool(result.info.get("action_valid", result.info.get("action_parsed")))
        won += bool(result.info.get("success", result.reward > 0))
    return Shares(parsed / len(replies), valid / len(replies), won / len(replies))


async def bench_env(url: str, env_id: str, model, tokenizer, samples: int, temperature: float,
                    max_new_tokens: int) -> list[tuple[str, Shares]]:
    task_ids = registry.task_ids(env_id, SPLITS.get(env_id, "test"))[:samples]
    task_ids = (task_ids * -(-samples // len(task_ids)))[:samples]
    rows = []
    async with EnvClient(url, timeout_s=120) as env:
        observations = []
        for task_id in task_ids:
            session = await env.create(env_id, task_id, 0)
            observations.append(session.observation)
            await env.close(session.session_id)
        for name, enabled, examples in SETTINGS:
            starts = ConversationStarts(env, lambda _, on=enabled, n=examples: (on, n))
            try:
                openings = [await starts.opening(env_id, task_id, observation)
                            for task_id, observation in zip(task_ids, observations)]
            except ValueError:  # the env has fewer examples than the setting asks for
                continue
            prompts = first_prompts(tokenizer, openings)
            replies = await asyncio.to_thread(sample_replies, model, tokenizer, prompts, max_new_tokens, temperature)
            rows.append((name, await judge(env, env_id, task_ids, replies)))
    return rows


def run(models: list[str], envs: list[str], samples: int, temperature: float, max_new_tokens: int) -> list[tuple]:
    """Rows (figure, value, baseline, ratio, goal): the parsed share of each setting against "off"."""
    table = []
    with running_hub(EnvhubConfig(port=0, step_timeout_s=120)) as url:
        for model_name in models:
            path = resolve_model(model_name, default_cache_dir())
            tokenizer, model = load_tokenizer(path), load_model(path, "bfloat16" if model_name != "tiny" else "float32")
            for env_id in envs:
                rows = asyncio.run(bench_env(url, env_id, model, tokenizer, samples, temperature, max_new_tokens))
                baseline = rows[0][1]  # "off": always shown
                for name, shares in rows:
                    # Parsed share over the "off" one (inf when "off" parses nothing and this does).
                    ratio = shares.parsed / baseline.parsed if baseline.parsed else float("inf" if shares.parsed else 1)
                    table.append((f"{model_name} {env_id}: {name}, {samples} first replies",
                                  f"parsed {shares.parsed:.2f}, valid {shares.valid:.2f}, won {shares.won:.2f}",
                                  f"off: parsed {baseline.parsed:.2f}, valid {baseline.valid:.2f}", ratio, ""))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "tiny"])
    parser.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS))
    parser.add_argument("--samples", type=int, default=24, help="first replies per env and setting")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--quick", action="store_true", help="8 samples; keydoor, TextCraft and BabyAI")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON (for run_all.py)")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.envs = 8, [env for env in args.envs if env in QUICK_ENVS]
    torch.manual_seed(0)
    rows = run(args.models, args.envs, args.samples, args.temperature, args.max_new_tokens)
    for row in rows:
        print(" | ".join(f"{c:.2f}" if isinstance(c, float) else str(c) for c in row), flush=True)
    write_json(args.json, "format_bench", rows)


if __name__ == "__main__":
    main()
