"""Request intake: every request message is decoded here, and counted against a byte budget.

gRPC's own deserialisation runs before any handler, so a message that is not
valid protobuf ends in `UNKNOWN` with a traceback in the log, once per bad
request. `RequestIntake` is a server interceptor that registers each method
with raw-bytes input and decodes inside the call instead: undecodable bytes
get `INVALID_ARGUMENT` ("could not be decoded as tidemark.v1.X") and at most
one log line per `LOG_INTERVAL_S`, however many arrive.

The same place bounds the request bytes the broker holds at once
(`max_inflight_request_bytes`). gRPC already caps one message
(`grpc.max_receive_message_length`, set from `max_request_bytes`); this caps
their sum across calls:

- a unary request that would pass the budget is refused at once with
  `RESOURCE_EXHAUSTED` (the client backs off and retries), so a burst of
  large sends cannot pile up in memory while earlier ones wait for the disk;
- a streamed message waits for room instead: the stream is not read further
  meanwhile, so HTTP/2 flow control pushes back on that one sender.

A unary request's bytes count until its handler returns; a streamed message's
until the handler asks for the next one (or the stream ends).

Runs on the event loop; the budget needs no lock.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from broker.errors import InvalidArgumentError
from tidemark.logs import get_logger

log = get_logger("tidemark.broker.rpc")

LOG_INTERVAL_S = 10.0


class RequestBudget:
    """Bytes of request messages held by handlers, with a ceiling.

    `try_take` never blocks (unary calls); `take` waits for room (streams). A
    single message larger than the whole budget is let through when nothing
    else is held, so a limit below `max_request_bytes` cannot wedge a stream.
    """

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"request budget must be > 0 bytes, got {limit}")
        self.limit = limit
        self.held = 0
        self.refused = 0
        self._room = asyncio.Condition()

    def _fits(self, size: int) -> bool:
        return self.held + size <= self.limit or self.held == 0

    def try_take(self, size: int) -> bool:
        if not self._fits(size):
            self.refused += 1
            return False
        self.held += size
        return True

    async def take(self, size: int) -> None:
        async with self._room:
            await self._room.wait_for(lambda: self._fits(size))
            self.held += size

    def give(self, size: int) -> None:
        self.held -= size
        if self._room._waiters:  # type: ignore[attr-defined] - skip the task hop when nobody waits
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._room:
            self._room.notify_all()


class _Throttled:
    """One log line per interval for a kind of event; the lines in between are counted, not written."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._next_at = 0.0
        self._suppressed = 0

    def warning(self, msg: str, **fields: Any) -> None:
        now = self._clock()
        if now < self._next_at:
            self._suppressed += 1
            return
        log.warning(msg, suppressed_since_last=self._suppressed, **fields)
        self._suppressed = 0
        self._next_at = now + self._interval_s


class RequestIntake(grpc.aio.ServerInterceptor):
    """Decode requests inside the call (bad bytes: INVALID_ARGUMENT) and hold them within a byte budget."""

    def __init__(self, budget: RequestBudget) -> None:
        self.budget = budget
        self.undecodable = 0
        self._bad_request_log = _Throttled()
        self._overload_log = _Throttled()
        self._handlers: dict[str, grpc.RpcMethodHandler | None] = {}

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if method in self._handlers:
            return self._handlers[method]
        handler = await continuation(handler_call_details)
        wrapped = None if handler is None else self._wrap(method, handler)
        self._handlers[method] = wrapped  # handlers do not depend on the call's metadata
        return wrapped

    def _wrap(self, method: str, h: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        decode = h.request_deserializer or (lambda raw: raw)
        message_class = getattr(decode, "__self__", None)  # FromString of a generated message class
        descriptor = getattr(message_class, "DESCRIPTOR", None)
        unpack = _Unpacker(self, method, decode, descriptor.full_name if descriptor else "the request type")
        budget = self.budget
        if h.request_streaming:
            inner = h.stream_stream if h.response_streaming else h.stream_unary

            async def call(requests, context):
                return await inner(unpack.stream(requests, context), context)

            async def call_streaming(requests, context):
                async for response in inner(unpack.stream(requests, context), context):
                    yield response
        else:
            inner = h.unary_stream if h.response_streaming else h.unary_unary

            async def call(raw, context):
                size = await unpack.admit(raw, context)
                try:
                    return await inner(await unpack.one(raw, context), context)
                finally:
                    budget.give(size)

            async def call_streaming(raw, context):
                size = await unpack.admit(raw, context)
                try:
                    async for response in inner(await unpack.one(raw, context), context):
                        yield response
                finally:
                    budget.give(size)

        # A streaming answer comes from an async generator, or from a coroutine that calls context.write.
        behaviour = call_streaming if inspect.isasyncgenfunction(inner) else call
        make = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
                (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
        return make[(h.request_streaming, h.response_streaming)](behaviour, response_serializer=h.response_serializer)

    def bad_request(self, method: str, type_name: str, size: int, error: Exception) -> None:
        self.undecodable += 1
        self._bad_request_log.warning("undecodable request refused", event="request_undecodable",
                                      method=method, type=type_name, bytes=size, error=str(error)[:200],
                                      total=self.undecodable)

    def overloaded(self, method: str, size: int) -> None:
        self._overload_log.warning("request refused: request bytes in flight at the limit",
                                   event="request_overload", method=method, bytes=size, held=self.budget.held,
                                   limit=self.budget.limit, total=self.budget.refused)


class _Unpacker:
    """Decoding and budget accounting for one method's requests."""

    __slots__ = ("_intake", "_method", "_decode", "_type_name")

    def __init__(self, intake: RequestIntake, method: str, decode: Callable[[bytes], Any], type_name: str) -> None:
        self._intake = intake
        self._method = method
        self._decode = decode
        self._type_name = type_name

    async def admit(self, raw: bytes, context: grpc.aio.ServicerContext) -> int:
        size = len(raw)
        if not self._intake.budget.try_take(size):
            self._intake.overloaded(self._method, size)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"broker is holding {self._intake.budget.held} bytes of requests "
                                f"(limit {self._intake.budget.limit}); retry later")
        return size

    def decode(self, raw: bytes) -> Any:
        try:
            return self._decode(raw)
        except (DecodeError, ValueError, TypeError, UnicodeDecodeError) as e:
            self._intake.bad_request(self._method, self._type_name, len(raw), e)
            raise InvalidArgumentError(f"request could not be decoded as {self._type_name}: {str(e)[:200]}") from None

    async def one(self, raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            return self.decode(raw)
        except InvalidArgumentError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    async def stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        """The stream's messages decoded. An undecodable one raises InvalidArgumentError in the handler,
        which ends the call with INVALID_ARGUMENT as it does any domain error."""
        budget = self._intake.budget
        held = 0
        try:
            async for raw in requests:
                budget.give(held)
                held = 0
                await budget.take(len(raw))
                held = len(raw)
                yield self.decode(raw)
        finally:
            budget.give(held)
