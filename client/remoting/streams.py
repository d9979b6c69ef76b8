"""The data-plane streams to one broker: Produce (record batches out) and Fetch (records in).

Both are long-lived bidirectional gRPC calls that carry many requests, so the
per-call cost of gRPC is paid once per stream, not per message. This module
only translates between protobuf and plain values and maps errors into
`tidemark.client.errors`; what the batches and queues mean is the producer's and
consumer's business. A broken stream fails everything waiting on it with a
retriable UnavailableError and is replaced by a new one on next use.

Closing ends a stream as a finished one, not a cancelled one: the client
half-closes and reads to the broker's final status (within CLOSE_GRACE_S,
then it cancels). Both sides then end quietly, and no gRPC operation of the
call is left in flight when the client's event loop closes (gRPC delivers a
cancelled call's last completions later, to a loop that may be gone:
"RuntimeError: Event loop is closed" in another loop's log).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from tidemark.client.errors import (
    InternalError,
    RequestTimeoutError,
    Status,
    TidemarkError,
    UnavailableError,
    from_status,
)
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.rpc_errors import from_rpc_error
from tidemark.client.types import Fence
from tidemark.common.logs import get_logger
from tidemark.common.protocol import ExpressionType
from tidemark.v1 import common_pb2, messaging_pb2

log = get_logger("tidemark.client.streams")

_STATUS_NAMES = {messaging_pb2.OFFSET_ILLEGAL: "OFFSET_ILLEGAL", messaging_pb2.OFFSET_RESET: "OFFSET_RESET"}

# How long close() waits for the broker to end the stream after the client half-closed.
CLOSE_GRACE_S = 2.0

# grpc.aio's status for a call whose own write failed in gRPC core (the connection went away under it).
_LOCAL_FAILURE = "Internal error from Core"


# The Produce call takes requests as their wire bytes (produce_request), not as messages to serialize.
PRODUCE_METHOD = "/tidemark.v1.MessagingService/Produce"
_RECORDS_TAG = bytes([5 << 3 | 2])  # ProduceRequest.records: field 5, length-delimited


def produce_call(channel: grpc.aio.Channel) -> Any:
    """The Produce stream's multi-callable: requests go out as the bytes given (produce_request)."""
    return channel.stream_stream(PRODUCE_METHOD, request_serializer=None,
                                 response_deserializer=messaging_pb2.ProduceResponse.FromString,
                                 _registered_method=True)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def produce_request(request_id: int, topic: str, queue_id: int, count: int, records: bytes | memoryview,
                    sequence: tuple[int, int, int] | None = None) -> bytes:
    """A ProduceRequest's wire bytes, with the batch's records copied into them once.

    Built as a message, the records were copied twice more: into the message (protobuf keeps its own
    copy of a bytes field) and into the bytes SerializeToString returns, each up to 1 MiB a request
    (docs/benchmarks.md, issue 33, sixth pass). A message's fields may come in any order on the wire, so
    protobuf serializes the small fields and the records field follows, written here: its tag, its
    length as a varint, the bytes. Parsed, it is the message the same arguments would build."""
    head = messaging_pb2.ProduceRequest(request_id=request_id, topic=topic, queue_id=queue_id, count=count)
    if sequence is not None:
        head.producer_id, head.producer_epoch, head.base_sequence = sequence
        head.sequence_gaps = True  # this producer recovers from a gap by sending the missing batch first
    return b"".join((head.SerializeToString(), _RECORDS_TAG, _varint(memoryview(records).nbytes), records))


def _fence_pb(fence: Fence) -> common_pb2.CommitFence:
    pb = common_pb2.CommitFence(client_id=fence.client_id)
    if fence.owner_epoch is not None:
        pb.owner_epoch = fence.owner_epoch
    if fence.reset_generation is not None:
        pb.reset_generation = fence.reset_generation
    return pb


