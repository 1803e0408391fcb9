"""Where longhorizon keeps what it builds once (models, indexes); importing this is cheap."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """$LONGHORIZON_CACHE, else ~/.cache/longhorizon."""
    return Path(os.environ.get("LONGHORIZON_CACHE", "~/.cache/longhorizon")).expanduser()
