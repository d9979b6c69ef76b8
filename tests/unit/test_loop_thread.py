"""LoopThread.run, the hand-off of every synchronous call to the client's event loop: what the caller gets back."""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
import threading

import pytest
from workload import wait_until

from tidemark.client import runtime
from tidemark.client.errors import ClientStateError, RequestTimeoutError
from tidemark.client.runtime import LoopThread


@pytest.fixture(scope="module")
def loop_thread():
    thread = LoopThread("test")
    thread.start()
    yield thread
    thread.stop()


def test_the_caller_gets_the_result_or_the_exception_itself(loop_thread):
    async def answer():
        await asyncio.sleep(0)
        return 42

    async def fail():
        raise ValueError("bad")

    assert loop_thread.run(answer()) == 42
    with pytest.raises(ValueError, match="bad"):
        loop_thread.run(fail(), timeout=5)


def test_a_call_past_its_timeout_is_cancelled_on_the_loop(loop_thread):
    cancelled = asyncio.Event()  # (used on the loop only)

    async def hang():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(RequestTimeoutError, match="no answer within"):
        loop_thread.run(hang(), timeout=0.05)
    loop_thread.run(cancelled.wait(), timeout=5)
    with pytest.raises(RequestTimeoutError):  # a deadline already past, as a concurrent future took it
        loop_thread.run(asyncio.Event().wait(), timeout=-1.5)


def test_a_caller_interrupted_while_waiting_cancels_its_call(loop_thread, monkeypatch):
    started, cancelled = threading.Event(), threading.Event()

    async def send():
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def interrupted(call, timeout):  # Ctrl-C while the caller waits, once the call is under way
        started.wait(5)
        raise KeyboardInterrupt
    monkeypatch.setattr(runtime._BlockingCall, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        loop_thread.run(send(), timeout=5)
    assert cancelled.wait(5)  # not left to finish (a send going out after the caller gave up)


def test_a_coroutine_cancelled_on_the_loop_or_timing_out_itself_is_reported_as_before(loop_thread):
    async def cancelled():
        raise asyncio.CancelledError

    async def own_timeout():
        async with asyncio.timeout(0):
            await asyncio.sleep(1)

    with pytest.raises(concurrent.futures.CancelledError):
        loop_thread.run(cancelled(), timeout=5)
    with pytest.raises(RequestTimeoutError):
        loop_thread.run(own_timeout(), timeout=5)


def test_a_blocking_call_from_the_loop_itself_or_a_stopped_loop_is_refused():
    thread = LoopThread("short")
    thread.start()

    async def nested():
        coro = asyncio.sleep(0)
        with pytest.raises(ClientStateError, match="its own event loop thread"):
            thread.run(coro)
        return True

    assert thread.run(nested(), timeout=5)
    thread.stop()
    with pytest.raises(ClientStateError, match="not running"):
        thread.run(asyncio.sleep(0))


def test_a_call_that_timed_out_finishes_its_cleanup_before_the_loop_stops():
    """A start() past its timeout is cancelled, then the loop stopped: the cancelled coroutine's cleanup
    (closing the channels it opened, which takes a few turns of the loop and tasks of its own) runs to
    its end, instead of being cancelled a second time half-way by the loop's stop."""
    thread = LoopThread("cleanup")
    thread.start()
    closing, closed = threading.Event(), threading.Event()

    async def close_channels():
        closing.set()
        await asyncio.sleep(0.2)  # (a channel's close: round trips on the loop)
        closed.set()

    async def start():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.gather(close_channels())  # (a task of its own, which the stop must not cancel either)
            raise

    with pytest.raises(RequestTimeoutError):
        thread.run(start(), timeout=0.05)
    assert closing.wait(5)  # (the stop comes while the cleanup runs, as it does after a consumer's start)
    thread.stop()
    assert closed.is_set()


def test_a_call_cancelled_and_stopped_before_it_ran_still_runs_its_cleanup():
    """The loop was busy while the call, its cancel (past the timeout) and the stop all reached it: the
    coroutine was cancelled before its first step, so none of its cleanup ran (a consumer's start never
    closed the connections connect() had handed it)."""
    thread = LoopThread("unstarted")
    thread.start()
    hold, held = threading.Event(), threading.Event()
    events: list[str] = []

    def busy() -> None:
        held.set()
        hold.wait(10)

    async def start():
        try:
            events.append("started")
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # (a cleanup of a few turns)
            events.append("cleaned up")

    thread.loop.call_soon_threadsafe(busy)
    assert held.wait(5)
    with pytest.raises(RequestTimeoutError):
        thread.run(start(), timeout=0.05)
    stopping = threading.Thread(target=thread.stop)
    stopping.start()
    wait_until(lambda: any(f.f_code.co_name == "join" for f in _frames(stopping)), 5,
               "stop() to wait for the loop thread (its stop on the loop's queue)", interval=0.001)
    hold.set()
    stopping.join(10)
    assert events == ["started", "cleaned up"]


def _frames(thread: threading.Thread) -> list:
    frame, frames = sys._current_frames().get(thread.ident), []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames
