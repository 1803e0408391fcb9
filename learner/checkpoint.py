"""Checkpoints: ``<run>/checkpoints/step_<N>/`` with learner state, loop state and ``hf/``.

Layout: ``state/`` (sharded model and optimizer, torch.distributed.checkpoint), ``loop.json``
(step, policy version, sampler and horizon state), ``rng_rank<r>.pt`` (torch RNG of each rank),
``hf/`` (loads with ``from_pretrained``),
and ``COMPLETE``, written last: a folder without it is an interrupted save and is ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from learner.model import full_parameters


def save_checkpoint(run_dir: Path, step: int, modules: dict, loop_state: dict, model_path: str) -> Path:
    """Collective over learner ranks; rank 0 writes ``loop.json``, ``hf/`` and ``COMPLETE``.

    ``modules`` maps a name to (module, optimizer); ``"policy"`` is the one exported to ``hf/``.
    """
    folder = Path(run_dir) / "checkpoints" / f"step_{step}"
    state = {}
    for name, (module, optimizer) in modules.items():
        model_sd, optim_sd = get_state_dict(module, optimizer)
        state[name] = {"model": model_sd, "optim": optim_sd}
    dcp.save(state, checkpoint_id=str(folder / "state"))
    model = modules["policy"][0]
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.save(torch.get_rng_state(), folder / f"rng_rank{rank}.pt")
    # A collective: every rank has written its files before rank 0 writes COMPLETE below.
    full = full_parameters(model)
    if not dist.is_initialized() or dist.get_rank() == 0:
        (folder / "loop.json").write_text(json.dumps(loop_state, indent=1))
        export_hf(full, model_path, folder / "hf")
        (folder / "COMPLETE").write_text(f"step {step}\n")
    return folder


def export_hf(params: dict[str, torch.Tensor], model_path: str, out_dir: Path) -> None:
    """A plain HF folder (config, safetensors, tokenizer with chat template) from full params."""
    config = AutoConfig.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_config(config, dtype=next(iter(params.values())).dtype)
    # strict=False: tied aliases (lm_head when tied) are absent, as named_parameters() skips them.
    _, unexpected = model.load_state_dict(params, strict=False)
    not_given = set(dict(model.named_parameters())) - set(params)
    if unexpected or not_given:
        raise RuntimeError(f"export mismatch: unexpected {unexpected}, missing {sorted(not_given)}")
    model.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(out_dir)


def latest_complete(run_dir: Path) -> Path | None:
    """The newest ``step_<N>`` folder that has its ``COMPLETE`` marker."""
    done = [p for p in (Path(run_dir) / "checkpoints").glob("step_*") if (p / "COMPLETE").exists()]
    return max(done, key=lambda p: int(p.name.removeprefix("step_")), default=None)
