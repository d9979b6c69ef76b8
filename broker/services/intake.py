"""Request intake: every call is authenticated, and every request message decoded, authorised and
counted against a byte budget, here, before a servicer sees it.

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
  meanwhile, so HTTP/2 flow control pushes back on that one sender;
- requests up to `SMALL_REQUEST_BYTES` always get in (heartbeats, lock
  renewals and commits must not starve behind bulk sends).

A unary request's bytes count until its handler returns (a server-streaming
call's only until it is decoded); a streamed message's until the handler asks
for the next one, so an idle stream holds nothing.

With `--auth`, a call is authenticated from its metadata before any of its
request bytes are read (UNAUTHENTICATED), and each decoded request, or each
message of a stream, is authorised against what services/access.py says it
needs (PERMISSION_DENIED); a refusal is logged at most once per interval.
A protocol whose unary answers carry their own status (RocketMQ 5's) gets its
refusals as an answer instead (`refusal_answers`), so its clients' error
handling sees FORBIDDEN rather than a broken call.

Runs on the event loop; the budget needs no lock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from tidemark.broker.auth.guard import AccessGuard
from tidemark.broker.errors import BrokerError, InvalidArgumentError
from tidemark.broker.services.access import SUPER_ONLY, Caller, MethodAccess, needs_for
from tidemark.broker.services.errors import status_for
from tidemark.broker.services.streams import STOPPING, OpenStreams, marked_last, marked_long_poll
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.rpc")

LOG_INTERVAL_S = 10.0
# Requests up to this size are always admitted (and counted).
SMALL_REQUEST_BYTES = 64 * 1024
# This many bytes of large requests make a burst, after which freed memory is given back.
BURST_BYTES = 32 * 1024 * 1024


class RequestBudget:
    """Bytes of request messages held by handlers, with a ceiling.

    `try_take` never blocks (unary calls); `take` waits for room (streams).
    Small messages (heartbeats, lock renewals, commits, credit) always get in,
    so bulk sends filling the budget cannot starve the calls that keep
    consumers alive; and a message larger than the whole budget gets in when
    nothing else is held, so a limit below `max_request_bytes` cannot wedge a
    stream.
    """

    def __init__(self, limit: int, small: int = SMALL_REQUEST_BYTES,
                 on_burst_over: Callable[[], None] = lambda: None) -> None:
        if limit <= 0:
            raise ValueError(f"request budget must be > 0 bytes, got {limit}")
        self.limit = limit
        self.small = small
        self.held = 0
        self.refused = 0
        # Called when nothing is held any more after at least BURST_BYTES of large requests went
        # through (memory.Trimmer gives their freed buffers back).
        self._on_burst_over = on_burst_over
        self._large_bytes = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def _fits(self, size: int) -> bool:
        return size <= self.small or self.held + size <= self.limit or self.held == 0

    def try_take(self, size: int) -> bool:
        if not self._fits(size):
            self.refused += 1
            return False
        self.held += size
        if size > self.small:
            self._large_bytes += size
        return True

    def take_now(self, size: int) -> bool:
        """`take` when there is room now (True); False, with nothing taken, when it would have to wait."""
        if not self._fits(size):
            return False
        self.held += size
        if size > self.small:
            self._large_bytes += size
        return True

    async def take(self, size: int) -> None:
        while not self._fits(size):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if not waiter.done():
                    waiter.cancel()
        self.held += size
        if size > self.small:
            self._large_bytes += size

    def give(self, size: int) -> None:
        if not size:
            return
        self.held -= size
        if self.held == 0 and self._large_bytes >= BURST_BYTES:
            self._large_bytes = 0
            self._on_burst_over()
        while self._waiters:  # every waiter re-checks: one large release may admit several
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)


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

    def __init__(self, budget: RequestBudget, guard: AccessGuard | None = None,
                 refusal_answers: Callable[[str], Callable[[BrokerError], Any] | None] = lambda method: None,
                 streams: OpenStreams | None = None) -> None:
        self.budget = budget
        # The streams' handlers (coroutines that write) run through it, to end when the broker stops.
        self.streams = streams if streams is not None else OpenStreams()
        self.guard = guard  # None: authentication and authorization are off
        # method path -> how its calls answer an access refusal in the response (None: they abort)
        self._refusal_answers = refusal_answers
        self.undecodable = 0
        self._bad_request_log = _Throttled()
        self._overload_log = _Throttled()
        self.refusals = 0
        self._refusal_log = _Throttled()
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
        access = None if self.guard is None else MethodAccess(self.guard, method)
        # A refusal answered in the protocol's response: a unary call's one answer, or the answers
        # an async-generator handler of a server-streaming call would have yielded.
        answerable = not h.request_streaming and (
            not h.response_streaming or inspect.isasyncgenfunction(h.unary_stream))
        unpack = _Unpacker(self, method, decode, descriptor.full_name if descriptor else "the request type",
                           None if access is None or access.open else access,
                           closed=self.guard is None and needs_for(method) is SUPER_ONLY,
                           refusal=self._refusal_answers(method) if answerable else None)
        budget, streams = self.budget, self.streams
        if h.request_streaming:
            inner = h.stream_stream if h.response_streaming else h.stream_unary
            last = marked_last(inner)

            # A servicer that is not Tidemark's (reflection) lets the stream's refusal of a message (bad
            # bytes: logged once per interval by `bad_request`; access) escape: answered here with its
            # status, not as UNKNOWN with a traceback each. Tidemark's servicers answer their own.
            async def call(requests, context):
                caller = await unpack.caller(context)
                async with contextlib.aclosing(unpack.stream(requests, context, caller)) as stream:
                    try:
                        return await streams.run(inner(stream, context), context, last=last)
                    except BrokerError as e:
                        await context.abort(status_for(e), str(e))

            # The handler's answers are closed before its requests: a handler still inside the request
            # stream when that closes raises "aclose(): asynchronous generator is already running".
            async def call_streaming(requests, context):
                caller = await unpack.caller(context)
                async with contextlib.aclosing(unpack.stream(requests, context, caller)) as stream:
                    async with contextlib.aclosing(inner(stream, context)) as responses:
                        try:
                            async for response in responses:
                                yield response
                        except BrokerError as e:
                            await context.abort(status_for(e), str(e))
        else:
            inner = h.unary_stream if h.response_streaming else h.unary_unary

            # The common case (no access control or an allowed caller, room in the budget, a decodable
            # request) runs without a coroutine of its own per step: a unary call's intake is on the
            # critical path of every synchronous request.
            identifies = unpack.identifies
            polls = marked_long_poll(inner)  # refused once the broker stops (services/streams.py)

            async def call(raw, context):
                if polls and streams.stopping:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)
                caller = None
                if identifies:
                    try:
                        caller = await unpack.caller(context)
                    except _Refused as refused:
                        return refused.answer
                size = len(raw)
                if not budget.try_take(size):
                    await unpack.overloaded(size, context)
                if h.response_streaming:  # a watch: its request is done with once decoded
                    try:
                        request = unpack.checked(raw, caller)
                        if request is _FAILED:
                            request = await unpack.one(raw, context, caller)
                    finally:
                        budget.give(size)
                    return await streams.run(inner(request, context), context)
                try:
                    request = unpack.checked(raw, caller)
                    if request is _FAILED:
                        request = await unpack.one(raw, context, caller)
                    return await inner(request, context)
                except _Refused as refused:
                    return refused.answer
                finally:
                    budget.give(size)

            async def call_streaming(raw, context):
                if polls and streams.stopping:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)
                try:
                    caller = await unpack.caller(context) if identifies else None
                    size = await unpack.admit(raw, context)
                    try:
                        request = await unpack.one(raw, context, caller)
                    finally:
                        budget.give(size)
                except _Refused as refused:
                    for response in refused.answer:
                        yield response
                    return
                async with contextlib.aclosing(inner(request, context)) as responses:  # closed with this one
                    async for response in responses:
                        yield response

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

    def refused(self, method: str, error: BrokerError) -> None:
        self.refusals += 1
        self._refusal_log.warning("request refused by access control", event="access_refused", method=method,
                                  error=type(error).__name__, reason=str(error)[:200], total=self.refusals)

    def overloaded(self, method: str, size: int) -> None:
        self._overload_log.warning("request refused: request bytes in flight at the limit",
                                   event="request_overload", method=method, bytes=size, held=self.budget.held,
                                   limit=self.budget.limit, total=self.budget.refused)


_FAILED = object()  # _Unpacker.checked: not decodable or not allowed


class _Refused(Exception):
    """An access refusal answered in the protocol's own response (`refusal_answers`)."""

    def __init__(self, answer: Any) -> None:
        super().__init__("refused")
        self.answer = answer


