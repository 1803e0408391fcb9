"""A checkpoint's ``hf/`` folder loads in vLLM and generates (opt-in: needs vLLM).

    .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_export.py
"""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from safetensors.torch import load_file  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from actors.engine_api import SamplingParams  # noqa: E402
from actors.vllm_engine import VllmEngine, VllmEngineConfig  # noqa: E402
from common.tiny_model import build_tiny_model  # noqa: E402
from learner.checkpoint import export_hf  # noqa: E402


def test_exported_hf_folder_serves_in_vllm(tmp_path):
    source = build_tiny_model(tmp_path / "tiny")
    params = load_file(source / "model.safetensors")
    params = {k: v for k, v in params.items() if k != "lm_head.weight"}  # tied: sent once, as the learner does
    export_hf(params, str(source), tmp_path / "hf")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tokenizer.chat_template, "the export carries the chat template"
    engine = VllmEngine(VllmEngineConfig(model_path=str(tmp_path / "hf"), dtype="float32", max_model_len=512,
                                         max_num_seqs=4, kv_cache_memory_bytes=64 * 1024 * 1024,
                                         enforce_eager=True))
    engine.start()
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "go kitchen"}],
                                             add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        out = asyncio.run(engine.generate(prompt, SamplingParams(max_new_tokens=8)))
    finally:
        engine.stop()
    assert len(out.token_ids) == 8 and len(out.logprobs) == 8 and all(v == 0 for v in out.versions)