class ProduceStream:
    """Record batches to one broker; `send` answers with the first queue offset of the batch. The call is
    produce_call's: it takes each request as its wire bytes."""

    def __init__(self, call: Any, address: str,
                 error: Callable[[grpc.RpcError], TidemarkError] | None = None) -> None:
        self._call = call
        self._address = address
        # How a gRPC failure becomes a client error (BrokerConnection.error: it also reports an unreachable
        # broker to the cluster, which fails over to a replica).
        self._error = error or (lambda e: from_rpc_error(e, address=address))
        self._pending: dict[int, asyncio.Future[int]] = {}
        self._next_id = 0
        self._write_lock = asyncio.Lock()  # gRPC takes one write at a time per call
        self._broken: TidemarkError | None = None
        self._reader = asyncio.get_running_loop().create_task(self._read(), name=f"produce-stream:{address}")

    @property
    def usable(self) -> bool:
        return self._broken is None

    async def send(self, topic: str, queue_id: int, count: int, data: bytes | memoryview, timeout: float,
                   sequence: tuple[int, int, int] | None = None) -> int:
        """The batch's first queue offset (an idempotent producer's duplicate: the original's, or -1).
        `data` is the records (any bytes-like object); `sequence` is (producer id, epoch, base sequence)
        for an idempotent producer's batch."""
        if self._broken is not None:
            raise self._broken
        self._next_id += 1
        request_id = self._next_id
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        request = produce_request(request_id, topic, queue_id, count, data, sequence)
        try:
            async with asyncio.timeout(timeout):
                async with self._write_lock:
                    await self._call.write(request)
                return await future
        except TimeoutError:
            raise RequestTimeoutError(f"broker {self._address}: no answer to a send within {timeout} s "
                                      f"(the batch may still have been stored)") from None
        except (grpc.RpcError, asyncio.InvalidStateError) as e:
            self._fail(_write_failure(e, self._address, "produce", self._error))
            raise self._broken from None
        finally:
            self._pending.pop(request_id, None)

    async def _read(self) -> None:
        error: TidemarkError = UnavailableError(f"broker {self._address}: produce stream ended")
        try:
            async for response in self._call:
                future = self._pending.get(response.request_id)
                if future is None or future.done():
                    continue
                if response.code:
                    future.set_exception(from_status(response.code, response.error,
                                                     error_class=response.error_class, address=self._address))
                else:
                    future.set_result(response.first_queue_offset)
        except grpc.RpcError as e:
            error = self._error(e)
        except asyncio.CancelledError:
            if _cancelled(asyncio.current_task()):
                raise
            # else the call was cancelled (close() after its grace, a failed write): the stream ended
        finally:
            self._fail(error)

    def _fail(self, error: TidemarkError) -> None:
        if self._broken is None:
            self._broken = error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # its sender may have stopped waiting (timeout): nothing to report twice

    async def close(self) -> None:
        """End the stream: sends still waiting fail (UnavailableError); the broker's answers to them are not
        read. Half-closes and waits for the broker to end the call, or cancels it after CLOSE_GRACE_S."""
        self._fail(UnavailableError(f"broker {self._address}: produce stream closed"))
        async with self._write_lock:
            await _half_close(self._call)
            await _end_call(self._call, self._reader)


@dataclass(frozen=True, slots=True)
class QueueEnd:
    """Why the broker stopped serving a handle: a status with the offset to continue from, or an error."""

    status: str  # "OFFSET_ILLEGAL", "OFFSET_RESET" or "ERROR"
    next_offset: int = 0
    reset_generation: int = 0
    error: TidemarkError | None = None


@dataclass(frozen=True, slots=True)
class QueueStart:
    """Where a queue opened after_lock started: the group's committed offset under the grant's fence."""

    offset: int
    owner_epoch: int
    reset_generation: int


