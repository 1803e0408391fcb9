"""Where longhorizon keeps what it builds once (models, indexes); importing this is cheap."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """$LONGHORIZON_CACHE, else ~/.cache/longhorizon."""
    return Path(os.environ.get("LONGHORIZON_CACHE", "~/.cache/longhorizon")).expanduser()


def cache_dir_or_default(cache_dir: str | Path) -> Path:
    """``cache_dir`` (``~`` expanded); empty: ``default_cache_dir()``."""
    return Path(cache_dir).expanduser() if str(cache_dir) else default_cache_dir()
