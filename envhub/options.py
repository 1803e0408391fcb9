"""Env options from ``envhub.env_options``: a mapping checked against the env's dataclass."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


class OptionsError(ValueError):
    """An env cannot serve a request under its options: a missing or invalid option, or a task the
    options rule out. envhub answers 400 with the message; any other exception an env raises while
    running an episode is the env's own failure (500)."""


OPTION_ERRORS = (ValueError, TypeError, FileNotFoundError, NotADirectoryError)
"""What building an env or its task list raises for bad options: envs check their options with
ValueError (`OptionsError` among them), Python refuses an unknown keyword with TypeError, and a
path option that names nothing is FileNotFoundError. The server answers these 400, not 500."""


def parse_options(options_class: type[T], options: dict[str, Any], env_name: str) -> T:
    """Build ``options_class`` from ``options``; unknown keys are an error naming the valid ones."""
    valid = [field.name for field in dataclasses.fields(options_class)]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise OptionsError(f"{env_name}: unknown option(s) {unknown}; valid options: {', '.join(valid)}")
    return options_class(**options)
