"""From a model's reply to the ``action`` an AgentGym server receives, per family (families.py).

Each parser follows the ``step`` of the family's AgentGym client (agentenv/agentenv/envs/<env>.py and
``BaseAdapter.parse_react`` in agentenv/agentenv/controller/utils.py). Where AgentGym answers a reply
it cannot use without calling the server, the parser returns that answer as a ``Feedback``: the turn
is spent, the server is not called, AgentGym's score for the step is 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envhub.actions import MalformedAction, extract_action

ONE_ACTION_ONLY = "Error: Only one 'Action' is allowed per response. Please adjust your response."
"""TextCraft's and BabyAI's clients, word for word."""

NO_BACKTICKS = ("Cannot parse action from response. Your action should be inside triple backticks (```). "
                "Please adjust accordingly.")
"""WebArena's client, word for word."""

_SINGLE_LINE_ACTION = re.compile(r"Action:\s*(.*?)(?=\n|$)", re.DOTALL)
_NOT_ALPHANUMERIC = re.compile(r"[^A-Za-z0-9, ]+")
_BACKTICKED = re.compile(r"```(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Feedback:
    """The reply held nothing to send; ``observation`` tells the agent why."""

    observation: str


@dataclass(frozen=True)
class NoAction:
    """The reply held no action. AgentGym's client then sends the server an empty action, and the
    server's answer to it is what the agent reads: so does the adapter, counting the turn unparsed."""


def action_from_reply(action_format: str, reply: str) -> str | Feedback | NoAction:
    """The action to send for ``reply`` under ``action_format``, or the feedback instead."""
    return _PARSERS[action_format](reply)


def _thought_action(reply: str) -> str | Feedback:
    parsed = extract_action(reply)  # envhub's own: the first line after the last "Action:"
    return Feedback(parsed.feedback) if isinstance(parsed, MalformedAction) else parsed


def _react(reply: str) -> str | NoAction:
    # BaseAdapter.parse_react: everything after the last "Action:", stripped; WebShop's bare
    # search[...]/click[...] replies pass whole.
    before, marker, action = reply.rpartition("Action:")
    if marker:
        return action.strip()
    if "search[" in reply or "click[" in reply:
        return reply.strip()
    return NoAction()


def single_line_client_action(reply: str) -> str | None:
    """What AgentGym's TextCraft and BabyAI clients send for ``reply`` (``TextCraftEnvClient.step``,
    ``BabyAIEnvClient.step``): the one ``Action:`` line, "" when there is none, every character
    outside ``[A-Za-z0-9, ]`` removed (not spaced) and whitespace collapsed. ``None``: two or more
    ``Action:`` lines, which the client answers itself with ``ONE_ACTION_ONLY``."""
    matches = _SINGLE_LINE_ACTION.findall(reply)
    if len(matches) > 1:
        return None
    return " ".join(_NOT_ALPHANUMERIC.sub("", matches[-1] if matches else "").split())


def _react_single_line(reply: str) -> str | Feedback | NoAction:
    action = single_line_client_action(reply)
    if action is None:
        return Feedback(ONE_ACTION_ONLY)
    return action if _SINGLE_LINE_ACTION.search(reply) else NoAction()


def _react_first(reply: str) -> str:
    # MazeEnvClient.step / WordleEnvClient.step: the text after the first "Action:", else the reply.
    parts = reply.split("Action:")
    return (parts[1] if len(parts) > 1 else parts[0]).strip()


def _sql_block(reply: str) -> str:
    # SqlGymEnvClient.step: the last ```sql block (the reply itself when it has none).
    return reply.split("```sql")[-1].split("```")[0].strip()


def _backticked(reply: str) -> str | Feedback:
    # WebarenaEnvClient.step: the server parses the reply itself, once it holds a ``` block.
    return reply if _BACKTICKED.search(reply) else Feedback(NO_BACKTICKS)


def _raw(reply: str) -> str:
    return reply  # SearchQA and the tool servers parse <search>/<answer> and "Action:" themselves


_PARSERS = {"thought_action": _thought_action, "react": _react, "react_single_line": _react_single_line,
            "react_first": _react_first, "sql_block": _sql_block, "backticked": _backticked, "raw": _raw}
