"""`apache.rocketmq.v2.MessagingService` served from the broker's domain.

The method paths are upstream's; the message classes are Tidemark's
declaration of the same wire format (tidemark.rmq5.v2), so the handlers are
registered by path (`handlers()`), not through generated service code.
Unary answers carry their result in `status` (status.py); a method not served
yet answers gRPC UNIMPLEMENTED with a message saying so, never a hang.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from tidemark.broker.controller import BrokerController
from tidemark.broker.errors import (
    BrokerError,
    InvalidArgumentError,
)
from tidemark.broker.operations import (
    MAX_BATCH,
    Commit,
    OffsetPolicy,
    Outcome,
    PendingCheck,
    PullRequest,
    PullStatus,
    ReceiveRequest,
    TransactionWatch,
)
from tidemark.broker.services.errors import status_for
from tidemark.broker.services.rmq5 import convert
from tidemark.broker.services.rmq5.status import (
    Code,
    ProtocolError,
    ok,
    status_of,
)
from tidemark.broker.services.rmq5.telemetry import (
    LONG_POLLING_TIMEOUT_MS,
    RECEIVE_BATCH_SIZE,
    ClientRegistry,
    client_id_of,
    filter_expression,
)
from tidemark.broker.services.streams import long_poll, write
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import cancel_and_wait
from tidemark.rmq5.v2 import messaging_pb2 as pb

log = get_logger("tidemark.broker.rmq5")

SERVICE = "apache.rocketmq.v2.MessagingService"
# A Telemetry stream must say who it is within this time.
SETTINGS_TIMEOUT_S = 30.0
ACCEPTED_TYPES = (pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION)
# A receive answers this long before the call's deadline; and never polls longer than this.
POLL_RESERVE_MS = 1_000
MAX_POLL_MS = 30_000


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    request: type
    response: type
    request_streaming: bool = False
    response_streaming: bool = False

    @property
    def path(self) -> str:
        return f"/{SERVICE}/{self.name}"


METHODS = (
    Method("QueryRoute", pb.QueryRouteRequest, pb.QueryRouteResponse),
    Method("Heartbeat", pb.HeartbeatRequest, pb.HeartbeatResponse),
    Method("SendMessage", pb.SendMessageRequest, pb.SendMessageResponse),
    Method("QueryAssignment", pb.QueryAssignmentRequest, pb.QueryAssignmentResponse),
    Method("ReceiveMessage", pb.ReceiveMessageRequest, pb.ReceiveMessageResponse, response_streaming=True),
    Method("AckMessage", pb.AckMessageRequest, pb.AckMessageResponse),
    Method("ForwardMessageToDeadLetterQueue", pb.ForwardMessageToDeadLetterQueueRequest,
           pb.ForwardMessageToDeadLetterQueueResponse),
    Method("PullMessage", pb.PullMessageRequest, pb.PullMessageResponse, response_streaming=True),
    Method("UpdateOffset", pb.UpdateOffsetRequest, pb.UpdateOffsetResponse),
    Method("GetOffset", pb.GetOffsetRequest, pb.GetOffsetResponse),
    Method("QueryOffset", pb.QueryOffsetRequest, pb.QueryOffsetResponse),
    Method("EndTransaction", pb.EndTransactionRequest, pb.EndTransactionResponse),
    Method("Telemetry", pb.TelemetryCommand, pb.TelemetryCommand, request_streaming=True, response_streaming=True),
    Method("NotifyClientTermination", pb.NotifyClientTerminationRequest, pb.NotifyClientTerminationResponse),
    Method("ChangeInvisibleDuration", pb.ChangeInvisibleDurationRequest, pb.ChangeInvisibleDurationResponse),
    Method("RecallMessage", pb.RecallMessageRequest, pb.RecallMessageResponse),
)
UNSUPPORTED = {
    "RecallMessage": "recalling delayed messages is not supported by this broker",
}


def answers(response: type) -> Callable:
    """A unary handler whose domain errors become the response's status (and whose config changes,
    a topic or group created on the way, are durable before it answers)."""
    def wrap(handler: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(handler)
        async def wrapper(self: Rmq5Servicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                answer = await handler(self, request, context)
                await self._b.flush_configs()
                return answer
            except BrokerError as e:
                return response(status=status_of(e))
            except Exception:
                log.exception("rmq5 rpc failed", event="rpc_error", method=handler.__name__)
                return response(status=pb.Status(code=Code.INTERNAL_ERROR,
                                                 message=f"internal error in {handler.__name__}; see the broker log"))
        return wrapper
    return wrap


class Rmq5Servicer:
    def __init__(self, broker: BrokerController) -> None:
        self._b = broker
        self._ops = broker.operations
        self.clients = ClientRegistry(broker)

    # ---- routes and clients ---------------------------------------------------------------------------

    @answers(pb.QueryRouteResponse)
    async def QueryRoute(self, request, context: grpc.aio.ServicerContext):
        name = convert.resource_name(request.topic, "topic")
        route = self._ops.route(name)
        broker = pb.Broker(name=self._b.config.broker_name, id=0, endpoints=self._endpoints(request.endpoints))
        queues = []
        for queue_id in range(route.queue_count):
            r, w = route.queue_readable(queue_id), route.queue_writable(queue_id)
            queues.append(pb.MessageQueue(
                topic=request.topic, id=queue_id, broker=broker, accept_message_types=ACCEPTED_TYPES,
                permission=pb.READ_WRITE if r and w else pb.READ if r else pb.WRITE if w else pb.NONE))
        return pb.QueryRouteResponse(status=ok(), message_queues=queues)

    def _endpoints(self, asked: pb.Endpoints) -> pb.Endpoints:
        """Where clients reach this broker: the address they used (a proxy answers the same), else the
        broker's own."""
        if asked.addresses:
            return asked
        host, _, port = self._b.config.address.rpartition(":")
        return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=int(port))])

    @answers(pb.HeartbeatResponse)
    async def Heartbeat(self, request, context: grpc.aio.ServicerContext):
        client_id = client_id_of(context.invocation_metadata())
        group = convert.resource_name(request.group, "group") if request.HasField("group") else ""
        self.clients.heartbeat(client_id, group, request.client_type, context.peer() or "")
        return pb.HeartbeatResponse(status=ok())

    @answers(pb.NotifyClientTerminationResponse)
    async def NotifyClientTermination(self, request, context: grpc.aio.ServicerContext):
        client_id = client_id_of(context.invocation_metadata())
        group = convert.resource_name(request.group, "group") if request.HasField("group") else ""
        self.clients.terminated(client_id, group)
        return pb.NotifyClientTerminationResponse(status=ok())

    async def Telemetry(self, requests, context: grpc.aio.ServicerContext) -> None:
        """Settings in, effective settings out, and to a producer the checks of half messages on its topics
        (RecoverOrphanedTransactionCommand); the stream lives as long as the client. A coroutine that writes
        its answers and awaits its read of the next command before it returns (services/streams.py)."""
        try:
            client_id = client_id_of(context.invocation_metadata())
        except BrokerError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        commands = requests.__aiter__()
        said = None
        checks = _TransactionChecks(self._ops.watch_transactions, client_id)
        try:
            try:
                async with asyncio.timeout(SETTINGS_TIMEOUT_S):
                    command = await anext(commands, None)
            except TimeoutError:
                raise InvalidArgumentError(
                    f"no settings within {SETTINGS_TIMEOUT_S:.0f} s of opening the telemetry stream") from None
            if command is not None and command.WhichOneof("command") != "settings":
                raise InvalidArgumentError("a telemetry stream must start with the client's settings")
            while command is not None:
                if command.WhichOneof("command") == "settings":
                    answer = self.clients.settings(client_id, command.settings, context.peer() or "")
                    said = self.clients.get(client_id)
                    checks.watch(said.topics if said.client_type == pb.PRODUCER else ())
                    await self._b.flush_configs()
                    await write(context, pb.TelemetryCommand(status=ok(), settings=answer))
                # Other commands answer the broker's own requests (stack traces, verification), or carry
                # nothing the broker needs.
                while (check := await checks.next(commands)) is not None:
                    await write(context, pb.TelemetryCommand(
                        recover_orphaned_transaction_command=pb.RecoverOrphanedTransactionCommand(
                            message=convert.received(check.message, store_host=self._b.config.address,
                                                     namespace=said.namespace if said else ""),
                            transaction_id=str(check.half_offset))))
                command = checks.command
        except BrokerError as e:
            # Telemetry's errors are gRPC statuses (the proxy's): the client reopens the stream.
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT if isinstance(e, InvalidArgumentError)
                                else status_for(e), str(e))
        finally:
            await checks.close()
            self.clients.disconnected(client_id, said)

    # ---- sending --------------------------------------------------------------------------------------

    @answers(pb.SendMessageResponse)
    async def SendMessage(self, request, context: grpc.aio.ServicerContext):
        if not request.messages:
            raise ProtocolError(Code.BAD_REQUEST, "a send needs at least one message")
        topic = convert.resource_name(request.messages[0].topic, "topic")
        if any(convert.resource_name(m.topic, "topic") != topic for m in request.messages):
            raise ProtocolError(Code.MESSAGE_CORRUPTED, "the messages of one send must share a topic")
        limit = self._b.config.max_message_size
        batches: dict[str, list] = {}
        for m in request.messages:  # every entry checked before anything is stored
            message, group = convert.outgoing(m, limit)
            batches.setdefault(group, []).append(message)
        # One message group, one queue: its messages keep their order (FIFO). Several groups are stored all
        # or nothing (Operations.send_groups), short of a store write failing part way.
        if len(batches) == 1:
            [(group, messages)] = batches.items()
            sent, error = [await self._ops.send(topic, None, messages, queue_key=group)], None
        else:
            result = await self._ops.send_groups(topic, list(batches.items()))
            sent, error = result.sent, result.error
        results = {s.msg_id: s for group in sent for s in group}
        return send_answer(request.messages, results, error)

    @answers(pb.EndTransactionResponse)
    async def EndTransaction(self, request, context: grpc.aio.ServicerContext):
        topic = convert.resource_name(request.topic, "topic")
        try:
            half_offset = int(request.transaction_id)
        except ValueError:
            raise ProtocolError(Code.INVALID_TRANSACTION_ID,
                                f"transaction id {request.transaction_id!r:.80} was not given by this broker") from None
        if request.resolution == pb.TRANSACTION_RESOLUTION_UNSPECIFIED:
            return pb.EndTransactionResponse(status=ok())  # not known yet: the next check asks again
        outcome = Outcome.COMMIT if request.resolution == pb.COMMIT else Outcome.ROLLBACK
        await self._ops.end_transaction(convert.RMQ5_PRODUCER_GROUP, request.message_id, half_offset, outcome,
                                        from_check=request.source == pb.SOURCE_SERVER_CHECK, topic=topic)
        return pb.EndTransactionResponse(status=ok())

    # ---- pop consumption ------------------------------------------------------------------------------

    @answers(pb.QueryAssignmentResponse)
    async def QueryAssignment(self, request, context: grpc.aio.ServicerContext):
        """The push consumer's load balancing is the broker's: every member may receive from every
        queue (pop), so the assignment is the whole topic, as queue -1."""
        name = convert.resource_name(request.topic, "topic")
        convert.resource_name(request.group, "group")
        if not self._ops.route(name).queue_readable(0):
            raise ProtocolError(Code.FORBIDDEN, f"topic {name!r} has no readable queue on this broker")
        queue = pb.MessageQueue(topic=request.topic, id=-1, permission=pb.READ_WRITE,
                                broker=pb.Broker(name=self._b.config.broker_name, id=0,
                                                 endpoints=self._endpoints(request.endpoints)),
                                accept_message_types=ACCEPTED_TYPES)
        return pb.QueryAssignmentResponse(status=ok(), assignments=[pb.Assignment(message_queue=queue)])

    @long_poll
    async def ReceiveMessage(self, request, context: grpc.aio.ServicerContext):
        """A stream: the status, the messages, then the time of delivery (also after an error)."""
        b = self._b
        try:
            r = self._receive_request(request, context)
            received = await self._ops.receive(r)
        except BrokerError as e:
            yield pb.ReceiveMessageResponse(status=status_of(e))
            yield pb.ReceiveMessageResponse(delivery_timestamp=convert.timestamp(b.clock_ms()))
            return
        except Exception:  # a bug, or the pop journal's disk failing: said to the client, logged once here
            log.exception("rmq5 receive failed", event="rpc_error", method="ReceiveMessage")
            yield pb.ReceiveMessageResponse(status=pb.Status(code=Code.INTERNAL_ERROR,
                                                             message="internal error in ReceiveMessage; see the broker log"))
            yield pb.ReceiveMessageResponse(delivery_timestamp=convert.timestamp(b.clock_ms()))
            return
        if not received:
            yield pb.ReceiveMessageResponse(status=pb.Status(code=Code.MESSAGE_NOT_FOUND, message="no new message"))
        else:
            yield pb.ReceiveMessageResponse(status=ok())
            store_host, namespace = b.config.address, request.message_queue.topic.resource_namespace
            for item in received:
                m = convert.received(item.message, store_host=store_host, delivery_attempt=item.attempt,
                                     namespace=namespace)
                m.system_properties.receipt_handle = item.handle
                m.system_properties.invisible_duration.CopyFrom(convert.duration(item.invisible_ms))
                yield pb.ReceiveMessageResponse(message=m)
        yield pb.ReceiveMessageResponse(delivery_timestamp=convert.timestamp(b.clock_ms()))

    def _receive_request(self, request, context: grpc.aio.ServicerContext) -> ReceiveRequest:
        group = convert.resource_name(request.group, "group")
        topic = convert.resource_name(request.message_queue.topic, "topic")
        self._ops.require_topic(topic)  # TOPIC_NOT_FOUND before any complaint about the rest
        client_id = client_id_of(context.invocation_metadata())
        if request.auto_renew:
            invisible_ms = self._ops.renew_slice_ms
        elif request.HasField("invisible_duration"):
            invisible_ms = convert.duration_ms(request.invisible_duration)
        else:
            raise ProtocolError(Code.ILLEGAL_INVISIBLE_TIME, "invisible_duration is required without auto_renew")
        poll_ms = (convert.duration_ms(request.long_polling_timeout) if request.HasField("long_polling_timeout")
                   else LONG_POLLING_TIMEOUT_MS)
        remaining = context.time_remaining()
        if remaining is not None:
            # Answer before the client's deadline, or its receive fails instead of finding nothing.
            poll_ms = min(poll_ms, int(remaining * 1000) - POLL_RESERVE_MS)
        if poll_ms < 0:
            raise ProtocolError(Code.ILLEGAL_POLLING_TIME,
                                f"the call's deadline leaves no time to poll (long_polling_timeout {poll_ms} ms)")
        batch = request.batch_size or RECEIVE_BATCH_SIZE
        if batch < 1:
            raise ProtocolError(Code.BAD_REQUEST, f"batch_size {batch} must be positive")
        return ReceiveRequest(group=group, topic=topic, filter=filter_expression(request.filter_expression),
                              batch=batch, invisible_ms=invisible_ms, client_id=client_id,
                              auto_renew=request.auto_renew, poll_ms=min(poll_ms, MAX_POLL_MS),
                              attempt_id=request.attempt_id if request.HasField("attempt_id") else "")

    @answers(pb.AckMessageResponse)
    async def AckMessage(self, request, context: grpc.aio.ServicerContext):
        group = convert.resource_name(request.group, "group")
        topic = convert.resource_name(request.topic, "topic")
        if not request.entries:
            raise ProtocolError(Code.BAD_REQUEST, "an ack needs at least one entry")
        entries = []
        for entry in request.entries:
            try:
                self._ops.ack(group, topic, entry.receipt_handle)
                status = ok()
            except BrokerError as e:
                status = status_of(e)
            entries.append(pb.AckMessageResultEntry(message_id=entry.message_id,
                                                    receipt_handle=entry.receipt_handle, status=status))
        codes = {e.status.code for e in entries}
        overall = entries[0].status if len(codes) == 1 else pb.Status(
            code=Code.MULTIPLE_RESULTS, message="the entries have different results")
        return pb.AckMessageResponse(status=overall, entries=entries)

    @answers(pb.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(self, request, context: grpc.aio.ServicerContext):
        group = convert.resource_name(request.group, "group")
        topic = convert.resource_name(request.topic, "topic")
        handle = self._ops.change_invisible(group, topic, request.receipt_handle,
                                            convert.duration_ms(request.invisible_duration))
        return pb.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=handle)

    @answers(pb.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(self, request, context: grpc.aio.ServicerContext):
        group = convert.resource_name(request.group, "group")
        topic = convert.resource_name(request.topic, "topic")
        await self._ops.dead_letter(group, topic, request.receipt_handle)
        return pb.ForwardMessageToDeadLetterQueueResponse(status=ok())

    # ---- queue-offset consumption (the Java PullConsumer) -----------------------------------------------

    @long_poll
    async def PullMessage(self, request, context: grpc.aio.ServicerContext):
        """A stream: the status, the messages, then the next offset; onto the offset manager's pull."""
        b = self._b
        try:
            group, topic = self._group_and_queue_topic(request)
            f = filter_expression(request.filter_expression)
            outcome = await self._ops.pull(PullRequest(
                group=group, topic=topic, queue_id=request.message_queue.id, queue_offset=request.offset,
                max_msg_nums=min(request.batch_size or RECEIVE_BATCH_SIZE, MAX_BATCH),
                suspend_timeout_ms=convert.duration_ms(request.long_polling_timeout),
                subscription=f.expression, expression_type=f.expression_type, commit_offset=None, fence=None))
        except BrokerError as e:
            yield pb.PullMessageResponse(status=status_of(e))
            return
        if outcome.status is PullStatus.OFFSET_ILLEGAL:
            yield pb.PullMessageResponse(status=pb.Status(
                code=Code.ILLEGAL_OFFSET, message=f"offset {request.offset} is outside "
                f"{outcome.min_offset}..{outcome.max_offset} of queue {request.message_queue.id}"))
        elif outcome.messages:
            yield pb.PullMessageResponse(status=ok())
            for m in outcome.messages:
                yield pb.PullMessageResponse(message=convert.received(
                    m, store_host=b.config.address, delivery_attempt=m.reconsume_times + 1,
                    namespace=request.message_queue.topic.resource_namespace))
        else:
            yield pb.PullMessageResponse(status=pb.Status(code=Code.MESSAGE_NOT_FOUND, message="no new message"))
        yield pb.PullMessageResponse(next_offset=outcome.next_begin_offset)

    @answers(pb.UpdateOffsetResponse)
    async def UpdateOffset(self, request, context: grpc.aio.ServicerContext):
        group, topic = self._group_and_queue_topic(request)
        await self._ops.commit(Commit(group, topic, request.message_queue.id, request.offset, None))
        return pb.UpdateOffsetResponse(status=ok())

    @answers(pb.GetOffsetResponse)
    async def GetOffset(self, request, context: grpc.aio.ServicerContext):
        group, topic = self._group_and_queue_topic(request)
        offset, _ = self._ops.committed(group, topic, request.message_queue.id)
        if offset < 0:
            raise ProtocolError(Code.OFFSET_NOT_FOUND, f"group {group!r} has no offset on queue "
                                f"{request.message_queue.id} of {topic!r}")
        return pb.GetOffsetResponse(status=ok(), offset=offset)

    @answers(pb.QueryOffsetResponse)
    async def QueryOffset(self, request, context: grpc.aio.ServicerContext):
        topic = convert.resource_name(request.message_queue.topic, "topic")
        policy = _POLICIES.get(request.query_offset_policy, OffsetPolicy.TIMESTAMP)
        if policy is OffsetPolicy.TIMESTAMP and not request.HasField("timestamp"):
            raise ProtocolError(Code.BAD_REQUEST, "a TIMESTAMP query needs a timestamp")
        offset = self._ops.queue_offset(topic, request.message_queue.id, policy,
                                        convert.timestamp_ms(request.timestamp))
        return pb.QueryOffsetResponse(status=ok(), offset=offset)

    def _group_and_queue_topic(self, request) -> tuple[str, str]:
        group = convert.resource_name(request.group, "group")
        topic = convert.resource_name(request.message_queue.topic, "topic")
        self._ops.require_topic(topic)
        return group, topic


class _TransactionChecks:
    """A producer's transaction checks, taken beside the commands it sends on its telemetry stream."""

    def __init__(self, watch: Callable[[str, str, tuple[str, ...]], TransactionWatch], client_id: str) -> None:
        self._watch_for = watch
        self._client_id = client_id
        self._watch: TransactionWatch | None = None
        self._read: asyncio.Future | None = None  # the next command, read across checks
        self._get: asyncio.Future | None = None
        self.command: pb.TelemetryCommand | None = None

    def watch(self, topics: tuple[str, ...]) -> None:
        """(Re)register for the checks of half messages on `topics` (none: not a producer)."""
        self._stop_watch()
        if topics:
            self._watch = self._watch_for(convert.RMQ5_PRODUCER_GROUP, self._client_id, topics)

    async def next(self, commands) -> PendingCheck | None:
        """The next check to send, or None once the client sent a command (then in `command`; None at the
        end of the stream)."""
        if self._read is None:
            self._read = asyncio.ensure_future(anext(commands, None))
        if self._watch is not None and self._get is None:
            self._get = asyncio.ensure_future(self._watch.get())
        await asyncio.wait([f for f in (self._read, self._get) if f is not None],
                           return_when=asyncio.FIRST_COMPLETED)
        if self._get is not None and self._get.done():
            check, self._get = self._get.result(), None
            return check
        read, self._read = self._read, None
        self.command = read.result()
        return None

    def _stop_watch(self) -> None:
        if self._get is not None:
            self._get.cancel()
            self._get = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    async def close(self) -> None:
        """Stop waiting for commands and checks, and wait until both waits are over: the read of the next
        command must be finished before the stream it reads is closed."""
        read, get, self._read, self._get = self._read, self._get, None, None
        await cancel_and_wait(read, get)
        self._stop_watch()


_POLICIES = {pb.BEGINNING: OffsetPolicy.EARLIEST, pb.END: OffsetPolicy.LATEST}


def send_answer(messages, results: dict, error: BrokerError | None) -> pb.SendMessageResponse:
    """SendMessage's answer, as the RocketMQ proxy gives it: an entry per message, in order, OK with its
    offset where it was stored (`results` by message id), else the status of `error`, which stopped it;
    the response's status is the entries' one code, or MULTIPLE_RESULTS when they differ."""
    entries = [_sent_entry(m, results[m.system_properties.message_id])
               if m.system_properties.message_id in results
               else pb.SendResultEntry(status=status_of(error), message_id=m.system_properties.message_id)
               for m in messages]
    codes = {e.status.code for e in entries}
    status = ok() if codes == {Code.OK} else entries[-1].status if len(codes) == 1 else pb.Status(
        code=Code.MULTIPLE_RESULTS, message=f"{sum(e.status.code == Code.OK for e in entries)} of {len(entries)} "
                                            f"messages stored; the others not: {error}")
    return pb.SendMessageResponse(status=status, entries=entries)


def _sent_entry(m: pb.Message, sent) -> pb.SendResultEntry:
    """A send's answer; a half message's transaction id is its offset in the broker's half topic."""
    entry = pb.SendResultEntry(status=ok(), message_id=m.system_properties.message_id, offset=sent.put.queue_offset)
    if m.system_properties.message_type == pb.TRANSACTION:
        entry.transaction_id = str(sent.put.queue_offset)
    return entry


def _unsupported(method: Method) -> Callable:
    why = UNSUPPORTED.get(method.name, f"{method.name} is not supported by this broker yet")

    async def refuse(request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, why)
    return refuse


def handlers(servicer: Rmq5Servicer) -> grpc.GenericRpcHandler:
    """The service's handlers by upstream path, for `server.add_generic_rpc_handlers`."""
    make = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    table = {}
    for m in METHODS:
        behaviour = getattr(servicer, m.name, None) or _unsupported(m)
        table[m.name] = make[(m.request_streaming, m.response_streaming)](
            behaviour, request_deserializer=m.request.FromString, response_serializer=m.response.SerializeToString)
    return grpc.method_handlers_generic_handler(SERVICE, table)


def refusal_answers(method_path: str) -> Callable[[BrokerError], Any] | None:
    """For RequestIntake: a unary method of this service answers an access refusal in its status
    (UNAUTHORIZED, FORBIDDEN), as the proxy does, so the clients raise their own exceptions."""
    service, _, name = method_path.lstrip("/").partition("/")
    method = _BY_NAME.get(name) if service == SERVICE else None
    if method is None or method.request_streaming:
        return None
    if method.name == "ReceiveMessage":
        return lambda error: [pb.ReceiveMessageResponse(status=status_of(error)),
                              pb.ReceiveMessageResponse(delivery_timestamp=convert.timestamp(time.time_ns() // 10**6))]
    if method.response_streaming:
        return lambda error: [method.response(status=status_of(error))]
    return lambda error: method.response(status=status_of(error))


_BY_NAME = {m.name: m for m in METHODS}
