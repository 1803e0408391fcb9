"""Options of `AgentGymEnv`: the server's address, its family, the task list and what the agent reads.

Set them in ``envhub.env_options`` (or as defaults on a ``register`` line). The protocol fields of
the chosen family (families.py) can each be overridden by an option of the same name; an option
left unset (None) keeps the family's value.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, get_args

from envhub.base import ACKNOWLEDGEMENT, ConversationStart
from envhub.envs.agentgym_protocol.families import (
    ActionFormat,
    DoneRule,
    FirstObservation,
    ServerFamily,
    SuccessRule,
    family_named,
)
from envhub.options import OptionsError, parse_options

_CLOSED_SETS = {"action_format": ActionFormat, "first_observation": FirstObservation, "done_rule": DoneRule,
                "success_rule": SuccessRule}
_TEXT_FIELDS = ("route_prefix", "id_field", "task_field", "observation_field", "score_field", "close_path",
                "reset_failure_observation")


@dataclass(frozen=True)
class AgentGymOptions:
    """Options of `AgentGymEnv` (set them in ``envhub.env_options`` or on the ``register`` line)."""

    url: str = ""
    """Base URL of the AgentGym env server, e.g. ``http://127.0.0.1:36001`` (required): the server's
    root, also for LMRL-Gym (the family adds ``/maze`` or ``/wordle``)."""

    family: str = "custom"
    """The server's family (envhub/envs/agentgym_protocol/families.py): textcraft, babyai, sciworld,
    webshop, alfworld, sqlgym, maze, wordle, webarena, searchqa, academia, movie, todo, sheet, weather,
    or custom (a server shaped like AgentGym's; set the protocol options below yourself)."""

    timeout_s: float = 60.0
    """HTTP timeout of one call to the server (envhub's ``step_timeout_s`` also applies)."""

    num_tasks: int | None = None
    """Tasks the server offers: data indices 0..num_tasks-1, all in split ``train``. Needed for an
    id registered with ``splits=None`` (like ``agentgym-v0``), unless ``splits`` is given."""

    splits: dict[str, list[int]] | None = None
    """Instead of ``num_tasks``: split name -> ``[start, stop]`` (half-open, like ``range``). On a
    ``register`` line use register's own ``splits=`` (ranges) instead: that name is taken there."""

    # Protocol overrides: None keeps the family's value (families.py documents each).
    route_prefix: str | None = None
    create_body: dict[str, Any] | None = None
    id_field: str | None = None
    task_field: str | None = None
    reset_body: dict[str, Any] | None = None
    first_observation: str | None = None
    reset_failure_observation: str | None = None
    observation_field: str | None = None
    done_rule: str | None = None
    score_field: str | None = None
    score_scale: float | None = None
    cumulative_score: bool | None = None
    success_rule: str | None = None
    action_format: str | None = None
    close_path: str | None = None
    max_server_envs: int | None = None

    instruction: str = ""
    """The env's instruction, shown as its own user turn before the first observation: paste the
    ``conversation_start`` text of the server's AgentGym client (agentenv/envs/<env>.py)."""

    acknowledgement: str = ACKNOWLEDGEMENT
    """The assistant's reply to the instruction (AgentGym's clients: "OK. I'll follow ..." or "Ok.")."""

    examples: list[list[list[str]]] = field(default_factory=list)
    """Worked examples: each a list of ``[observation, reply]`` turns in the server's action format."""

    default_examples: int = 0
    """Examples shown when the run does not say (``rollout.num_examples``)."""

    def __post_init__(self) -> None:
        if not self.url:
            raise OptionsError("agentgym: needs option 'url' (the AgentGym env server's address, "
                               "e.g. http://127.0.0.1:36001)")
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise OptionsError(f"agentgym: option url must be an http(s) URL of an AgentGym server, got {self.url!r}")
        if not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            raise ValueError(f"agentgym: timeout_s must be > 0, got {self.timeout_s!r}")
        if self.num_tasks is not None and self.splits is not None:
            raise ValueError("agentgym: set num_tasks or splits, not both")
        if self.num_tasks is not None or self.splits is not None:
            self.task_splits()  # validates them now rather than at the first session
        self.protocol()
        self.conversation_start()

    def protocol(self) -> ServerFamily:
        """The family's protocol with the overrides applied (``ValueError`` naming a bad one)."""
        family = family_named(self.family)
        overrides = {f.name: getattr(self, f.name) for f in dataclasses.fields(ServerFamily)
                     if f.name not in ("name", "source") and getattr(self, f.name) is not None}
        for name, value in overrides.items():
            _check_override(name, value)
        return dataclasses.replace(family, **overrides)

    def conversation_start(self) -> ConversationStart:
        """The instruction and examples given in the options (``ValueError`` if malformed)."""
        if not all(isinstance(turn, list) and len(turn) == 2 for example in self.examples for turn in example):
            raise ValueError("agentgym: examples must be lists of [observation, reply] turns")
        return ConversationStart(self.instruction, self.acknowledgement,
                                 tuple(tuple(tuple(turn) for turn in example) for example in self.examples),
                                 self.default_examples)

    def task_splits(self) -> dict[str, range]:
        """Task indices per split, from ``num_tasks`` or ``splits``."""
        if self.num_tasks is None and self.splits is None:
            raise ValueError("agentgym: the task list is unknown; set num_tasks (an int) or "
                             "splits ({name: [start, stop]}) in envhub.env_options")
        if self.num_tasks is not None:
            if isinstance(self.num_tasks, bool) or not isinstance(self.num_tasks, int) or self.num_tasks < 1:
                raise ValueError(f"agentgym: num_tasks must be an int >= 1, got {self.num_tasks!r}")
            return {"train": range(self.num_tasks)}
        if not isinstance(self.splits, dict) or not self.splits:
            raise ValueError(f"agentgym: splits must map split names to [start, stop], got {self.splits!r}")
        return {name: _split_range(name, bounds) for name, bounds in self.splits.items()}

    @classmethod
    def parse(cls, options: dict[str, Any]) -> AgentGymOptions:
        """Options from a mapping; unknown keys are an error naming the valid ones."""
        return parse_options(cls, options, "agentgym")


def _check_override(name: str, value: Any) -> None:
    if name in _CLOSED_SETS and value not in get_args(_CLOSED_SETS[name]):
        raise ValueError(f"agentgym: {name} must be one of {get_args(_CLOSED_SETS[name])}, got {value!r}")
    if name in _TEXT_FIELDS and not isinstance(value, str):
        raise ValueError(f"agentgym: {name} must be text, got {value!r}")
    if name in ("create_body", "reset_body") and not isinstance(value, dict):
        raise ValueError(f"agentgym: {name} must be a mapping (a JSON object), got {value!r}")
    if name == "score_scale" and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
        raise ValueError(f"agentgym: score_scale must be a number > 0, got {value!r}")
    if name == "cumulative_score" and not isinstance(value, bool):
        raise ValueError(f"agentgym: cumulative_score must be true or false, got {value!r}")
    if name == "max_server_envs" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"agentgym: max_server_envs must be an int >= 1, got {value!r}")


def _split_range(name: str, bounds: Any) -> range:
    valid = (isinstance(bounds, (list, tuple)) and len(bounds) == 2
             and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds) and 0 <= bounds[0] < bounds[1])
    if not valid:
        raise ValueError(f"agentgym: split {name!r} must be [start, stop] with 0 <= start < stop, got {bounds!r}")
    return range(bounds[0], bounds[1])
