"""A tiny ChatML tokenizer and a ~1M-parameter random Qwen2 model for CPU tests.

The tokenizer is a byte-level BPE (any text round-trips) trained deterministically on a
small built-in corpus; its files are committed in `common/tiny_tokenizer/` and
`build_tiny_tokenizer` regenerates them byte for byte (a test checks this). The model is
built on demand from a seed, so no weights are committed.

Regenerate the fixture:  python -m common.tiny_model
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

TINY_TOKENIZER_DIR = Path(__file__).parent / "tiny_tokenizer"
VOCAB_SIZE = 512
PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"

# Qwen2-style ChatML without Qwen's default system prompt.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_CORPUS_LINES = (
    "system", "user", "assistant", "You are a helpful assistant that plays text games.",
    "You are in the hall. Exits: north, east, kitchen.",
    "You are in the kitchen. There is a key on the table and a locked door to the west.",
    "You are in the garden. A small shed stands in the corner.",
    "go kitchen", "go hall", "go north", "go south", "go east", "go west", "go garden",
    "take key", "take apple", "take lamp", "drop key", "drop lamp",
    "open door", "close door", "unlock door with key", "look", "inventory", "examine table",
    "You take the key.", "The door is locked.", "The door opens.", "You can't go that way.",
    "Nothing happens.", "You win! Well done.", "Score: 10/10. Moves: 42.",
    "Craft 1 oak planks using 1 oak log.", "Get 2 sticks. Crafted 4 minecraft:stick.",
    "Search the corpus for the answer, then answer with <answer>Paris</answer>.",
    "Think step by step. Action: go kitchen. Observation: You are in the kitchen.",
    "What is the capital of France? The capital of France is Paris.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 20 42 64 100 128 256 512 1000 2024 3.14 -7",
    "Punctuation: . , ; : ! ? ' \" ( ) [ ] { } < > / \\ | - _ + = * & % $ # @ ~ `",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX.",
    "I think I should open the door, then go to the kitchen and take the key.",
    "Your task is to reach the goal. You see a red ball, a blue box and a green key.",
    "turn left", "turn right", "move forward", "pick up the key", "toggle the door",
    # The toy env's rooms (envhub/envs/keydoor.py), so each is one token, as common words are in
    # a real tokenizer: the tiny model then copies a room name as one token, not five bytes.
    "Rooms: kitchen, garden, attic, cellar, library, study. A key jingles in the attic.",
    "go attic", "go cellar", "go library", "go study", "A key lies here. Nothing here.",
)


def _training_corpus() -> list[str]:
    # Repetition weights the game vocabulary so the merges favour it.
    return [line for line in _CORPUS_LINES for _ in range(3)]


def _train_byte_level_bpe() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_training_corpus(), trainer=trainer)
    return tokenizer


def build_tiny_tokenizer(out_dir: str | Path) -> Path:
    """Train the tiny ChatML tokenizer and write tokenizer.json + tokenizer_config.json."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_byte_level_bpe(),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHATML_TEMPLATE,
        model_max_length=4096,
    )
    hf_tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    return out_dir


def load_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The committed tiny tokenizer fixture."""
    return AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)


def tiny_qwen2_config(tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    """~0.85M parameters: big enough to exercise every code path, small enough for CPU tests."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        dtype="float32",
    )


def build_tiny_model(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a random tiny Qwen2ForCausalLM (float32) plus tokenizer files to `out_dir`.

    The same seed always gives the same weights; the global torch RNG is left untouched.
    """
    out_dir = Path(out_dir)
    tokenizer = load_tiny_tokenizer()
    config = tiny_qwen2_config(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)
    return out_dir


if __name__ == "__main__":
    print(f"wrote {build_tiny_tokenizer(TINY_TOKENIZER_DIR)}")
