"""Env calls under a deadline, at no cost for the calls that never wait.

Most env steps compute and return without awaiting anything (TextCraft, BabyAI, KeyDoor). Arming
a timer on each (``asyncio.timeout``, or ``wait_for``, which also runs the call as a task of its
own on Python 3.11) cost as much server time as the TextCraft step itself. `within_deadline` runs
the call up to its first wait, and arms the deadline only if there is one; a call that never waits
cannot be interrupted by any deadline anyway, as it holds the event loop until it returns.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine
from typing import Any


class DeadlinePassed(Exception):
    """The call was still waiting when its deadline came; it has been cancelled."""


async def within_deadline(coroutine: Coroutine[Any, Any, Any], timeout_s: float) -> Any:
    """``await coroutine``, cancelled `timeout_s` after the start with `DeadlinePassed` (an env's own
    ``TimeoutError`` passes through as itself)."""
    deadline_at = asyncio.get_running_loop().time() + timeout_s
    try:
        waiting_on = coroutine.send(None)
    except StopIteration as finished:
        return finished.value
    deadline = asyncio.timeout_at(deadline_at)
    try:
        async with deadline:
            return await _resumed(coroutine, waiting_on)
    except TimeoutError:
        if deadline.expired():
            raise DeadlinePassed(f"still waiting after {timeout_s:g}s") from None
        raise


@types.coroutine
def _resumed(coroutine: Coroutine[Any, Any, Any], waiting_on: Any) -> Any:
    """The rest of `coroutine`, which has run up to a wait on `waiting_on`: hands that to the event
    loop, then relays to the coroutine what the loop sends or throws (the deadline's cancellation
    included), as ``await coroutine`` would have done from its start."""
    while True:
        try:
            sent = yield waiting_on
        except BaseException as thrown:  # relayed, not swallowed: CancelledError, GeneratorExit
            try:
                waiting_on = coroutine.throw(thrown)
            except StopIteration as finished:
                return finished.value
        else:
            try:
                waiting_on = coroutine.send(sent)
            except StopIteration as finished:
                return finished.value
