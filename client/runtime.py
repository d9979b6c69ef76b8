"""LoopThread: the event loop a synchronous facade runs its asyncio core on.

Each Producer/PushConsumer/PullConsumer owns one; nothing is shared between
components by accident. stop() cancels what is left on the loop and joins the
thread, so no thread or channel outlives shutdown(); a call already cancelled
(past its timeout) first finishes its cleanup. The stopped loop is closed
a little later, not at once: grpc.aio's process-wide poller thread may still
hand it the completions of calls its channels cancelled (most often when a
connection was blackholed), and a closed loop answers with "RuntimeError: Event
loop is closed", logged with a traceback in whichever loop polled them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Self, TypeVar

from tidemark.client.errors import ClientStateError, RequestTimeoutError
from tidemark.common.logs import get_logger

log = get_logger("tidemark.client.runtime")

T = TypeVar("T")


class ClientState(enum.Enum):
    """The lifecycle of every client component (Producer, PushConsumer, PullConsumer)."""

    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    SHUTDOWN = "shut down"


_NEXT: dict[ClientState, frozenset[ClientState]] = {
    ClientState.CREATED: frozenset({ClientState.STARTING, ClientState.SHUTDOWN}),
    ClientState.STARTING: frozenset({ClientState.RUNNING, ClientState.SHUTDOWN}),
    ClientState.RUNNING: frozenset({ClientState.STOPPING}),
    ClientState.STOPPING: frozenset({ClientState.SHUTDOWN}),
    ClientState.SHUTDOWN: frozenset(),
}


class Lifecycle:
    """One component's state, the one place it changes, and the errors users see for a wrong state.

    Thread-safe: a listener thread may ask for the state while start() runs.
    """

    def __init__(self, what: str) -> None:
        self._what = what
        self._state = ClientState.CREATED
        self._lock = threading.Lock()

    @property
    def state(self) -> ClientState:
        return self._state

    def to(self, new: ClientState) -> None:
        with self._lock:
            if new not in _NEXT[self._state]:
                raise ClientStateError(f"{self._what} is {self._state.value}; cannot go to {new.value}")
            self._state = new

    def require(self, *states: ClientState, action: str = "do this") -> None:
        """ClientStateError unless in one of `states`, worded for the user."""
        state = self._state
        if state in states:
            return
        if state is ClientState.CREATED:
            raise ClientStateError(f"cannot {action}: the {self._what} is created; call start() first")
        if state in (ClientState.STOPPING, ClientState.SHUTDOWN):
            raise ClientStateError(f"cannot {action}: the {self._what} was shut down")
        raise ClientStateError(f"cannot {action}: the {self._what} is {state.value}")


class _LoopCloser:
    """Closes stopped loops CLOSE_DELAY_S after they stopped, on one daemon thread (see the module doc)."""

    CLOSE_DELAY_S = 2.0

    def __init__(self) -> None:
        self._due: queue.Queue[tuple[float, asyncio.AbstractEventLoop]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def close_later(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tidemark-loop-closer", daemon=True)
                self._thread.start()
        self._due.put((time.monotonic() + self.CLOSE_DELAY_S, loop))

    def _run(self) -> None:
        while True:
            due, loop = self._due.get()
            time.sleep(max(0.0, due - time.monotonic()))
            if not loop.is_closed() and not loop.is_running():
                loop.close()


_CLOSER = _LoopCloser()


class _BlockingCall:
    """A coroutine run on the loop for a thread that blocks until it is done: a task and a lock.

    What `LoopThread.run` does for every synchronous call (a `Producer.send` among them), so it costs
    less than `run_coroutine_threadsafe`, whose concurrent future brings a Condition, an RLock and a
    chain of callbacks per call. The outcome is reported as that future reported it: a cancelled
    task as concurrent.futures.CancelledError, an exception as itself.
    """

    __slots__ = ("_coro", "_done", "_task")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self._done = threading.Lock()
        self._done.acquire()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """On the loop: the task (scheduled before any cancel() of the waiting thread, so it runs first)."""
        self._task = asyncio.get_running_loop().create_task(self._coro)
        self._task.add_done_callback(self._finished)

    def _finished(self, _task: asyncio.Task) -> None:
        self._done.release()

    def wait(self, timeout: float | None) -> bool:
        return self._done.acquire(timeout=-1 if timeout is None else max(0.0, timeout))  # (a past deadline: no wait)

    def result(self) -> Any:
        task = self._task
        if task.cancelled():
            raise concurrent.futures.CancelledError()
        error = task.exception()
        if error is None:
            return task.result()
        if type(error) is asyncio.InvalidStateError:
            raise concurrent.futures.InvalidStateError(*error.args)
        raise error

    def cancel(self, loop: asyncio.AbstractEventLoop) -> None:
        """From the waiting thread, which stopped waiting: the task is cancelled (it exists by then, unless
        its start failed)."""
        def cancel() -> None:
            if self._task is not None:
                self._task.cancel()
        try:
            loop.call_soon_threadsafe(cancel)
        except RuntimeError:  # the loop closed meanwhile: nothing runs any more
            pass


class LoopThread:
    CLEANUP_GRACE_S = 10.0  # how long stop() lets a cancelled call finish its cleanup (_let_cancelled_finish)

    def __init__(self, name: str) -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise ClientStateError(f"{self._name} is not running")
        return self._loop

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._main, name=f"tidemark-{self._name}", daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            self._let_cancelled_finish(loop)
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            _CLOSER.close_later(loop)

    def _let_cancelled_finish(self, loop: asyncio.AbstractEventLoop) -> None:
        """The stopped loop runs on until the tasks cancelled before the stop have ended, up to
        CLEANUP_GRACE_S, before every other task is cancelled. Such a task is a call whose caller gave
        up (a start() past its timeout) and which is still in its cleanup, closing the channels and tasks
        it opened: cancelled a second time half-way, it would leave the rest open. The other tasks still
        run meanwhile, as the cleanup may wait for them."""
        cancelled = [t for t in asyncio.all_tasks(loop) if t.cancelling() and not t.done()]
        if not cancelled:
            return
        _, stuck = loop.run_until_complete(asyncio.wait(cancelled, timeout=self.CLEANUP_GRACE_S))
        for task in stuck:
            log.warning("a cancelled task did not end before its loop stopped",
                        event="loop_cleanup_stuck", loop=self._name, task=task.get_name())

    @property
    def on_own_thread(self) -> bool:
        """True when called from the loop's thread (a callback), where nothing may block."""
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if not self.running:
            coro.close()
            raise ClientStateError(f"{self._name} is not running")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the loop and wait for its result (from any other thread)."""
        if self.on_own_thread:
            coro.close()
            raise ClientStateError(f"{self._name}: blocking call made from its own event loop thread")
        if not self.running:
            coro.close()
            raise ClientStateError(f"{self._name} is not running")
        call = _BlockingCall(coro)
        loop = self.loop
        loop.call_soon_threadsafe(call.start)
        try:
            try:
                finished = call.wait(timeout)
            except BaseException:  # the caller interrupted (KeyboardInterrupt): its call ends with it
                call.cancel(loop)
                raise
            if not finished:
                call.cancel(loop)
                raise TimeoutError
            return call.result()
        except concurrent.futures.TimeoutError:  # (the coroutine's own TimeoutError too, as run_coroutine_threadsafe had it)
            self._log_tasks()
            raise RequestTimeoutError(f"{self._name}: no answer within {timeout} s") from None

    def _log_tasks(self) -> None:
        """What the loop was busy with when a call timed out (stack of every pending task, at DEBUG...
        but a timed-out call is worth a WARNING)."""
        loop = self._loop
        if loop is None:
            return
        for task in asyncio.all_tasks(loop):
            frames = task.get_stack(limit=8)
            where = " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(frames)) or "(not started)"
            log.warning("pending task at timeout",
                        event="loop_task_pending", loop=self._name, task=task.get_name(), at=where)

    def call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run a plain function on the loop thread (to read or change loop-confined state) and return its result."""
        async def run() -> T:
            return fn()
        return self.run(run(), timeout=timeout)

    def stop(self) -> None:
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        if thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
        self._thread = None
        self._loop = None
        self._ready.clear()


