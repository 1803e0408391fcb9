"""The one command-line path of every entry point (``launch.py``, ``python -m envhub``, ``envhub.main``):
its own flags through argparse, every ``--section.key value`` (or ``--section.key=value``) kept apart
as a config override, then the config loaded once, a bad one refused through the parser (exit 2,
the dotted key named).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from common.config import Config, ConfigError, load_config


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate ``--section.key value`` / ``--section.key=value`` overrides from a command's own flags."""
    own, overrides, index = [], [], 0
    while index < len(argv):
        arg = argv[index]
        is_override = arg.startswith("--") and "." in arg.split("=", 1)[0]
        takes_value = is_override and "=" not in arg and index + 1 < len(argv)
        (overrides if is_override else own).extend(argv[index:index + 1 + takes_value])
        index += 1 + takes_value
    return own, overrides


def parse_command_line(parser: argparse.ArgumentParser, argv: Sequence[str],
                       short_section: str = "") -> tuple[argparse.Namespace, list[str]]:
    """(the parser's flags, the config overrides). With ``short_section``, a flag the parser does not
    know is that section's key: ``--port 8000`` means ``--envhub.port 8000`` (``-`` read as ``_``)."""
    own, overrides = split_overrides(argv)
    if not short_section:
        return parser.parse_args(own), overrides
    args, rest = parser.parse_known_args(own)
    return args, [_qualified(arg, short_section) for arg in rest] + overrides


def _qualified(arg: str, section: str) -> str:
    if not arg.startswith("--"):
        return arg  # a flag's value
    key, equals, value = arg[2:].partition("=")
    return f"--{section}.{key.replace('-', '_')}{equals}{value}"


def load_or_exit(parser: argparse.ArgumentParser, path: str | None, overrides: Sequence[str]) -> Config:
    """The config of ``path`` plus ``overrides``; a config error ends the command as a usage error."""
    try:
        return load_config(path, list(overrides))
    except ConfigError as error:
        parser.error(str(error))
