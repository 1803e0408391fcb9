"""GPU readiness check: the learner's real train step on CUDA at Qwen2 sizes, and weight-bucket packing.

Run on a GPU machine (nothing to install beyond torch and transformers; no Ray, ZeroMQ or vLLM):

    python tests/gpu/check.py [--shapes qwen2-0.5b qwen2-1.5b qwen2-7b] [--out runs/gpu_check.json]
    python tests/gpu/check.py --cpu      # the same code on the tiny model, on the CPU (the suite runs it)

1. For each shape: a randomly initialised Qwen2 of that size (config only, no download) is saved
   once and loaded by the learner as in a run: ``learner.policy.ShardedPolicy`` (FSDP2 over a
   one-rank group, float32 masters, bf16 compute, activation checkpointing, decoupled PPO-clip
   with truncated importance weights over GRPO advantages, AdamW). A shape whose weights, gradients
   and AdamW state (16 bytes a parameter) do not fit the GPU is skipped, saying so.
2. The baseline, on the same model and batch, in the same run: a plain PyTorch loop (the model
   without FSDP, autocast to bf16, the same checkpointing, a REINFORCE-style loss, AdamW).
3. Tokens/s of both, their ratio, and MFU = 6 x parameters x tokens / step time / the GPU's peak
   dense bf16 FLOP/s (from ``PEAK_BF16_FLOPS`` by device name; unknown devices report none).
4. Weight buckets: ``common.weight_sync.plan_buckets`` + ``pack_bucket`` into device buffers
   against a plain device copy of the same tensors, as a ratio.
Nothing is asserted here: ``tests/test_gpu_check.py`` checks the CPU mode's output makes sense.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if not __package__:  # run as a script: import the project from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoModelForCausalLM, Qwen2Config  # noqa: E402

from common.config import load_config  # noqa: E402
from common.model_geometry import parameter_counts  # noqa: E402
from common.net import free_port  # noqa: E402
from common.tiny_model import build_tiny_model  # noqa: E402
from common.weight_sync import pack_bucket, plan_buckets  # noqa: E402
from learner.model import init_process_group  # noqa: E402
from learner.policy import ShardedPolicy  # noqa: E402
from tests.bench.learner_bench import GROUP_SIZE, synthetic_batch  # noqa: E402

SHAPES = {  # Qwen2's published configs (hidden, layers, heads, KV heads, MLP width, tied embeddings)
    "qwen2-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                       intermediate_size=4864, tie_word_embeddings=True),
    "qwen2-1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                       intermediate_size=8960, tie_word_embeddings=True),
    "qwen2-7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                     intermediate_size=18944, tie_word_embeddings=False),
}
VOCAB_SIZE = 151_936
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}
"""Dense bf16 tensor-core peaks (no sparsity), by a substring of ``torch.cuda.get_device_name()``."""
TRAIN_BYTES_PER_PARAM = 16  # float32 weights, gradients and AdamW's two moments


def build_shape(name: str, root: Path) -> Path:
    """A random Qwen2 of the named size saved as a Hugging Face folder (the tiny model's tokenizer)."""
    tiny = build_tiny_model(root / "tiny")
    if name == "tiny":
        return tiny
    config = Qwen2Config(vocab_size=VOCAB_SIZE, max_position_embeddings=4096, **SHAPES[name])
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    out = root / name
    model.save_pretrained(out)
    for file in tiny.glob("tokenizer*"):
        (out / file.name).write_bytes(file.read_bytes())
    return out


def plain_step(model, optimizer, batch, bf16: bool) -> None:
    """The baseline: one model, one AdamW, one advantage-weighted logprob loss; no project code."""
    device = next(model.parameters()).device
    ids, attention, mask = (t.to(device) for t in (batch.token_ids, batch.attention_mask, batch.loss_mask))
    rewards = batch.rewards.to(device).view(-1, GROUP_SIZE)
    advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).flatten()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=ids, attention_mask=attention).logits
    picked = F.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    loss = -(picked * advantages[:, None] * mask[:, 1:]).sum() / mask[:, 1:].sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def timed(step, steps: int) -> float:
    """Median seconds of ``steps`` calls after one warm-up call."""
    times = []
    for _ in range(steps + 1):
        _synchronize()
        start = time.perf_counter()
        step()
        _synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def check_train_step(name: str, path: Path, rows: int, width: int, steps: int, on_gpu: bool) -> dict:
    ours, params, vocab_size, loss = _time_ours(path, rows, width, steps, on_gpu)
    batch = synthetic_batch(rows, width, vocab_size)
    plain = _time_plain(path, batch, steps, on_gpu)
    tokens = int(batch.attention_mask.sum())
    result = {"shape": name, "params": params, "rows": rows, "width": width, "tokens": tokens,
              "ours_step_s": ours, "plain_step_s": plain, "ours_tokens_per_s": tokens / ours,
              "plain_tokens_per_s": tokens / plain, "ours_over_plain": plain / ours, "loss": loss}
    peak = _peak_flops() if on_gpu else None
    if peak:
        result["ours_mfu"] = 6 * params * tokens / ours / peak
        result["plain_mfu"] = 6 * params * tokens / plain / peak
    return result


