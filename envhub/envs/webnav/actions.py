"""WebArena's action grammar, parsed from a model's reply.

    click [id]   type [id] [text] [0|1]   hover [id]   press [key_comb]   scroll [up|down]
    goto [url]   go_back   go_forward   new_tab   tab_focus [n]   close_tab   stop [answer]

The reply may end with ``Action: <action>`` (the project's Thought/Action style) or put the
action in a fenced block as WebArena's prompts do (``In summary, ... ```click [12]```). ``type``
presses Enter afterwards unless its last argument is ``[0]``, as in WebArena. A reply that parses
to nothing gives a `BadAction` whose feedback is shown to the agent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envhub.actions import MalformedAction, extract_action

ACTION_HELP = (
    "Actions (one per turn): click [id], type [id] [text] [1] (the last argument 1 presses Enter after "
    "typing, 0 does not; default 1), hover [id], press [key_comb] (e.g. Control+a), scroll [up] or "
    "scroll [down], goto [url], go_back, go_forward, new_tab, tab_focus [tab_index], close_tab, "
    "stop [answer] (give the answer to a question, or stop [] when a task is done; "
    "stop [N/A] if the task is impossible)."
)
_FENCE = re.compile(r"```(?:\w*\n)?(.*?)```", re.DOTALL)
_NAMED = re.compile(r"^(\w+)(.*)$", re.DOTALL)
_TYPE = re.compile(r"^\[(\d+)\]\s*\[(.*)\]\s*\[([01])\]$|^\[(\d+)\]\s*\[(.*)\]$", re.DOTALL)
_ID = re.compile(r"^\[(\d+)\]$")
_NO_ARGUMENT = ("go_back", "go_forward", "new_tab", "close_tab")


@dataclass(frozen=True)
class WebAction:
    """One parsed action; unused fields keep their defaults."""

    kind: str
    element_id: int | None = None
    text: str = ""
    press_enter: bool = False
    clear_first: bool = True
    """type: replace the field's text (lenient); WebArena (the agentgym dialect) types where its click
    put the caret, so a prefilled field keeps its text."""

    def render(self) -> str:
        """The action as written in WebArena's grammar (shown as the observation's PREVIOUS ACTION)."""
        if self.kind == "type":
            return f"type [{self.element_id}] [{self.text}] [{int(self.press_enter)}]"
        if self.element_id is not None:
            return f"{self.kind} [{self.element_id}]"
        return self.kind if self.kind in _NO_ARGUMENT else f"{self.kind} [{self.text}]"


@dataclass(frozen=True)
class BadAction:
    """Why a reply is not an action; `feedback` is shown to the agent."""

    feedback: str


def parse_reply(reply: str) -> WebAction | BadAction:
    """The action in a model's reply (fenced block, ``Action:`` line, or the whole first line)."""
    fenced = _FENCE.findall(reply)
    if fenced and fenced[-1].strip():
        text = fenced[-1].strip()
    else:
        extracted = extract_action(reply, require_marker=False)
        if isinstance(extracted, MalformedAction):
            return BadAction(f"{extracted.feedback} {ACTION_HELP}")
        text = extracted.strip("` ")
    return parse_action(text)


def parse_action(text: str) -> WebAction | BadAction:
    """Parse one action string of WebArena's grammar."""
    match = _NAMED.match(text.strip())
    if match is None:
        return BadAction(f"Cannot parse {text[:80]!r}. {ACTION_HELP}")
    kind, rest = match.group(1).lower(), match.group(2).strip()
    if kind in _NO_ARGUMENT:
        return WebAction(kind) if not rest else BadAction(f"{kind} takes no argument.")
    if kind in ("click", "hover"):
        found = _ID.match(rest)
        return WebAction(kind, int(found.group(1))) if found else BadAction(f"Write {kind} [id], e.g. {kind} [12].")
    if kind == "type":
        return _parse_type(rest)
    bracketed = rest[1:-1] if rest.startswith("[") and rest.endswith("]") else None
    if kind == "stop":
        return WebAction("stop", text=bracketed.strip() if bracketed is not None else rest)
    if bracketed is None or kind not in ("press", "scroll", "goto", "tab_focus"):
        return BadAction(f"Unknown action {text[:80]!r}. {ACTION_HELP}")
    return _parse_bracketed(kind, bracketed.strip())


def _parse_type(rest: str) -> WebAction | BadAction:
    found = _TYPE.match(rest)
    if found is None:
        return BadAction("Write type [id] [text] [1], e.g. type [12] [blue shoes] [1].")
    if found.group(1) is not None:
        return WebAction("type", int(found.group(1)), found.group(2), found.group(3) == "1")
    return WebAction("type", int(found.group(4)), found.group(5), True)


def _parse_bracketed(kind: str, argument: str) -> WebAction | BadAction:
    if kind == "scroll":
        direction = argument.lower().removeprefix("direction=")
        return WebAction("scroll", text=direction) if direction in ("up", "down") else BadAction(
            "Write scroll [up] or scroll [down].")
    if kind == "tab_focus":
        return WebAction("tab_focus", text=argument) if argument.isdigit() else BadAction(
            "Write tab_focus [n] with the tab's index, e.g. tab_focus [0].")
    if not argument:
        return BadAction(f"{kind} needs an argument inside the brackets.")
    return WebAction(kind, text=argument)
