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
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc


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