OnRecords = Callable[[int, int, bytes, int, int], None]  # handle, count, records, next_offset, max_offset
OnEnded = Callable[[int, QueueEnd], None]
OnStarted = Callable[[int, QueueStart], None]
OnBroken = Callable[[TidemarkError], None]


class FetchStream:
    """Queues read from one broker over one stream. Calls back on the event loop for every frame part.

    open_queue / credit / close_queue return at once: requests go out in order
    through one writer task (gRPC takes one write at a time per call).
    """

    def __init__(self, call: Any, address: str, *, on_records: OnRecords, on_ended: OnEnded,
                 on_broken: OnBroken, error: Callable[[grpc.RpcError], TidemarkError] | None = None,
                 on_started: OnStarted = lambda handle, start: None) -> None:
        self._call = call
        self._address = address
        self._error = error or (lambda e: from_rpc_error(e, address=address))  # as ProduceStream's
        self._on_records = on_records
        self._on_ended = on_ended
        self._on_started = on_started
        self._on_broken = on_broken
        self._outbox: asyncio.Queue[messaging_pb2.FetchRequest | None] = asyncio.Queue()
        self._broken = False
        self._open: set[int] = set()  # handles the broker serves: closed first when the stream closes
        loop = asyncio.get_running_loop()
        self._reader = loop.create_task(self._read(), name=f"fetch-read:{address}")
        self._writer = loop.create_task(self._write(), name=f"fetch-write:{address}")

    @property
    def usable(self) -> bool:
        return not self._broken

    @property
    def address(self) -> str:
        return self._address

    def open_queue(self, handle: int, group: str, mq: MessageQueue, offset: int, *, subscription: str,
                   fence: Fence | None, credit_messages: int, credit_bytes: int, batch_size: int,
                   expression_type: str = ExpressionType.TAG, after_lock: bool = False) -> None:
        """Start reading a queue; `subscription` is read as `expression_type` says (TAG, or SQL92: the broker
        then sends only the records whose properties satisfy it, and no client-side check is needed).
        `after_lock`: once the fence's client holds the queue's lock, from the committed offset (on_started
        says where and under which grant, before the records); `offset` is ignored, and the fence goes
        with owner epoch 0, so that a broker that does not know after_lock refuses it as fenced."""
        request = messaging_pb2.FetchRequest()
        o = request.open
        o.handle, o.group, o.topic, o.queue_id, o.offset = handle, group, mq.topic, mq.queue_id, offset
        o.subscription, o.credit_messages, o.credit_bytes = subscription, credit_messages, credit_bytes
        o.batch_size = batch_size
        if expression_type == ExpressionType.SQL92:
            o.expression_type = common_pb2.SQL92
        if after_lock and fence is not None:
            o.after_lock = True
            fence = Fence(fence.client_id, 0, None)
        if fence is not None:
            o.fence.CopyFrom(_fence_pb(fence))
        self._open.add(handle)
        self._outbox.put_nowait(request)

    def credit(self, handle: int, messages: int, nbytes: int, commit_offset: int | None = None) -> None:
        request = messaging_pb2.FetchRequest()
        c = request.credit
        c.handle, c.messages, c.bytes = handle, messages, nbytes
        if commit_offset is not None:
            c.commit_offset = commit_offset
        self._outbox.put_nowait(request)

    def close_queue(self, handle: int) -> None:
        self._open.discard(handle)
        request = messaging_pb2.FetchRequest()
        request.close.handle = handle
        self._outbox.put_nowait(request)

    async def _write(self) -> None:
        """Send the outbox in order; None ends the writer (after a half-close, when the stream closes)."""
        try:
            while (request := await self._outbox.get()) is not None:
                await self._call.write(request)
        except (grpc.RpcError, asyncio.InvalidStateError) as e:
            self._break(_write_failure(e, self._address, "fetch", self._error))
        else:
            await _half_close(self._call)

    async def _read(self) -> None:
        error: TidemarkError = UnavailableError(f"broker {self._address}: fetch stream ended")
        try:
            async for response in self._call:
                if self._broken:
                    continue  # closing: what was on its way is not wanted any more
                for start in response.started:  # (before the records: a handle's first ones may be here)
                    self._on_started(start.handle, QueueStart(start.offset, start.owner_epoch,
                                                              start.reset_generation))
                for part in response.records:
                    self._on_records(part.handle, part.count, part.records, part.next_offset, part.max_offset)
                for end in response.ended:
                    self._open.discard(end.handle)
                    self._on_ended(end.handle, _queue_end(end, self._address))
        except grpc.RpcError as e:
            error = self._error(e)
        except asyncio.CancelledError:
            if _cancelled(asyncio.current_task()):
                raise
            # else the call was cancelled (close() after its grace, a failed write): the stream ended
        except Exception as e:  # a consumer-side bug: reopening every queue of the stream recovers
            log.exception("fetch stream handler failed", event="fetch_handler_failed", broker=self._address)
            error = InternalError(f"broker {self._address}: fetched records could not be handled: {e!r}")
        finally:
            self._break(error)

    def _break(self, error: TidemarkError) -> None:
        if not self._broken:
            self._broken = True
            self._call.cancel()
            self._outbox.put_nowait(None)
            self._on_broken(error)

    async def close(self) -> None:
        """Close every open queue, half-close and wait for the broker to end the call (it forgets every
        handle of it), or cancel it after CLOSE_GRACE_S; both tasks are done when this returns. No
        callback runs once close() started."""
        self._broken = True
        for handle in sorted(self._open):
            self.close_queue(handle)
        self._outbox.put_nowait(None)  # the writer sends what is queued, then half-closes
        await _end_call(self._call, self._reader, self._writer)


