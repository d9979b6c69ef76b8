"""How the broker's bidirectional stream handlers end quietly, however the stream ends.

A stream ends when the client finishes (half-close), cancels, or loses its
connection. grpc.aio cancels the handler's task in the last two cases, and
then two things make a handler's end noisy unless it is written for them:

- An async-generator handler parked at a `yield` (grpc.aio writing its answer)
  is abandoned, not closed; it is closed later by the garbage collector. A
  handler that reads its requests in a second task (it must, to answer while
  it reads) leaves that task inside the request stream, which the request
  intake (services/intake.py) closes when the call ends: "aclose():
  asynchronous generator is already running", logged by gRPC as "Unexpected
  [RuntimeError] raised by servicer method", followed by "Failed sending error
  status from server" (the client is gone). So the stream handlers are
  coroutines that `write` their answers: a cancellation always runs through
  their frame, and they cancel and await the task reading their requests
  (tidemark.common.scheduler.cancel_and_wait) before they return.
- A write can find the call gone before grpc.aio has processed the
  cancellation, and grpc.aio logs that failure with a traceback
  ("ExecuteBatchError raised in core by servicer method"). `write` ends the
  handler as grpc.aio ends a cancelled call instead.

A stream also ends when the broker stops (`OpenStreams`). grpc.aio's stop
lets the calls under way finish within a grace period, then cancels them; a
stream or a watch never finishes by itself, so every stop with a client
connected took the whole grace (3 s), in a failover's old master and in
every restart. The handlers that write (all of Tidemark's and RocketMQ 5's
Telemetry) run in a task of their own, and the stop ends them in an order,
before the server's stop (whose grace only unary calls use now):
- a stream that owes answers says how it ends by itself (`ends_when_asked`:
  a Produce stream stops reading and answers the batches it took, once they
  are as durable as the configuration says; a membership watch ends after
  the write under way, as a handler cancelled inside grpc.aio's write could
  not send its status and its call waited for the end of the grace);
- the others (fetches) are cancelled at once, as a client that went away
  would cancel them: their cleanup runs as then;
- the streams that others' answers wait for (handlers marked `ends_last`: a
  replica's copy of the log, which sync replication's answers need) go once
  the asked ones have ended and the broker says it is settled. The mark is
  read when the call is accepted, so a stream whose handler has not yet run
  its first step ends in its place too.
The whole of it, and the server's own stop after it, fit in one grace: a stop
whose replica never acknowledges ends after the grace, not after two.
Each call ends with UNAVAILABLE "the broker is stopping", which clients take
as a reason to try again elsewhere or later.

The long polls (a pull with a suspend, RocketMQ 5's ReceiveMessage and
PullMessage: handlers marked `long_poll`) are not streams that write; the
stop releases those under way before anything else (the queue waiters
close), and each answers what it has, "nothing new" (nothing was popped for
it), at once. From then on a poll would answer "nothing" without waiting,
and a client that polls again as soon as it hears nothing (RocketMQ 5's push
consumer does) would loop on the broker for as long as the stop lasts: while
it waited for a paused replica (8 s of grace), one client's receives were
answered 3,600 times and one client's pulls 9,400 times. So a long poll
accepted once the broker is stopping is refused with UNAVAILABLE "the broker
is stopping" too: the client backs off (the push consumer for 3 s) or goes
elsewhere.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc

from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.rpc")

STOPPING = "the broker is stopping"


async def write(context: grpc.aio.ServicerContext, response: Any) -> None:
    """Send one answer of a stream; a call whose peer went away ends the handler like a cancelled call."""
    try:
        await context.write(response)
    except grpc.aio.BaseError as e:
        if not call_ended(e):
            raise
        raise asyncio.CancelledError from None


def call_ended(error: BaseException) -> bool:
    """Whether an error from reading or writing a stream means only that the call ended under it (the peer
    went away, the status was sent, the server is stopping: grpc.aio's InternalError, UsageError and its
    private "Server already stopped"): the stream ends like a finished one, nothing to report. An abort
    (AbortError) is the handler's own answer, never this."""
    return isinstance(error, grpc.aio.BaseError) and not isinstance(error, grpc.aio.AbortError)


