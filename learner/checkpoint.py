"""Checkpoints: ``<run>/checkpoints/step_<N>/`` with learner state, loop state and ``hf/``.

Layout: ``state/`` (sharded model and optimizer, torch.distributed.checkpoint), ``loop.json``
(step, policy version, sampler and horizon state), ``rng_rank<r>.pt`` (each rank's torch RNG under
``"torch"`` and the trainer's own generators, e.g. ``"minibatch_shuffle"``),
``hf/`` (loads with ``from_pretrained``),
and ``COMPLETE``, written last: a folder without it is an interrupted save and is ignored
(the folder names and the marker: ``common/run_folder.py``).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import get_state_dict
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from common.run_folder import checkpoint_folder, mark_complete
from learner.model import UnshardedParameters


def save_checkpoint(run_dir: Path, step: int, modules: dict, loop_state: dict, model_path: str,
                    rng_state: dict[str, torch.Tensor] | None = None) -> Path:
    """Collective over learner ranks; rank 0 writes ``loop.json``, ``hf/`` and ``COMPLETE``.

    ``modules`` maps a name to (module, optimizer); ``"policy"`` is the one exported to ``hf/``.
    ``rng_state``: this rank's generators other than torch's global one (``Trainer.rng_state``).
    """
    folder = checkpoint_folder(run_dir, step)
    state = {}
    for name, (module, optimizer) in modules.items():
        model_sd, optim_sd = get_state_dict(module, optimizer)
        state[name] = {"model": model_sd, "optim": optim_sd}
    dcp.save(state, checkpoint_id=str(folder / "state"))
    model = modules["policy"][0]
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.save({"torch": torch.get_rng_state(), **(rng_state or {})}, folder / f"rng_rank{rank}.pt")
    # A collective, one parameter at a time: every rank has written its files before rank 0 writes COMPLETE.
    params = UnshardedParameters(model)
    if not dist.is_initialized() or dist.get_rank() == 0:
        (folder / "loop.json").write_text(json.dumps(loop_state, indent=1))
        stream = iter(params)
        try:
            export_hf(stream, model_path, folder / "hf")
        finally:
            deque(stream, maxlen=0)  # an export that failed still takes part in the followers' gathers
        mark_complete(folder, step)
    else:
        params.drain()
    return folder


def export_hf(params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], model_path: str,
              out_dir: Path, shard_bytes: int = 5 * 10**9) -> None:
    """A plain HF folder (config, safetensors, tokenizer with chat template) from full params.

    The tensors are written in safetensors shards of at most ``shard_bytes`` as they arrive (HF's
    ``model-0000i-of-0000n`` names and index, or one ``model.safetensors``), so a stream of
    parameters gathered one at a time never holds more than a shard.
    """
    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    # tied aliases (lm_head when tied) are absent from both sides, as named_parameters() skips them
    expected = set(dict(skeleton.named_parameters()))
    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, int] = {}
    unexpected, total, shard_total, dtype = [], 0, 0, None

    def write_shard() -> None:
        files.append(out_dir / f"shard-{len(files)}.safetensors")
        save_file(shard, files[-1], metadata={"format": "pt"})
        shard.clear()

    for name, tensor in params.items() if isinstance(params, Mapping) else params:
        if name not in expected:
            unexpected.append(name)
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if shard and shard_total + nbytes > shard_bytes:
            write_shard()
            shard_total = 0
        shard[name], weight_map[name] = tensor.detach().to("cpu").contiguous(), len(files)
        total, shard_total, dtype = total + nbytes, shard_total + nbytes, tensor.dtype
    not_given = expected - set(weight_map)
    if unexpected or not_given:
        raise RuntimeError(f"export mismatch: unexpected {unexpected}, missing {sorted(not_given)}")
    write_shard()
    if len(files) == 1:
        files[0].rename(out_dir / "model.safetensors")
    else:
        names = [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
        for path, new in zip(files, names):
            path.rename(out_dir / new)
        index = {"metadata": {"total_size": total}, "weight_map": {k: names[i] for k, i in weight_map.items()}}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.dtype = dtype
    config.save_pretrained(out_dir)
    if skeleton.can_generate():
        skeleton.generation_config.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(out_dir)