async def _half_close(call: Any) -> None:
    """Tell the broker this side is done writing (nothing to do on a call that ended)."""
    if call.done():
        return
    try:
        await call.done_writing()
    except (grpc.RpcError, grpc.aio.InternalError, asyncio.InvalidStateError):
        pass  # the call failed under it: its reader reports why


async def _end_call(call: Any, *tasks: asyncio.Task) -> None:
    """Wait for the tasks reading and writing a call that was half-closed (or is ending) to finish, for
    CLOSE_GRACE_S; then cancel the call, and wait for them anyway. A cancellation of the caller propagates
    (after the call is cancelled)."""
    if not call.done():
        try:
            await asyncio.wait(tasks, timeout=CLOSE_GRACE_S)
        finally:
            call.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _cancelled(task: asyncio.Task | None) -> bool:
    """Whether the task itself is being cancelled (not only a gRPC call it reads, which grpc.aio reports
    as CancelledError too)."""
    return task is not None and task.cancelling() > 0


def _write_failure(e: grpc.RpcError | asyncio.InvalidStateError, address: str, kind: str,
                   error: Callable[[grpc.RpcError], TidemarkError]) -> TidemarkError:
    """The error for a stream whose write failed: a call that had ended, or whose connection went away under
    the write, is a broken stream (retriable), not a broker's INTERNAL answer."""
    if isinstance(e, asyncio.InvalidStateError):
        return UnavailableError(f"broker {address}: {kind} stream closed")
    if e.code() is grpc.StatusCode.INTERNAL and e.details() == _LOCAL_FAILURE:
        return UnavailableError(f"broker {address}: {kind} stream broken (the connection went away)",
                                code=Status.UNAVAILABLE)
    return error(e)


def _queue_end(pb: messaging_pb2.FetchEnded, address: str) -> QueueEnd:
    if pb.code:
        return QueueEnd("ERROR", error=from_status(pb.code, pb.error, error_class=pb.error_class, address=address))
    return QueueEnd(_STATUS_NAMES.get(pb.status, "OFFSET_ILLEGAL"), pb.next_offset, pb.reset_generation)
