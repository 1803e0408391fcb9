"""envhub/deadline.py: env calls that never wait run without a timer; the others keep their deadline."""

import asyncio

import pytest

from envhub.deadline import DeadlinePassed, within_deadline


async def _returns_at_once() -> str:
    return "done"


async def _waits_then_returns(wait_s: float, value: str) -> str:
    await asyncio.sleep(wait_s)
    await asyncio.sleep(0)  # a bare yield to the loop too
    return value


def test_a_call_that_never_waits_and_one_that_waits_both_return_their_value() -> None:
    async def body() -> list[str]:
        at_once = await within_deadline(_returns_at_once(), 1.0)
        return [at_once, await within_deadline(_waits_then_returns(0.01, "w"), 1.0)]

    assert asyncio.run(body()) == ["done", "w"]


def test_a_call_past_its_deadline_is_cancelled_and_reported() -> None:
    cleaned_up = []

    async def stuck() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned_up.append(True)

    async def body() -> float:
        started_s = asyncio.get_running_loop().time()
        with pytest.raises(DeadlinePassed):
            await within_deadline(stuck(), 0.05)
        return asyncio.get_running_loop().time() - started_s

    assert asyncio.run(body()) < 5 and cleaned_up == [True]


def test_the_envs_own_errors_pass_through_as_themselves() -> None:
    async def own_timeout() -> None:
        await asyncio.sleep(0)
        raise TimeoutError("the env's backend timed out")

    async def fails_at_once() -> None:
        raise ValueError("bad at once")

    async def body() -> None:
        with pytest.raises(TimeoutError, match="backend"):
            await within_deadline(own_timeout(), 5.0)
        with pytest.raises(ValueError, match="at once"):
            await within_deadline(fails_at_once(), 5.0)

    asyncio.run(body())


def test_cancelling_the_caller_cancels_the_waiting_call() -> None:
    cancelled = []

    async def waits() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def body() -> None:
        task = asyncio.ensure_future(within_deadline(waits(), 60.0))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(body())
    assert cancelled == [True]
