"""ConsumeThreadPool: the threads listeners run on, fed and drained in bulk.

Consume threads take work from one shared queue, so up to consume_thread_max
listener calls run at once (a slow listener does not hold up the others), but
nothing crosses threads per message: the event loop hands over a whole
frame's batches with one call, wakes threads in proportion to the backlog,
and each thread reports back by adding a
completion to a shared list, which the loop takes in one go (`on_drained`
then runs once, after all the completions taken, so results can be applied
per lease rather than per batch): at the collect COLLECT_S after a hand-off,
or when a thread wakes it, for a run() whose caller waits or for a task that
finished while no collect was due; a completion waits COLLECT_S at most.
While something waits for completions (`hurried`: a handover's drain, whose
queue's next owner waits for the final commit), they are taken at once and
every finished task wakes the loop: the collect would add up to COLLECT_S to
the handover for nothing.
Threads start on demand, up to the maximum, and live until shutdown.

What a hand-off costs is what sets the consumer's CPU per message below full
speed (every frame of one or two messages is a hand-off), so it is made of
the cheapest parts: the work queue is a deque (append and popleft are atomic),
an idle thread parks on a lock of its own that the loop releases to wake it
(no Condition, whose wait and notify are Python code and allocate a lock per
wait), and one mutex (a C lock) orders parking against waking. A thread the
loop woke counts as on its way to the queued work until it takes some:
without that, each of a frame's parts, handed over before the first woken
thread got to run, woke (or started) one thread more, and at 5,000 msg/s the
pool ran all twenty threads for a listener that needs one. Work still queued
when that thread takes its first task, which may be a listener that gets
stuck, gets a thread of its own: at the collect when one is due (most often
the thread on its way takes the rest itself by then; waking one at once cost
the pool a quarter more CPU per task), at once otherwise (run()'s awaiters,
the orderly service's queues, wait for their tasks).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tidemark.common.logs import get_logger

log = get_logger("tidemark.client.consume")

# A thread per this many queued tasks (up to the maximum): see submit().
TASKS_PER_THREAD = 8
# How long the completions of submitted tasks may wait for the loop to come by (see submit()).
COLLECT_S = 0.005

Completion = Callable[[], None]
Task = Callable[[], Completion | None]


class _Parked:
    """A consume thread's place while idle: a held lock it blocks on until the loop releases it."""

    __slots__ = ("lock",)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()


