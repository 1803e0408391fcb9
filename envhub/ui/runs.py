"""Run folders under ``envhub.runs_dir``: listing, safe lookup, and per-run caches.

A run is ``<runs_dir>/<run_name>/`` with ``config.yaml``, ``trajectories/``, ``tb/`` and
``checkpoints/`` (docs/architecture.md, "Run directory"). Only direct sub-folders are served, so a
run name can never reach outside ``runs_dir``. Each run keeps one ``RunIndex`` and one tokenizer,
loaded on first use from the run's own model (``config.yaml`` ``model.name`` resolved by
``common/models.py``; the latest checkpoint's ``hf/`` when that fails).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.run_folder import checkpoint_folder, complete_steps
from envhub.ui.render import TokenText
from envhub.ui.stream_index import TRAINED_FILE, TRAJECTORIES_FILE, RunIndex


class UnknownRunError(LookupError):
    """No run folder of that name under ``runs_dir``."""


@dataclass
class TokenizerSlot:
    """A run's decoder (its tokenizer with a cache of token texts), or why there is none."""

    decoder: TokenText | None = None
    source: str = ""
    error: str = ""


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The run's resolved ``config.yaml`` as plain data ({} when missing or unreadable)."""
    try:
        loaded = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def describe_run(run_dir: Path) -> dict[str, Any]:
    """One entry of the run list: name, model, envs, stream sizes, checkpoints."""
    config = read_run_config(run_dir)
    section = lambda name: config.get(name) if isinstance(config.get(name), dict) else {}  # noqa: E731
    stream = run_dir / "trajectories" / TRAJECTORIES_FILE
    return {
        "name": run_dir.name,
        "model": section("model").get("name", ""),
        "envs": section("rollout").get("envs", []),
        "max_steps": section("run").get("max_steps"),
        "trajectory_bytes": stream.stat().st_size if stream.exists() else 0,
        "has_trained_record": (run_dir / "trajectories" / TRAINED_FILE).exists(),
        "checkpoints": complete_steps(run_dir),
        "modified_unix_s": run_dir.stat().st_mtime,
    }


class RunCatalog:
    """The runs under one folder, with a cached index and tokenizer per run."""

    def __init__(self, runs_dir: Path):
        self.runs_dir = Path(runs_dir).expanduser()
        self._indexes: dict[str, RunIndex] = {}
        self._tokenizers: dict[str, TokenizerSlot] = {}
        self._lock = threading.Lock()
        self._tokenizer_lock = threading.Lock()

    def list_runs(self) -> list[dict[str, Any]]:
        """Every run folder (one with a config.yaml or a trajectories/ folder), newest first."""
        if not self.runs_dir.is_dir():
            return []
        runs = [describe_run(path) for path in self.runs_dir.iterdir()
                if path.is_dir() and ((path / "config.yaml").exists() or (path / "trajectories").is_dir())]
        return sorted(runs, key=lambda run: run["modified_unix_s"], reverse=True)

    def run_dir(self, name: str) -> Path:
        """The folder of run ``name``; ``UnknownRunError`` for anything but a direct sub-folder."""
        candidate = self.runs_dir / name
        if name in ("", ".", "..") or "/" in name or "\\" in name or not candidate.is_dir():
            raise UnknownRunError(f"no run {name!r} under {self.runs_dir}")
        return candidate

    def index(self, name: str) -> RunIndex:
        """The run's index, brought up to date with what was appended since the last call."""
        run_dir = self.run_dir(name)
        with self._lock:
            index = self._indexes.setdefault(name, RunIndex(run_dir))
        index.refresh()
        return index

    def tokenizer(self, name: str) -> TokenizerSlot:
        """The run's tokenizer, loaded once (a failure is remembered and reported, not retried)."""
        run_dir = self.run_dir(name)
        with self._tokenizer_lock:
            if name not in self._tokenizers:
                self._tokenizers[name] = load_run_tokenizer(run_dir)
            return self._tokenizers[name]


def load_run_tokenizer(run_dir: Path) -> TokenizerSlot:
    """The tokenizer of the run's model, from its config, else from its latest checkpoint."""
    from common.models import load_tokenizer, resolve_model  # imports torch: only when a page needs text

    model = read_run_config(run_dir).get("model") or {}
    errors = []
    if model.get("name"):
        try:
            path = resolve_model(model["name"], model.get("cache_dir", ""))
            return TokenizerSlot(TokenText(load_tokenizer(path)), source=f"model {model['name']} ({path})")
        except Exception as error:  # a model folder that moved, a cache that is gone
            errors.append(f"model {model['name']!r}: {error}")
    for step in reversed(complete_steps(run_dir)):
        path = checkpoint_folder(run_dir, step) / "hf"
        try:
            return TokenizerSlot(TokenText(load_tokenizer(path)), source=f"checkpoint step {step}")
        except Exception as error:
            errors.append(f"checkpoint step {step}: {error}")
            break
    reasons = "; ".join(errors) or "config.yaml names no model and there is no checkpoint"
    return TokenizerSlot(error=f"no tokenizer for this run, token ids shown instead: {reasons}")