class _Call:
    """How one stream's handler ends when the broker stops (see the module doc)."""

    __slots__ = ("finish", "last", "asked")

    def __init__(self) -> None:
        self.finish: Callable[[], None] | None = None
        self.last = False
        self.asked = False


_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("stream_call", default=None)


def ends_when_asked(finish: Callable[[], None]) -> None:
    """In a stream's handler: when the broker stops, call `finish` and let the handler end by itself (it
    answers what it owes first) instead of cancelling it."""
    call = _call.get()
    if call is not None:
        call.finish = finish


_ENDS_LAST = "_tidemark_ends_last"


def ends_last(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a stream's handler whose stream the broker's other answers may wait for (a replica's copy of
    the log): at a stop it is cancelled only after the others, once the broker is settled. A mark on the
    handler, read when the call is accepted (`OpenStreams.run`), not a call inside it: a stop that comes
    before the handler's first step must already know."""
    setattr(handler, _ENDS_LAST, True)
    return handler


def marked_last(handler: Callable[..., Any]) -> bool:
    """Whether `handler` (a function or a bound method) is marked with `ends_last`."""
    return bool(getattr(handler, _ENDS_LAST, False))


_LONG_POLL = "_tidemark_long_poll"


def long_poll(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Marks a handler that may wait for messages (a long poll): the request intake refuses its calls
    with UNAVAILABLE once the broker is stopping (see the module doc). A mark on the handler, as
    `ends_last` is, read when the call is accepted."""
    setattr(handler, _LONG_POLL, True)
    return handler


def marked_long_poll(handler: Callable[..., Any]) -> bool:
    """Whether `handler` (a function or a bound method) is marked with `long_poll`."""
    return bool(getattr(handler, _LONG_POLL, False))


class OpenStreams:
    """The stream handlers under way (coroutines that write), ended in order when the broker stops."""

    def __init__(self) -> None:
        self._calls: dict[asyncio.Task, _Call] = {}
        self.stopping = False

    async def run(self, handler: Coroutine[Any, Any, Any], context: grpc.aio.ServicerContext, *,
                  last: bool = False) -> Any:
        """Run a stream's handler in a task of its own until it ends; UNAVAILABLE once the broker stops.
        A cancellation of the call (its client went away) reaches the handler through the await. `last`:
        the handler is marked `ends_last`."""
        if self.stopping:
            handler.close()
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)
        call = _Call()
        call.last = last
        token = _call.set(call)  # (the handler's task starts with a copy of this context)
        try:
            task = asyncio.get_running_loop().create_task(handler)
        finally:
            _call.reset(token)
        self._calls[task] = call
        try:
            result = await task
        except asyncio.CancelledError:
            # The handler's own cancellation, by stop(), and not the call's (cancelling() counts those).
            if self.stopping and not asyncio.current_task().cancelling():
                try:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)
                except grpc.aio.UsageError:
                    # "Abort already called!": the stop cut the handler in its own abort (a refusal on its
                    # way out), whose status stands. The call ends as a cancelled one, not with this error.
                    pass
            raise
        finally:
            del self._calls[task]
        if call.asked:  # it ended as the stop asked: the client learns why
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)
        return result

    async def stop(self, settled: Callable[[], Awaitable[None]], deadline: float) -> None:
        """End every stream under way, and refuse those opened from now on (before the server's stop): the
        asked ones end by themselves and the others are cancelled at once; the last ones once the asked
        have ended and `settled()` returned, or at `deadline` (the loop's clock) at the latest."""
        self.stopping = True
        asked = []
        for task, call in self._calls.items():
            if call.last:
                continue
            if call.finish is None:
                task.cancel()
                continue
            call.asked = True
            call.finish()
            asked.append(task)
        try:
            async with asyncio.timeout_at(deadline):
                if asked:
                    await asyncio.wait(asked)
                await settled()
        except TimeoutError:
            log.warning("streams still owed answers when the stop's grace ended", event="stop_unsettled",
                        streams=sum(1 for t in asked if not t.done()))
        for task in self._calls:
            task.cancel()
