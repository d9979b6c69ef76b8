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
Telemetry) run in a task of their own, which the stop cancels as a client
that went away would (their cleanup runs as then), and the call ends with
UNAVAILABLE "the broker is stopping", which clients take as a reason to try
again elsewhere or later. Unary calls keep their grace.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import grpc

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


class OpenStreams:
    """The stream handlers under way (coroutines that write), ended together when the broker stops."""

    def __init__(self) -> None:
        self._handlers: set[asyncio.Task] = set()
        self.stopping = False

    async def run(self, handler: Coroutine[Any, Any, Any], context: grpc.aio.ServicerContext) -> Any:
        """Run a stream's handler in a task of its own until it ends; UNAVAILABLE once the broker stops.
        A cancellation of the call (its client went away) reaches the handler through the await."""
        if self.stopping:
            handler.close()
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)
        task = asyncio.get_running_loop().create_task(handler)
        self._handlers.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            # The handler's own cancellation, by stop(), and not the call's (cancelling() counts those).
            if self.stopping and not asyncio.current_task().cancelling():
                await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)
            raise
        finally:
            self._handlers.discard(task)

    def stop(self) -> None:
        """End every stream under way, and those opened from now on, at once (before the server's stop)."""
        self.stopping = True
        for task in self._handlers:
            task.cancel()
