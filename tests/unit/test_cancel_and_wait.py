"""cancel_and_wait (common/scheduler.py): the tasks it cancels have finished when it returns, even when
its caller is cancelled while it waits (the caller's cancellation then propagates)."""

from __future__ import annotations

import asyncio

import pytest

from tidemark.common.scheduler import cancel_and_wait


async def slow_to_stop(stopped: list[str]) -> None:
    try:
        await asyncio.sleep(3600)
    finally:
        await asyncio.sleep(0.05)  # its clean-up takes a moment (closing what it read from)
        stopped.append("child")


def test_a_cancelled_caller_returns_only_once_the_tasks_have_finished():
    async def scenario() -> None:
        stopped: list[str] = []
        child = asyncio.create_task(slow_to_stop(stopped))
        await asyncio.sleep(0)

        async def caller() -> None:
            try:
                await cancel_and_wait(child)
            finally:
                stopped.append("caller")

        outer = asyncio.create_task(caller())
        await asyncio.sleep(0.01)  # the caller waits for the child's clean-up
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        assert stopped == ["child", "caller"]
        assert child.cancelled()

    asyncio.run(scenario())


def test_failures_are_retrieved_and_none_and_finished_tasks_are_skipped():
    async def scenario() -> None:
        async def fails() -> None:
            raise ValueError("reported where it happened")

        failed = asyncio.create_task(fails())
        await asyncio.sleep(0)
        sleeper = asyncio.create_task(asyncio.sleep(3600))
        await cancel_and_wait(None, failed, sleeper)
        assert failed.done() and sleeper.cancelled()

    asyncio.run(scenario())
