"""Tiny model/tokenizer fixtures and model resolution (tiny, SmolLM2 from GGUF, local path)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from common.config import load_config
from common.models import build_once, default_cache_dir, load_model, load_tokenizer, resolve_model
from common.tiny_model import TINY_TOKENIZER_DIR, build_tiny_model, build_tiny_tokenizer


def test_tiny_tokenizer_fixture_is_reproducible(tmp_path):
    build_tiny_tokenizer(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_text() == (TINY_TOKENIZER_DIR / name).read_text(), name


def test_tiny_tokenizer_round_trips_any_text_and_has_chatml_tokens():
    tokenizer = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)
    assert len(tokenizer) == 512
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    text = "go kitchen\n\n  Ünïcödé 日本 🙂 \t 3.14 {x: [1, 2]}"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "look"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nlook<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_model_is_about_one_million_parameters_and_loads(tmp_path):
    model_dir = build_tiny_model(tmp_path / "tiny")
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    assert 0.5e6 <= model.num_parameters() <= 2e6
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.chat_template
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, len(tokenizer)) and torch.isfinite(logits).all()


def test_tiny_model_is_deterministic_per_seed_and_keeps_global_rng(tmp_path):
    rng_before = torch.random.get_rng_state()
    weights = [
        load_file(build_tiny_model(tmp_path / name, seed=seed) / "model.safetensors")
        for name, seed in [("a", 0), ("b", 0), ("c", 1)]
    ]
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
    assert not torch.equal(weights[0]["model.embed_tokens.weight"], weights[2]["model.embed_tokens.weight"])


def test_resolve_tiny_builds_once_then_reuses(tmp_path):
    model_dir = resolve_model("tiny", tmp_path)
    weights_mtime_ns = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("tiny", tmp_path) == model_dir and model_dir.parent == tmp_path
    assert model_dir.name.startswith("tiny-qwen2-seed0-")  # + the tokenizer fixture's digest
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == weights_mtime_ns
    assert load_model(model_dir, "bfloat16").dtype == torch.bfloat16
    assert load_tokenizer(model_dir).eos_token == "<|im_end|>"


def test_concurrent_resolvers_build_once_and_all_get_the_finished_dir(tmp_path):
    builds = []

    def slow_build(out_dir: Path) -> None:
        builds.append(out_dir)
        time.sleep(0.2)  # widen the race window
        (out_dir / "config.json").write_text("{}")

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(build_once(tmp_path / "m", slow_build)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert results == [tmp_path / "m"] * 4 and (tmp_path / "m" / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_failed_build_leaves_nothing_and_can_be_retried(tmp_path):
    def failing_build(out_dir: Path) -> None:
        (out_dir / "partial").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_once(tmp_path / "m", failing_build)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.lock"]
    assert build_once(tmp_path / "m", lambda out_dir: None) == tmp_path / "m"


def test_resolve_local_path_and_reject_unknown_names(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path), tmp_path / "cache") == tmp_path
    with pytest.raises(FileNotFoundError, match="smollm2-135m, tiny"):
        resolve_model("no-such-model", tmp_path / "cache")


def test_smollm2_converts_to_a_135m_bf16_model_that_answers():
    model_dir = resolve_model("smollm2-135m", default_cache_dir())
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = load_tokenizer(model_dir)

    assert 130e6 <= model.num_parameters() <= 140e6
    assert model.dtype == torch.bfloat16
    assert tokenizer.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    output = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, prompt["input_ids"].shape[1] :])


def test_an_empty_model_cache_dir_means_longhorizon_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LONGHORIZON_CACHE", str(tmp_path / "from-env"))
    assert load_config(None, []).model.cache_dir == ""
    path = resolve_model("tiny", "")
    assert path.parent == tmp_path / "from-env" and (path / "config.json").is_file()
    assert resolve_model("tiny", tmp_path / "given").parent == tmp_path / "given"
