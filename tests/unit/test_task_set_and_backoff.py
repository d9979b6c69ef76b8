"""TaskSet (common/scheduler.py) and Backoff (common/backoff.py): the client's owned background tasks and
its one retry policy."""

from __future__ import annotations

import asyncio
import logging

from hypothesis import given
from hypothesis import strategies as st

from tidemark.common.backoff import Backoff
from tidemark.common.scheduler import TaskSet


def test_a_failure_is_logged_once_where_it_happens_and_close_cancels_the_rest(caplog):
    async def scenario():
        tasks = TaskSet("job_failed", "job failed", group="g")
        started = asyncio.Event()

        async def fail():
            raise ValueError("boom")

        async def forever():
            started.set()
            await asyncio.Event().wait()

        failing = tasks.spawn(fail(), name="failing")
        running = tasks.spawn(forever(), name="running")
        await asyncio.wait([failing])
        await started.wait()
        assert len(tasks) == 1
        await tasks.close()
        assert running.cancelled() and len(tasks) == 0
        late = fail()
        assert tasks.spawn(late) is None  # closed: refused, its coroutine closed unstarted
        assert late.cr_frame is None

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    failures = [r for r in caplog.records if "job failed" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info[0] is ValueError


def test_wait_lets_the_tasks_finish_on_their_own():
    async def scenario():
        tasks, done = TaskSet("e", "w"), []

        async def work(i):
            await asyncio.sleep(0)
            done.append(i)

        for i in range(3):
            tasks.spawn(work(i))
        await tasks.wait()
        assert sorted(done) == [0, 1, 2] and len(tasks) == 0
    asyncio.run(scenario())


@given(first=st.floats(0.001, 5), cap=st.floats(0.001, 60), attempt=st.integers(-3, 10_000))
def test_backoff_doubles_from_the_first_wait_up_to_the_cap(first, cap, attempt):
    plain, jittered = Backoff(first, cap), Backoff(first, cap, jitter=True)
    wait = plain.delay(attempt)
    assert wait == min(cap, first * 2 ** min(max(attempt, 0), 30))
    assert wait / 2 <= jittered.delay(attempt) <= wait
    assert plain.delay(attempt + 1) >= wait