class _Unpacker:
    """Decoding, access checks and budget accounting for one method's requests."""

    __slots__ = ("_intake", "_method", "_decode", "_type_name", "_access", "_closed", "_refusal")

    def __init__(self, intake: RequestIntake, method: str, decode: Callable[[bytes], Any], type_name: str,
                 access: MethodAccess | None = None, *, closed: bool = False,
                 refusal: Callable[[BrokerError], Any] | None = None) -> None:
        self._intake = intake
        self._method = method
        self._decode = decode
        self._type_name = type_name
        self._access = access
        # Users and ACLs on a broker without --auth: nobody could be trusted to create the first super
        # user, who would then own the broker once auth is turned on.
        self._closed = closed
        self._refusal = refusal

    async def _refuse(self, context: grpc.aio.ServicerContext, error: BrokerError) -> None:
        if self._refusal is not None:
            raise _Refused(self._refusal(error))
        await context.abort(status_for(error), str(error))

    @property
    def identifies(self) -> bool:
        """Whether `caller` has anything to do for this method (access control on, or a closed method)."""
        return self._closed or self._access is not None

    async def caller(self, context: grpc.aio.ServicerContext) -> Caller | None:
        """Who calls (None when access control is off or the method is open); UNAUTHENTICATED, or
        PERMISSION_DENIED for a super-user method, before any request byte is read."""
        if self._closed:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "users and ACLs are managed only on a broker started with --auth "
                                "(the first super user comes from --init-user / TIDEMARK_INIT_USER)")
        if self._access is None:
            return None
        try:
            return self._access.caller(context.invocation_metadata() or (), context.peer() or "")
        except BrokerError as e:
            self._intake.refused(self._method, e)
            await self._refuse(context, e)

    def _check(self, caller: Caller | None, request: Any, *, stream: bool = False) -> None:
        if caller is not None:
            try:
                if stream:
                    self._access.check_stream_message(caller, request)
                else:
                    self._access.check(caller, request)
            except BrokerError as e:
                self._intake.refused(self._method, e)
                raise

    async def admit(self, raw: bytes, context: grpc.aio.ServicerContext) -> int:
        size = len(raw)
        if not self._intake.budget.try_take(size):
            await self.overloaded(size, context)
        return size

    async def overloaded(self, size: int, context: grpc.aio.ServicerContext) -> None:
        """RESOURCE_EXHAUSTED for a unary request the budget had no room for (`try_take` said no)."""
        self._intake.overloaded(self._method, size)
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"broker is holding {self._intake.budget.held} bytes of requests "
                            f"(limit {self._intake.budget.limit}); retry later")

    def decode(self, raw: bytes) -> Any:
        try:
            return self._decode(raw)
        except (DecodeError, ValueError, TypeError, UnicodeDecodeError) as e:
            self._intake.bad_request(self._method, self._type_name, len(raw), e)
            raise InvalidArgumentError(f"request could not be decoded as {self._type_name}: {str(e)[:200]}") from None

    def checked(self, raw: bytes, caller: Caller | None) -> Any:
        """The request decoded and allowed; or _FAILED, with nothing counted or logged: then `one` decodes
        and checks it again, and refuses it as it says."""
        try:
            request = self._decode(raw)
            if caller is not None:
                self._access.check(caller, request)
        except (DecodeError, ValueError, TypeError, UnicodeDecodeError, BrokerError):
            return _FAILED
        return request

    async def one(self, raw: bytes, context: grpc.aio.ServicerContext, caller: Caller | None = None) -> Any:
        try:
            request = self.decode(raw)
        except BrokerError as e:
            await context.abort(status_for(e), str(e))
        try:
            self._check(caller, request)
        except BrokerError as e:
            await self._refuse(context, e)
        return request

    async def stream(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext,
                     caller: Caller | None = None) -> AsyncIterator[Any]:
        """The stream's messages decoded. An undecodable one raises InvalidArgumentError in the handler,
        which ends the call with INVALID_ARGUMENT as it does any domain error. A message counts from its
        arrival until the handler asks for the next one: an idle stream holds nothing."""
        budget = self._intake.budget
        held = 0
        iterator = requests.__aiter__()
        try:
            while True:
                budget.give(held)
                held = 0
                try:
                    raw = await iterator.__anext__()
                except StopAsyncIteration:
                    return
                held = len(raw)
                if not budget.take_now(held):
                    held = 0
                    await budget.take(len(raw))
                    held = len(raw)
                request = self.decode(raw)
                self._check(caller, request, stream=True)  # a refused message ends the stream
                yield request
        finally:
            budget.give(held)
