"""Env options from ``envhub.env_options``: a mapping checked against the env's dataclass."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def parse_options(options_class: type[T], options: dict[str, Any], env_name: str) -> T:
    """Build ``options_class`` from ``options``; unknown keys are an error naming the valid ones."""
    valid = [field.name for field in dataclasses.fields(options_class)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"{env_name}: unknown option(s) {unknown}; valid options: {', '.join(valid)}")
    return options_class(**options)