class BlockingClient:
    """What the blocking clients (Producer, PushConsumer, PullConsumer, RecordReader) share: an asyncio
    core on their own LoopThread, started and stopped through their one Lifecycle. A subclass sets
    `_loop` and `_life`, and its start() and shutdown() call `_start_core` and `_stop_core`."""

    _loop: LoopThread
    _life: Lifecycle

    def _start_core(self, start: Callable[[], Coroutine[Any, Any, T]], timeout: float) -> T:
        """CREATED -> STARTING -> RUNNING, running `start()` on the loop thread; its result. A failure (or
        RequestTimeoutError after `timeout`) stops the loop and leaves the client SHUTDOWN: it cannot be
        started again."""
        self._life.to(ClientState.STARTING)
        self._loop.start()
        try:
            result = self._loop.run(start(), timeout=timeout)
        except BaseException:
            self._loop.stop()
            self._life.to(ClientState.SHUTDOWN)
            raise
        self._life.to(ClientState.RUNNING)
        return result

    def _stop_core(self, stop: Callable[[], Coroutine[Any, Any, Any]], timeout: float) -> None:
        """RUNNING -> STOPPING -> SHUTDOWN, running `stop()` on the loop thread, then stopping the loop
        (also when `stop()` failed or timed out). Idempotent; a client never started just goes to
        SHUTDOWN; one still starting (on another thread) cannot be shut down yet."""
        state = self._life.state
        if state in (ClientState.SHUTDOWN, ClientState.STOPPING):
            return
        if state is ClientState.CREATED:
            self._life.to(ClientState.SHUTDOWN)
            return
        self._life.require(ClientState.RUNNING, action="shut down")
        self._life.to(ClientState.STOPPING)
        try:
            self._loop.run(stop(), timeout=timeout)
        finally:
            self._loop.stop()
            self._life.to(ClientState.SHUTDOWN)

    def __enter__(self) -> Self:  # start() and shutdown() are each client's, with their own documentation
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

