"""ConsumeThreadPool: the threads listeners run on, fed and drained in bulk.

Consume threads take work from one shared queue, so up to consume_thread_max
listener calls run at once (a slow listener does not hold up the others), but
nothing crosses threads per message: the event loop hands over a whole
frame's batches with one call, wakes threads in proportion to the backlog,
and each thread reports back by adding a
completion to a shared list; the loop is woken once for everything that
finished meanwhile (`on_drained` then runs once, after all the completions
of that wake-up, so results can be applied per lease rather than per batch).
Threads start on demand, up to the maximum, and live until shutdown.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Iterable
from typing import Any

from tidemark.common.logs import get_logger

log = get_logger("tidemark.client.consume")

# A thread per this many queued tasks (up to the maximum): see submit().
TASKS_PER_THREAD = 8

Completion = Callable[[], None]
Task = Callable[[], Completion | None]


class ConsumeThreadPool:
    def __init__(self, *, max_threads: int, name: str, loop: asyncio.AbstractEventLoop,
                 on_drained: Callable[[], None] = lambda: None) -> None:
        self._max_threads = max_threads
        self._name = name
        self._loop = loop
        self._on_drained = on_drained
        self._work: collections.deque[Task] = collections.deque()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._stopped = False
        self._done: collections.deque[Completion] = collections.deque()
        self._wake_pending = False

    # -- loop side ---------------------------------------------------------------------------

    def submit(self, tasks: Iterable[Task]) -> None:
        """Queue tasks for the consume threads; each may return a completion to run on the loop.

        Threads are woken (or started) in proportion to the backlog, one per TASKS_PER_THREAD waiting
        tasks, besides those already busy: a fast listener is served by a thread or two taking task
        after task (no wake-up per message, little GIL contention), a slow one gets more threads as its
        backlog grows, and a listener stuck in a call never keeps queued work from a free thread."""
        with self._cond:
            if self._stopped:
                return
            work = self._work
            work.extend(tasks)
            busy = len(self._threads) - self._idle
            wanted = min(self._max_threads - busy, -(-len(work) // TASKS_PER_THREAD))
            if wanted <= 0:
                return
            wake = min(wanted, self._idle)
            if wake:
                self._cond.notify(wake)
            for _ in range(min(wanted - wake, self._max_threads - len(self._threads))):
                thread = threading.Thread(target=self._worker, name=f"{self._name}_{len(self._threads) + 1}",
                                          daemon=True)
                self._threads.append(thread)
                thread.start()

    def run(self, fn: Callable[[], Any]) -> asyncio.Future:
        """Run one function on a consume thread; its result arrives on an asyncio future."""
        future = self._loop.create_future()

        def task() -> Completion:
            try:
                result = fn()
            except BaseException as e:  # handed to the future's awaiter
                return lambda error=e: future.done() or future.set_exception(error)
            return lambda: future.done() or future.set_result(result)

        self.submit([task])
        return future

    def _drain(self) -> None:
        # Clear the flag before taking completions: a thread that adds one after this sees it cleared
        # and wakes the loop again, so nothing is left behind.
        self._wake_pending = False
        done = self._done
        while done:
            completion = done.popleft()
            try:
                completion()
            except Exception:
                log.exception("consume completion failed", event="consume_completion_error")
        self._on_drained()

    def shutdown(self) -> None:
        """Stop taking work, let running listeners finish, join the threads (call off the loop or at exit)."""
        with self._cond:
            self._stopped = True
            self._work.clear()
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    # -- consume threads ---------------------------------------------------------------------

    def _worker(self) -> None:
        cond, work = self._cond, self._work
        while True:
            with cond:
                while not work and not self._stopped:
                    self._idle += 1
                    cond.wait()
                    self._idle -= 1
                if self._stopped:
                    return
                task = work.popleft()
            try:
                completion = task()
            except BaseException:  # a consume thread must outlive any task, or its work would hang
                log.exception("consume task failed", event="consume_task_error")
                continue
            if completion is not None:
                self._done.append(completion)
                if not self._wake_pending:
                    self._wake_pending = True
                    try:
                        self._loop.call_soon_threadsafe(self._drain)
                    except RuntimeError:
                        return  # the loop is closed: the consumer is gone
