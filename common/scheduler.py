"""Scheduler: every periodic task of a process, owned and visible in one place.

The broker registers its timers here (offset flush, expiry scans, retention),
and so does each client (heartbeat, offset persist, rebalance, lock renewal).
Jobs run on the event loop; an exception in one run is logged and the job
keeps its schedule; stop() cancels and awaits every job.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tidemark.common.logs import get_logger

log = get_logger("tidemark.common.scheduler")

JobFn = Callable[[], Awaitable[None] | None]


@dataclass(eq=False)
class _Job:
    name: str
    interval_s: float
    fn: JobFn
    initial_delay_s: float
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    runs: int = 0


async def cancel_and_wait(*tasks: asyncio.Task | None) -> None:
    """Cancel tasks and wait until each has finished (None entries are skipped).

    The tasks' own cancellations and failures are collected here (a task reports its failures where
    they happen). A cancellation of the caller while it waits still propagates, but only once the tasks
    have finished: what they were using (a stream they read, a file) is theirs until then, and a caller
    that closed it under them got "aclose(): asynchronous generator is already running" (the fault
    runs' replica_link scenario, a replica's acknowledgement reader inside the request stream)."""
    pending = []
    for task in tasks:
        if task is None:
            continue
        if task.done():  # (perhaps on a loop that is gone: nothing to wait for)
            if not task.cancelled():
                task.exception()  # retrieved: a failure was reported where it happened
            continue
        task.cancel()
        pending.append(task)
    cancelled = False
    while pending:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            cancelled = True  # the caller is cancelled: the tasks are already, wait for them to end
        pending = [t for t in pending if not t.done()]
    for task in tasks:
        if task is not None and task.done() and not task.cancelled():
            task.exception()
    if cancelled:
        raise asyncio.CancelledError


class TaskSet:
    """The background tasks one component starts as it goes (a reopen after a backoff, a retry of failed
    messages), owned: a failure is logged once, where it happens, under the component's event name; the
    component's shutdown either waits for them (`wait`) or cancels what still runs and waits for that
    (`close`); once closed, new work is refused (its coroutine closed unstarted)."""

    def __init__(self, event: str, what: str, logger=None, **fields: object) -> None:
        self._event, self._what, self._fields = event, what, fields
        self._log = logger or log
        self._tasks: set[asyncio.Task] = set()
        self.closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Awaitable, name: str | None = None) -> asyncio.Task | None:
        if self.closed:
            coro.close()
            return None
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._log.error(self._what, event=self._event, task=task.get_name(), exc_info=task.exception(),
                            **self._fields)

    async def wait(self) -> None:
        """Until every task has finished on its own (their failures are logged already)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        """Refuse new work, cancel what runs, and wait until it has finished."""
        self.closed = True
        await cancel_and_wait(*self._tasks)


class Scheduler:
    def __init__(self, owner: str) -> None:
        self._owner = owner
        self._jobs: dict[str, _Job] = {}
        self._running = False

    def every(self, name: str, interval_s: float, fn: JobFn, *, initial_delay_s: float | None = None) -> None:
        """Run fn every interval_s seconds (first run after initial_delay_s, default one interval)."""
        if name in self._jobs:
            raise ValueError(f"{self._owner}: job {name!r} is already scheduled")
        if interval_s <= 0:
            raise ValueError(f"{self._owner}: job {name!r} needs a positive interval, got {interval_s}")
        job = _Job(name, interval_s, fn, interval_s if initial_delay_s is None else initial_delay_s)
        self._jobs[name] = job
        if self._running:
            job.task = asyncio.get_running_loop().create_task(self._loop(job), name=f"{self._owner}:{name}")

    def trigger(self, name: str) -> None:
        """Run a job as soon as possible instead of waiting for its next tick."""
        job = self._jobs.get(name)
        if job is not None:
            job.wake.set()

    def jobs(self) -> list[tuple[str, float, int]]:
        """(name, interval in seconds, completed runs) of every job."""
        return [(j.name, j.interval_s, j.runs) for j in self._jobs.values()]

    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        loop = asyncio.get_running_loop()
        for job in self._jobs.values():
            job.task = loop.create_task(self._loop(job), name=f"{self._owner}:{job.name}")

    async def stop(self) -> None:
        """Cancel every job and wait until each has finished.

        gather(return_exceptions=True) collects the jobs' own cancellations; a cancellation of the
        caller still propagates (an `except CancelledError: pass` here would swallow it)."""
        self._running = False
        await cancel_and_wait(*(j.task for j in self._jobs.values()))
        for job in self._jobs.values():
            job.task = None

    async def _loop(self, job: _Job) -> None:
        delay = job.initial_delay_s
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that races with
            # the event being set (a trigger() during stop()), and stop() would wait forever.
            try:
                async with asyncio.timeout(delay):
                    await job.wake.wait()
            except TimeoutError:
                pass
            job.wake.clear()
            delay = job.interval_s
            try:
                result = job.fn()
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scheduled job failed", event="job_error", owner=self._owner, job=job.name)
            job.runs += 1
