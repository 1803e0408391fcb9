"""Worked examples played through the env itself, so their observations are the env's own words.

An env's ``conversation_start`` may show a won episode before the first observation. Written by
hand, such an example drifts from what the env really says; played here by a scripted policy on a
training task, it cannot. The play runs on a private event loop in a worker thread, so it works
from the server's running loop too (the registry caches the result per env and options).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from envhub.base import Environment

Policy = Callable[[str], str]
"""Observation -> reply, in the env's exact reply format; one per episode (it may remember)."""


def play_worked_example(make_env: Callable[[], Environment], task_ids: list[str],
                        new_policy: Callable[[str], Policy], min_turns: int = 1,
                        max_turns: int = 6) -> tuple[tuple[str, str], ...]:
    """(observation, reply) turns of the first task in ``task_ids`` that ``new_policy(task_id)`` wins
    in ``min_turns`` to ``max_turns`` turns; ``ValueError`` if it wins none."""
    [example] = play_worked_examples(make_env, task_ids, new_policy, 1, min_turns=min_turns, max_turns=max_turns)
    return example


def play_worked_examples(make_env: Callable[[], Environment], task_ids: list[str],
                         new_policy: Callable[[str], Policy], count: int,
                         distinct_by: Callable[[str], str] = lambda observation: observation,
                         min_turns: int = 1, max_turns: int = 6) -> tuple[tuple[tuple[str, str], ...], ...]:
    """The first ``count`` wins, in ``task_ids`` order, whose first observations differ under
    ``distinct_by`` (e.g. the goal they name); ``ValueError`` if fewer are won."""
    with ThreadPoolExecutor(1, thread_name_prefix="worked-example") as pool:
        play = _distinct_wins(make_env, task_ids, new_policy, count, distinct_by, range(min_turns, max_turns + 1))
        return pool.submit(asyncio.run, play).result()


async def _distinct_wins(make_env: Callable[[], Environment], task_ids: list[str],
                         new_policy: Callable[[str], Policy], count: int, distinct_by: Callable[[str], str],
                         turns_allowed: range) -> tuple[tuple[tuple[str, str], ...], ...]:
    env, wins = make_env(), {}
    try:
        for task_id in task_ids:
            turns = await _play(env, task_id, new_policy(task_id), turns_allowed.stop - 1)
            if len(turns) in turns_allowed:
                wins.setdefault(distinct_by(turns[0][0]), turns)
                if len(wins) == count:
                    return tuple(wins.values())
    finally:
        await env.close()
    raise ValueError(f"the scripted policy won {len(wins)} distinct of {len(task_ids)} tasks in "
                     f"{turns_allowed.start} to {turns_allowed.stop - 1} turns; {count} needed")


async def _play(env: Environment, task_id: str, policy: Policy, max_turns: int) -> tuple[tuple[str, str], ...]:
    observation, _ = await env.reset(task_id, 0)
    turns = []
    for _ in range(max_turns):
        reply = policy(observation)
        turns.append((observation, reply))
        result = await env.step(reply)
        if result.terminated or result.truncated:
            return tuple(turns) if result.info.get("success") else ()
        observation = result.observation
    return ()
