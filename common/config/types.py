"""The value types and the section decorator every config section is written with.

Sections are pydantic v2 dataclasses (``section``): still stdlib dataclasses (``dataclasses.replace``,
``asdict`` and ``fields`` work, and ``replace`` validates again), with unknown keys refused and
every field checked against its type and its constraint where the value is set. Scalars are strict
where YAML's own reading is what a user meant: ``3`` is no bool, ``true`` no int, ``2.0`` no int,
and no number is NaN or infinite. Two readings are kept from YAML: ``1e-3`` (no dot, which YAML 1.1
reads as a string) is a float, and a number where text is wanted (``run_name: 42``) is that text.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

from annotated_types import Ge, Gt, Le, Lt, MinLen
from pydantic import BeforeValidator, ConfigDict, Discriminator, Strict, Tag
from pydantic.dataclasses import dataclass


def _float_from_text(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value  # left for the float check to refuse, saying what it got
    return value


def _text_from_number(value: Any) -> Any:
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


Int = Annotated[int, Strict()]
Float = Annotated[float, Strict(), BeforeValidator(_float_from_text)]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict(), BeforeValidator(_text_from_number)]

Count = Annotated[Int, Ge(1)]
"""An integer >= 1."""
NonNegativeInt = Annotated[Int, Ge(0)]
"""An integer >= 0 (0 most often: off)."""
Positive = Annotated[Float, Gt(0)]
"""A float > 0."""
NonNegative = Annotated[Float, Ge(0)]
"""A float >= 0 (0 most often: off)."""
Share = Annotated[Float, Ge(0), Le(1)]
"""A float in [0, 1]."""
Port = Annotated[Int, Ge(0), Le(65535)]
"""A TCP port; 0 asks the OS for a free one."""

__all__ = ["Bool", "Count", "Discriminator", "Float", "Ge", "Gt", "Int", "Le", "Lt", "MinLen", "NonNegative",
           "NonNegativeInt", "Port", "Positive", "Share", "Str", "Tag", "section"]

section = functools.partial(dataclass, frozen=True,
                            config=ConfigDict(extra="forbid", allow_inf_nan=False))
"""The decorator of a config section: a frozen pydantic dataclass that refuses unknown keys."""
