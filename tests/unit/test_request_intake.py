"""The request byte budget and the stream accounting of broker/services/intake.py."""

from __future__ import annotations

import asyncio

import pytest

from tidemark.broker.errors import InvalidArgumentError
from tidemark.broker.services.intake import RequestBudget, RequestIntake, _Unpacker


def test_unary_requests_past_the_budget_are_refused_but_small_ones_always_get_in():
    budget = RequestBudget(100, small=10)
    assert budget.try_take(80)
    assert not budget.try_take(30)
    assert budget.try_take(10)  # a heartbeat still gets in
    assert (budget.held, budget.refused) == (90, 1)
    budget.give(90)
    assert budget.try_take(500)  # larger than the whole budget, but nothing else is held


def test_a_streamed_message_waits_for_room_and_gets_in_when_it_is_given_back():
    async def scenario():
        budget = RequestBudget(100, small=10)
        budget.try_take(90)
        waiting = asyncio.create_task(budget.take(50))
        await asyncio.sleep(0)
        assert not waiting.done()
        budget.give(90)
        await asyncio.wait_for(waiting, 1)
        assert budget.held == 50

    asyncio.run(scenario())


class _Stream:
    """A request stream the test feeds by hand."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        return item


def test_an_idle_stream_holds_no_budget_and_an_abandoned_one_gives_its_message_back():
    async def scenario():
        intake = RequestIntake(RequestBudget(1000, small=0))
        unpack = _Unpacker(intake, "/m", lambda raw: raw.decode(), "T")
        source = _Stream()
        stream = unpack.stream(source, context=None)
        await source.queue.put(b"x" * 400)
        assert await stream.__anext__() == "x" * 400
        assert intake.budget.held == 400  # the handler is working on it
        next_one = asyncio.create_task(stream.__anext__())
        await asyncio.sleep(0)
        assert intake.budget.held == 0  # asked for the next one, which has not come: idle, holds nothing
        await source.queue.put(b"y" * 300)
        assert await next_one == "y" * 300 and intake.budget.held == 300
        await stream.aclose()  # the handler stopped early (an abort)
        assert intake.budget.held == 0

    asyncio.run(scenario())


def test_an_undecodable_stream_message_is_a_domain_error_and_is_logged_once_per_interval():
    async def scenario():
        intake = RequestIntake(RequestBudget(1000))

        def decode(raw: bytes) -> str:
            raise ValueError("bad bytes")

        unpack = _Unpacker(intake, "/m", decode, "tidemark.v1.T")
        source = _Stream()
        for _ in range(3):
            await source.queue.put(b"\xff")
            stream = unpack.stream(source, context=None)
            with pytest.raises(InvalidArgumentError, match=r"could not be decoded as tidemark.v1.T"):
                await stream.__anext__()
            await stream.aclose()
        assert intake.undecodable == 3 and intake.budget.held == 0

    asyncio.run(scenario())


def test_the_end_of_a_burst_of_large_requests_is_reported_once_so_memory_can_be_given_back():
    bursts = []
    budget = RequestBudget(100 << 20, small=1024, on_burst_over=lambda: bursts.append(budget.held))
    for _ in range(3):  # small requests never make a burst
        budget.try_take(100)
        budget.give(100)
    assert bursts == []
    for _ in range(9):  # 36 MiB of large requests, one at a time
        budget.try_take(4 << 20)
        budget.give(4 << 20)
    assert bursts == [0]  # once, when nothing was held any more
