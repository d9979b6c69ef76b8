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
import weakref
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
    ClientState.STARTING: frozenset({ClientState.RUNNING, ClientState.STOPPING, ClientState.SHUTDOWN}),
    ClientState.RUNNING: frozenset({ClientState.STOPPING}),
    ClientState.STOPPING: frozenset({ClientState.SHUTDOWN}),
    ClientState.SHUTDOWN: frozenset(),
}


class Lifecycle:
    """One component's state, the one place it changes, and the errors users see for a wrong state.

    Thread-safe: a listener thread may ask for the state while start() runs, and a shutdown() on another
    thread may come while start() runs (`begin_shutdown`: the start gives up, see BlockingClient).
    """

    def __init__(self, what: str) -> None:
        self._what = what
        self._state = ClientState.CREATED
        self._changed = threading.Condition()
        self._abort: Callable[[], None] | None = None  # while STARTING: how the start under way gives up

    @property
    def what(self) -> str:
        return self._what

    @property
    def state(self) -> ClientState:
        return self._state

    def to(self, new: ClientState) -> None:
        with self._changed:
            if new not in _NEXT[self._state]:
                raise ClientStateError(f"{self._what} is {self._state.value}; cannot go to {new.value}")
            self._state = new
            self._abort = None
            self._changed.notify_all()

    def on_abort(self, abort: Callable[[], None]) -> None:
        """While STARTING: how the start under way gives up when a shutdown() comes (`begin_shutdown`);
        called at once when one came already."""
        with self._changed:
            if self._state is ClientState.STARTING:
                self._abort = abort
                return
            came = self._state is ClientState.STOPPING
        if came:
            abort()

    def begin_shutdown(self) -> ClientState:
        """shutdown()'s step, in one move whatever other threads do: the state it found. CREATED goes
        to SHUTDOWN; RUNNING to STOPPING; STARTING to STOPPING too, and the start under way is told to give
        up (on_abort): start() then ends the lifecycle (`wait(SHUTDOWN)`). STOPPING and SHUTDOWN stay."""
        with self._changed:
            found = self._state
            if found is ClientState.CREATED:
                self._state = ClientState.SHUTDOWN
            elif found in (ClientState.STARTING, ClientState.RUNNING):
                self._state = ClientState.STOPPING
            abort, self._abort = self._abort, None
            self._changed.notify_all()
        if found is ClientState.STARTING and abort is not None:
            abort()
        return found

    def wait(self, state: ClientState) -> None:
        """Until the component is in `state` (another thread moves it there)."""
        with self._changed:
            self._changed.wait_for(lambda: self._state is state)

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
# The tasks of blocking calls whose caller gave up (_BlockingCall.cancel): a loop's stop lets them finish
# their cleanup first (LoopThread._let_cancelled_finish), and no other cancelled task.
_GIVEN_UP: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()


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
        """From the waiting thread, which stopped waiting, or a shutdown() giving a start up: the task is
        cancelled (it exists by then, unless its start failed)."""
        def cancel() -> None:
            if self._task is not None:
                _GIVEN_UP.add(self._task)
                # A turn later: a task not started yet runs its first step first, into the try that cleans
                # up after it (a consumer's start closing the connections connect() handed it).
                loop.call_soon(self._task.cancel)
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
        run meanwhile, as the cleanup may wait for them. Only such calls: other tasks cancelled and not
        awaited yet (a producer's late sends) are cancelled with the rest. (A turn of the loop first: a
        cancel that _BlockingCall.cancel deferred may still be waiting in it.)"""
        loop.run_until_complete(asyncio.sleep(0))
        cancelled = [t for t in asyncio.all_tasks(loop) if t in _GIVEN_UP and not t.done()]
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

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *,
            cancel_with: Callable[[Callable[[], None]], None] | None = None) -> T:
        """Run a coroutine on the loop and wait for its result (from any other thread). `cancel_with` is
        given what cancels the call (for another thread: a shutdown() giving a start up), which the caller
        then gets as concurrent.futures.CancelledError once the coroutine has ended."""
        if self.on_own_thread:
            coro.close()
            raise ClientStateError(f"{self._name}: blocking call made from its own event loop thread")
        if not self.running:
            coro.close()
            raise ClientStateError(f"{self._name} is not running")
        call = _BlockingCall(coro)
        loop = self.loop
        loop.call_soon_threadsafe(call.start)
        if cancel_with is not None:
            cancel_with(lambda: call.cancel(loop))
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
    `_loop` and `_life` and defines `_core_stop`, and its start() and shutdown() call `_start_core` and
    `_stop_core`."""

    _loop: LoopThread
    _life: Lifecycle

    def _start_core(self, start: Callable[[], Coroutine[Any, Any, T]], timeout: float) -> T:
        """CREATED -> STARTING -> RUNNING, running `start()` on the loop thread; its result. A failure (or
        RequestTimeoutError after `timeout`) stops the loop and leaves the client SHUTDOWN: it cannot be
        started again. So does a shutdown() meanwhile (on another thread): the start's coroutine is
        cancelled and cleans up after itself (or, finished already, the core is stopped as shutdown()
        stops it), then ClientStateError."""
        self._life.to(ClientState.STARTING)
        self._loop.start()
        try:
            result = self._loop.run(start(), timeout=timeout, cancel_with=self._life.on_abort)
        except BaseException as e:
            self._loop.stop()
            shut_down = self._life.state is ClientState.STOPPING  # (only begin_shutdown moves STARTING there)
            self._life.to(ClientState.SHUTDOWN)
            if shut_down:
                raise self._shut_down_while_starting() from e
            raise
        try:
            self._life.to(ClientState.RUNNING)
        except ClientStateError:  # shut down just as the start finished: the core is stopped here instead
            self._stop_running()
            raise self._shut_down_while_starting() from None
        return result

    def _shut_down_while_starting(self) -> ClientStateError:
        return ClientStateError(f"the {self._life.what} was shut down while start() ran")

    def _core_stop(self) -> tuple[Callable[[], Coroutine[Any, Any, Any]], float]:
        """What stops the started core, and how long it may take: each client's own."""
        raise NotImplementedError

    def _stop_core(self) -> ClientState:
        """shutdown(): RUNNING -> STOPPING -> SHUTDOWN, running `_core_stop()` on the loop thread, then
        stopping the loop (also when it failed or timed out). Idempotent; a client never started just goes
        to SHUTDOWN; one still starting (start() on another thread) has its start give up, and this returns
        once start() has left it SHUTDOWN; one another thread is stopping, once that stop is over. The
        state shutdown() found."""
        if self._loop.on_own_thread:  # (a send_async callback): it would wait for itself, and stay STOPPING
            raise ClientStateError(f"shutdown() of the {self._life.what} cannot run on its own event loop thread "
                                   f"(a callback): call it from another thread")
        found = self._life.begin_shutdown()
        if found in (ClientState.STARTING, ClientState.STOPPING):  # (another thread stops it)
            self._life.wait(ClientState.SHUTDOWN)
        elif found is ClientState.RUNNING:
            self._stop_running()
        return found

    def _stop_running(self) -> None:
        """STOPPING -> SHUTDOWN for a started core."""
        stop, timeout = self._core_stop()
        try:
            self._loop.run(stop(), timeout=timeout)
        finally:
            self._loop.stop()
            self._life.to(ClientState.SHUTDOWN)

    def __enter__(self) -> Self:  # start() and shutdown() are each client's, with their own documentation
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