def _time_ours(path: Path, rows: int, width: int, steps: int, on_gpu: bool) -> tuple[float, int, int, float]:
    """The learner's step as a run makes it: seconds a step, parameters, vocabulary, last loss."""
    overrides = ["--model.name", str(path), "--model.dtype", "bfloat16" if on_gpu else "float32",
                 "--learner.activation_checkpointing", "true", "--rollout.max_episode_tokens", str(width)]
    policy = ShardedPolicy(load_config(None, overrides), str(path))
    batch = synthetic_batch(rows, width, policy.vocab_size)
    scalars: dict = {}
    seconds = timed(lambda: scalars.update(policy.train(batch)), steps)
    params = sum(p.numel() for p in policy.model.parameters())
    return seconds, params, policy.vocab_size, float(scalars.get("learner/loss", float("nan")))


def _time_plain(path: Path, batch, steps: int, on_gpu: bool) -> float:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to("cuda" if on_gpu else "cpu")
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    return timed(lambda: plain_step(model, optimizer, batch, on_gpu), steps)


def check_buckets(path: Path, on_gpu: bool, bucket_mb: float = 64.0, repeats: int = 5) -> dict:
    """Bucket packing against a plain device copy of the same tensors; the packed bytes round-trip."""
    device = torch.device("cuda" if on_gpu else "cpu")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if on_gpu else torch.float32)
    tensors = {name: p.detach().to(device) for name, p in model.named_parameters()}
    announce = plan_buckets(tensors.items(), int(bucket_mb * 2**20), version=1)
    buffers = [torch.empty(n, dtype=torch.uint8, device=device) for n in announce.bucket_nbytes]
    pack = timed(lambda: [pack_bucket(announce, b, tensors, out=buf) for b, buf in enumerate(buffers)], repeats)
    copy = timed(lambda: [t.clone() for t in tensors.values()], repeats)
    slot = announce.slots[-1]
    raw = buffers[slot.bucket][slot.offset_bytes: slot.offset_bytes + slot.nbytes]
    round_trip = torch.equal(raw.view(getattr(torch, slot.dtype)).reshape(slot.shape), tensors[slot.name])
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return {"bytes": nbytes, "buckets": len(buffers), "pack_s": pack, "copy_s": copy, "copy_over_pack": copy / pack,
            "round_trip": round_trip}


def _peak_flops() -> float | None:
    name = torch.cuda.get_device_name()
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def _fits(name: str) -> tuple[bool, str]:
    params, _ = parameter_counts(dict(SHAPES[name], vocab_size=VOCAB_SIZE))
    need, free = params * TRAIN_BYTES_PER_PARAM * 1.25, torch.cuda.mem_get_info()[0]
    why = f"{name}: needs ~{need / 2**30:.0f} GiB (16 B a parameter + activations), {free / 2**30:.0f} GiB free"
    return need < free, why


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the tiny model on the CPU (the suite's mode)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--out", default="runs/gpu_check.json", help="where the JSON goes")
    args = parser.parse_args()
    on_gpu = not args.cpu
    if on_gpu and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --cpu for the CPU mode")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.manual_seed(0)
    init_process_group(0, 1, "127.0.0.1", free_port())  # nccl on CUDA, gloo on the CPU
    report = {"device": torch.cuda.get_device_name() if on_gpu else "cpu", "torch": torch.__version__,
              "train": [], "buckets": [], "skipped": []}
    try:
        with tempfile.TemporaryDirectory() as root:
            for name in ["tiny"] if args.cpu else args.shapes:
                fits, why = (True, "") if name == "tiny" else _fits(name)
                if not fits:
                    report["skipped"].append(why)
                    print(f"skipped {why}")
                    continue
                path = build_shape(name, Path(root))
                rows, width = (8, 256) if name == "tiny" else (8, 2048)
                report["train"].append(check_train_step(name, path, rows, width, steps=2 if args.cpu else 5,
                                                        on_gpu=on_gpu))
                report["buckets"].append({"shape": name, **check_buckets(path, on_gpu)})
    finally:
        dist.destroy_process_group()
    print_report(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


def print_report(report: dict) -> None:
    print(f"device {report['device']}, torch {report['torch']}")
    for r in report["train"]:
        mfu = f", MFU {r['ours_mfu']:.1%} (plain {r['plain_mfu']:.1%})" if "ours_mfu" in r else ""
        print(f"train step {r['shape']} ({r['params'] / 1e6:.0f}M params, {r['rows']} x {r['width']}): "
              f"ours {r['ours_tokens_per_s']:.0f} tok/s, plain loop {r['plain_tokens_per_s']:.0f} tok/s, "
              f"ours / plain {r['ours_over_plain']:.2f}{mfu}; loss {r['loss']:.4f}")
    for b in report["buckets"]:
        print(f"weight buckets {b['shape']} ({b['bytes'] / 2**20:.0f} MiB in {b['buckets']}): "
              f"pack {b['pack_s'] * 1e3:.1f} ms, device copy {b['copy_s'] * 1e3:.1f} ms, "
              f"copy / pack {b['copy_over_pack']:.2f}, "
              f"bytes round-trip {'ok' if b['round_trip'] else 'WRONG'}")


if __name__ == "__main__":
    main()