class ConsumeThreadPool:
    def __init__(self, *, max_threads: int, name: str, loop: asyncio.AbstractEventLoop,
                 on_drained: Callable[[], None] = lambda: None) -> None:
        self._max_threads = max_threads
        self._name = name
        self._loop = loop
        self._on_drained = on_drained
        self._work: collections.deque[Task] = collections.deque()
        # Orders a thread's decision to park against submit's look at the idle threads.
        self._mutex = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._excused: set[threading.Thread] = set()  # threads shutdown() does not wait for (excuse())
        self._ended: set[threading.Thread] = set()  # threads whose work loop returned
        # Notified as a thread ends or is excused: what shutdown() waits on (a join could not be interrupted
        # by an excuse that comes while it waits).
        self._exits = threading.Condition()
        self._idle: list[_Parked] = []  # parked threads, the last parked woken first (its cache is warm)
        self._waking = 0  # threads woken or started that have not taken work yet
        self._stopped = False
        self._done: collections.deque[Completion] = collections.deque()
        self._wake_pending = False
        # Set while a drain is due on the loop anyway: a thread that finishes meanwhile does not wake it.
        self._collect: asyncio.TimerHandle | None = None
        # How many wait for completions now (hurried()): while above 0, a finished task wakes the loop.
        # Written on the loop, read by the threads (a stale read costs one task a collect's wait).
        self._hurry = 0

    # -- loop side ---------------------------------------------------------------------------

    def submit(self, tasks: Iterable[Task]) -> None:
        """Queue tasks for the consume threads; each may return a completion to run on the loop.

        Threads are woken (or started) in proportion to the backlog, one per TASKS_PER_THREAD waiting
        tasks, besides those already busy and those already on their way: a fast listener is served by a
        thread or two taking task after task (no wake-up per message, little GIL contention), a slow one
        gets more threads as its backlog grows, and a listener stuck in a call keeps queued work from a
        free thread for COLLECT_S at most (see _serve).

        Their completions are collected: the loop takes them when it comes by COLLECT_S later, instead of
        being woken for each task that finishes (below full speed a frame holds a message or two, and a
        wake-up of the loop per frame cost the consumer as much CPU as handing the frame over). A task
        that finishes while no collect is due (it outlasted the last one) wakes the loop itself, as
        run()'s always do; one that finishes while a later hand-off's collect is due waits for that one.
        Either way a completion waits COLLECT_S at most."""
        if self._collect is None:
            self._collect = self._loop.call_later(COLLECT_S, self._collected)
        self._hand_over(tasks)

    def _hand_over(self, tasks: Iterable[Task]) -> None:
        work = self._work
        work.extend(tasks)
        with self._mutex:
            if self._stopped:
                work.clear()
                return
            self._wake()

    def _wake(self) -> None:
        """Wake (or start) threads for the queued work, one per TASKS_PER_THREAD tasks, besides those on
        their way (with the mutex held). A thread that fails to start is neither kept nor counted: its
        error is raised, and the next hand-off tries again."""
        idle = self._idle
        wanted = min(self._max_threads - (len(self._threads) - len(idle)),
                     -(-len(self._work) // TASKS_PER_THREAD) - self._waking)
        while wanted > 0 and idle:
            idle.pop().lock.release()
            self._waking += 1
            wanted -= 1
        # Started with the mutex held (a new thread that finds no work waits for it to park): a thread is
        # in _threads, and counted as on its way, only once its start succeeded, so a failed start ("can't
        # start new thread") leaves no dead thread counted as on its way, which would wedge the pool.
        for _ in range(min(wanted, self._max_threads - len(self._threads))):
            thread = threading.Thread(target=self._worker, name=f"{self._name}_{len(self._threads) + 1}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
            self._waking += 1

    @contextlib.contextmanager
    def hurried(self) -> Iterator[None]:
        """While in it, completions reach the loop at once: those waiting for the collect are taken now,
        and every task that finishes wakes the loop (a handover's drain waits for its queue's batches, and
        the queue's next owner for the drain; the collect saves a wake-up per frame, not worth a wait of up
        to COLLECT_S there)."""
        self._hurry += 1
        try:
            if self._collect is not None:
                self._collect.cancel()
                self._collected()
            yield
        finally:
            self._hurry -= 1

    def run(self, fn: Callable[[], Any]) -> asyncio.Future:
        """Run one function on a consume thread; its result arrives on an asyncio future."""
        future = self._loop.create_future()

        def task() -> Completion:
            try:
                result = fn()
            except BaseException as e:  # handed to the future's awaiter
                return lambda error=e: future.done() or future.set_exception(error)
            return lambda: future.done() or future.set_result(result)

        task.prompt = True  # type: ignore[attr-defined]  # its awaiter waits for the completion
        self._hand_over([task])
        return future

    def _collected(self) -> None:
        # Clear before draining: a thread that finishes after this wakes the loop itself.
        self._collect = None
        if self._work:  # (only the loop adds work: empty now, it stays empty until the next hand-off)
            # Still queued COLLECT_S after a hand-off, while the thread that was on its way for it is busy
            # with other work (a listener stuck in a call, maybe): it gets threads of its own (and from now
            # on, with no collect due, a thread that takes work with more queued wakes one at once).
            with self._mutex:
                if not self._stopped:
                    try:
                        self._wake()
                    except RuntimeError:  # no thread could be started: the busy ones take the work
                        log.exception("consume thread failed to start", event="consume_thread_start_error")
        self._drain()

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
        """Stop taking work, let running listeners finish, join the threads (call off the loop or at exit),
        but those excused, also while it waits already: a listener may shut its consumer down from its call
        when another thread's shutdown is at this wait, which must then stop waiting for it."""
        threads = self.stop()  # (each started: a thread joins _threads once its start succeeded)
        with self._exits:
            self._exits.wait_for(lambda: all(t in self._ended or t in self._excused for t in threads))
        for thread in threads:
            if thread in self._ended:
                thread.join()  # (its last steps)

    def excuse(self, thread: threading.Thread) -> bool:
        """Whether `thread` is one of the pool's; if so, shutdown() will not wait for it. For a listener
        that shuts its consumer down: its call ends only after that shutdown, which must not wait for it.
        Once per thread: False when excused already (the lease stopped counting its batch then)."""
        with self._mutex:
            if thread not in self._threads:
                return False
        with self._exits:
            if thread in self._excused:
                return False
            self._excused.add(thread)
            self._exits.notify_all()
        return True

    def stop(self) -> list[threading.Thread]:
        """Stop taking work and wake the parked threads to end; running listeners end after their call.
        Returns the threads without joining them (the loop may stop the pool this way even when a listener
        is the caller it would wait for)."""
        with self._mutex:
            self._stopped = True
            self._work.clear()
            idle, self._idle = self._idle, []
            threads = list(self._threads)
        for parked in idle:
            parked.lock.release()
        return threads

    # -- consume threads ---------------------------------------------------------------------

    def _worker(self) -> None:
        try:
            self._serve()
        finally:
            with self._exits:
                self._ended.add(threading.current_thread())
                self._exits.notify_all()

    def _serve(self) -> None:
        work, mutex, done, parked = self._work, self._mutex, self._done, _Parked()
        on_way = True  # woken or started by a hand-off, counted in _waking until it takes work or parks
        while True:
            try:
                task = work.popleft()
            except IndexError:
                with mutex:
                    if self._stopped:
                        return
                    if work:
                        continue  # queued after the popleft above (still on its way): take it
                    if on_way:
                        self._waking -= 1
                        on_way = False
                    self._idle.append(parked)
                parked.lock.acquire()  # until a hand-off (counting this thread in _waking) or shutdown releases it
                on_way = True
                if self._stopped:
                    return
                continue
            if on_way:
                # The hand-offs that came while this thread was on its way counted on it for their work: if
                # some is left, it needs a thread of its own, or it could wait behind this task (a listener
                # stuck in a call) while other threads idle. A collect due sees to it (by then this thread
                # most often took the rest itself); without one, it is woken now.
                on_way = False
                with mutex:
                    self._waking -= 1
                    if work and self._collect is None and not self._stopped:
                        try:
                            self._wake()
                        except RuntimeError:  # no thread could be started: the busy ones take the work
                            log.exception("consume thread failed to start", event="consume_thread_start_error")
            try:
                completion = task()
            except BaseException:  # a consume thread must outlive any task, or its work would hang
                log.exception("consume task failed", event="consume_task_error")
                continue
            if completion is not None:
                done.append(completion)
                # (after the append: a drain that cleared _collect since takes this completion, or one after)
                if not self._wake_pending and (self._collect is None or self._hurry
                                               or getattr(task, "prompt", False)):
                    self._wake_pending = True
                    try:
                        self._loop.call_soon_threadsafe(self._drain)
                    except RuntimeError:
                        return  # the loop is closed: the consumer is gone
