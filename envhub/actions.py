"""Reading an action out of a model's reply, in the paper's Thought/Action style.

Agents answer ``Thought: ... Action: <action>`` (AgentGym's format). ``extract_action`` returns
the action, or a ``MalformedAction`` whose ``feedback`` is the observation the env returns so
the agent learns what went wrong: a malformed reply is a wasted turn, never a crash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_ACTION_CHARS = 2000
_ACTION_MARK = re.compile(r"action\s*:", re.IGNORECASE)


@dataclass(frozen=True)
class MalformedAction:
    """Why a reply held no usable action; ``feedback`` is meant for the agent."""

    feedback: str


def extract_action(reply: str, require_marker: bool = True, max_chars: int = MAX_ACTION_CHARS) -> str | MalformedAction:
    """The text after the last ``Action:`` (first non-empty line of it), stripped.

    With ``require_marker=False`` a reply without ``Action:`` is taken whole (first line), so
    plain one-line answers also work.
    """
    if len(reply) > max_chars:
        return MalformedAction(f"Your reply was {len(reply)} characters; the limit is {max_chars}.")
    marks = list(_ACTION_MARK.finditer(reply))
    if marks:
        body = reply[marks[-1].end():]
    elif require_marker:
        return MalformedAction('No action found. End your reply with a line "Action: <your action>".')
    else:
        body = reply
    lines = [line.strip() for line in body.strip().splitlines() if line.strip()]
    if not lines:
        return MalformedAction('The action was empty. Write it after "Action:".')
    return lines[0]
