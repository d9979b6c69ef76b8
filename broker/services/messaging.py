"""MessagingService: the data plane (Produce and Fetch streams), unary send and pull, send-back, view, key search.

The two bidirectional streams end quietly however they end (the client finishes, cancels, or its
connection is reset): each is a coroutine that writes its answers (services/streams.py says why) and
owns the task reading its requests, which it cancels and awaits before it returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from tidemark.broker.auth.acl import Action
from tidemark.broker.auth.guard import on_topic
from tidemark.broker.controller import BrokerController
from tidemark.broker.errors import BrokerError, InvalidArgumentError
from tidemark.broker.operations import (
    MAX_RECORDS_PER_READ,
    BatchSequence,
    EndReason,
    OpenQueue,
    Outcome,
    OutgoingMessage,
    PullRequest,
    QueueEnded,
)
from tidemark.broker.services import access
from tidemark.broker.services.convert import (
    checked_client_id,
    expression_type,
    fence_from_pb,
    message_ext,
)
from tidemark.broker.services.errors import rpc, status_for
from tidemark.broker.services.streams import call_ended, ends_when_asked, long_poll, write
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import cancel_and_wait
from tidemark.v1 import messaging_pb2, messaging_pb2_grpc

log = get_logger("tidemark.broker.messaging")

_RESOLUTIONS = {messaging_pb2.TRANSACTION_COMMIT: Outcome.COMMIT, messaging_pb2.TRANSACTION_ROLLBACK: Outcome.ROLLBACK}
_PULL_STATUS = {name: messaging_pb2.PullStatus.Value(name) for name in
                ("FOUND", "NO_NEW_MSG", "NO_MATCHED_MSG", "OFFSET_ILLEGAL", "OFFSET_RESET")}


class MessagingServicer(messaging_pb2_grpc.MessagingServiceServicer):
    def __init__(self, broker: BrokerController) -> None:
        self._b = broker
        self._ops = broker.operations

    @rpc
    async def SendMessage(self, request, context: grpc.aio.ServicerContext):
        queue_id = request.queue_id if request.HasField("queue_id") else None
        messages = [OutgoingMessage(body=m.body, tags=m.tags, keys=m.keys, properties=dict(m.properties),
                                    flag=m.flag, born_timestamp=m.born_timestamp, delay_level=m.delay_level,
                                    born_host=m.born_host)
                    for m in request.messages]
        sent = await self._ops.send(request.topic, queue_id, messages)
        return messaging_pb2.SendMessageResponse(
            broker_name=self._b.config.broker_name,
            results=[messaging_pb2.SendResult(msg_id=s.msg_id, queue_id=s.queue_id,
                                              queue_offset=s.put.queue_offset,
                                              commit_log_offset=s.put.commit_log_offset)
                     for s in sent])

    async def Produce(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        """Record batches in, one answer per batch, in order. A bad batch fails alone."""
        answers: asyncio.Queue = asyncio.Queue()
        durable: set[asyncio.Task] = set()  # answers waiting for the disk or a replica

        def take(request) -> None:
            answer = self._produce_one(request)
            if isinstance(answer, asyncio.Task):
                durable.add(answer)
            answers.put_nowait(answer)

        failure: list[BaseException] = []
        reader = _reader(request_iterator, take, lambda: answers.put_nowait(None), failure, "produce")

        def finish() -> None:
            # A stop: no request more, the batches taken are answered, then the end. The end is put here and
            # not left to the reader's own: a reader cancelled before its first step never runs its finally.
            # (Cancelled, it takes no request more, so every answer owed is queued before this end.)
            reader.cancel()
            answers.put_nowait(None)

        ends_when_asked(finish)
        try:
            while (answer := await answers.get()) is not None:
                if isinstance(answer, asyncio.Task):
                    durable.discard(answer)
                    answer = await answer
                await write(context, answer)
            if failure:
                await _abort_with(context, failure[0], "produce")
        finally:
            # The batches are stored; a client that went away gets no answer. (Cancelling a wait for the
            # disk or a replica stops only the wait.)
            await cancel_and_wait(reader, *durable)

    def _produce_one(self, request):
        """Store one batch now; its answer, or (sync flush or replication) a task that answers once it is
        durable."""
        sequence = BatchSequence(request.producer_id, request.producer_epoch, request.base_sequence,
                                 request.sequence_gaps) if request.producer_id else None
        try:
            appended = self._ops.append(request.topic, request.queue_id, request.records, request.count, sequence)
        except BrokerError as e:
            return _produce_error(request.request_id, e)
        put = appended.put
        ok = messaging_pb2.ProduceResponse(request_id=request.request_id, first_queue_offset=put.first_offset,
                                           duplicate=put.duplicate)
        if appended.durable is None:
            return ok

        async def durable() -> messaging_pb2.ProduceResponse:
            try:
                await appended.durable()
            except BrokerError as e:
                # A replica that did not acknowledge in time: an unknown outcome, which the class says
                # (the idempotent producer retries with the same sequence), not a refusal.
                return _produce_error(request.request_id, e)
            return ok

        return asyncio.get_running_loop().create_task(durable())

    async def Fetch(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        """Streaming pull: the client opens queues and grants credit, the broker pushes records."""
        ops = self._ops
        session = ops.open_fetch()

        def handle(request) -> None:
            kind = request.WhichOneof("kind")
            if kind == "credit":
                c = request.credit
                session.credit(c.handle, c.messages, c.bytes, c.commit_offset if c.HasField("commit_offset") else None)
            elif kind == "open":
                session.open(_open_queue(request.open))
            elif kind == "close":
                session.close_queue(request.close.handle)

        failure: list[BaseException] = []
        reader = _reader(request_iterator, handle, session.finish, failure, "fetch")
        try:
            while (frame := await session.next_frame()) is not None:
                response = messaging_pb2.FetchResponse()
                for part in frame.records:
                    response.records.add(handle=part.handle, count=part.count, records=part.data,
                                         next_offset=part.next_offset, max_offset=part.max_offset)
                for end in frame.ended:
                    response.ended.append(_ended_pb(end))
                for start in frame.started:
                    response.started.add(handle=start.handle, offset=start.offset, owner_epoch=start.owner_epoch,
                                         reset_generation=start.reset_generation)
                ops.fetched(frame)
                await write(context, response)
            if failure:
                await _abort_with(context, failure[0], "fetch")
        finally:
            try:
                await cancel_and_wait(reader)
            finally:
                ops.close_fetch(session)  # even when a second cancellation cut the wait short

    @rpc
    async def InitProducer(self, request, context: grpc.aio.ServicerContext):
        return messaging_pb2.InitProducerResponse(producer_id=self._ops.init_producer(request.key, request.topic))

    @rpc
    async def EndTransaction(self, request, context: grpc.aio.ServicerContext):
        outcome = _RESOLUTIONS.get(request.resolution)
        if outcome is None:
            raise InvalidArgumentError("resolution must be TRANSACTION_COMMIT or TRANSACTION_ROLLBACK")
        ended = await self._ops.end_transaction(request.group, request.msg_id, request.half_offset, outcome,
                                                from_check=request.from_check, topic=request.topic)
        return messaging_pb2.EndTransactionResponse(already_ended=not ended)

    async def WatchTransactionChecks(self, request, context: grpc.aio.ServicerContext) -> None:
        """The checks of the producer's open transactions, for as long as it watches (a coroutine that
        writes, as the streams above)."""
        try:
            checked_client_id(request.client_id)
            checks = self._ops.watch_transactions(request.group, request.client_id, request.topics)
        except BrokerError as e:
            await context.abort(status_for(e), str(e))
        name = self._b.config.broker_name
        try:
            while True:
                check = await checks.get()
                await write(context, messaging_pb2.TransactionCheck(
                    msg_id=check.msg_id, half_offset=check.half_offset, message=message_ext(check.message, name)))
        finally:
            checks.close()

    @long_poll  # (refused at a stop whether it suspends or not: a stopping broker serves no reads)
    @rpc
    async def PullMessage(self, request, context: grpc.aio.ServicerContext):
        outcome = await self._ops.pull(PullRequest(
            group=request.group,
            topic=request.topic,
            queue_id=request.queue_id,
            queue_offset=request.queue_offset,
            max_msg_nums=request.max_msg_nums,
            suspend_timeout_ms=request.suspend_timeout_ms,
            subscription=request.subscription,
            commit_offset=request.commit_offset if request.HasField("commit_offset") else None,
            fence=fence_from_pb(request.fence, request.HasField("fence")),
            expression_type=expression_type(request.expression_type),
        ))
        name = self._b.config.broker_name
        return messaging_pb2.PullMessageResponse(
            status=_PULL_STATUS[outcome.status.value],
            messages=[message_ext(m, name) for m in outcome.messages],
            next_begin_offset=outcome.next_begin_offset,
            min_offset=outcome.min_offset,
            max_offset=outcome.max_offset,
            reset_generation=outcome.reset_generation,
        )

    @rpc
    async def ConsumerSendMsgBack(self, request, context: grpc.aio.ServicerContext):
        checked_client_id(request.client_id, optional=True)
        result = await self._ops.send_back(
            group=request.group, commit_log_offset=request.commit_log_offset, msg_id=request.msg_id,
            delay_level=request.delay_level, max_reconsume_times=request.max_reconsume_times,
            may_read=lambda topic: access.require(on_topic(topic, Action.SUB)))
        return messaging_pb2.ConsumerSendMsgBackResponse(
            topic=result.topic, queue_id=result.queue_id, queue_offset=result.queue_offset,
            delay_level=result.delay_level, reconsume_times=result.reconsume_times)

    @rpc
    async def ViewMessage(self, request, context: grpc.aio.ServicerContext):
        message = self._ops.message_at(request.topic, request.queue_id, request.queue_offset)
        return messaging_pb2.ViewMessageResponse(message=message_ext(message, self._b.config.broker_name))

    @rpc
    async def QueryMessageByKey(self, request, context: grpc.aio.ServicerContext):
        found = self._ops.messages_by_key(request.topic, request.key, request.begin_timestamp,
                                          request.end_timestamp, request.max_num)
        name = self._b.config.broker_name
        return messaging_pb2.QueryMessageByKeyResponse(messages=[message_ext(m, name) for m in found])


def _reader(requests, handle: Callable[[object], None], on_end: Callable[[], None],
            failure: list[BaseException], kind: str) -> asyncio.Task:
    """A task that hands each request of a stream to `handle`, then calls on_end; a failure is kept in
    `failure` so that the stream ends with it: a domain error (an undecodable message) as its status,
    anything else (a bug, a disk error below the store) logged with its traceback."""
    async def read() -> None:
        try:
            async for request in requests:
                handle(request)
        except BrokerError as e:
            failure.append(e)
        except Exception as e:
            if call_ended(e):
                return  # (on_end runs): the stream ends like a finished one
            log.exception("stream request failed", event="stream_request_failed", stream=kind)
            failure.append(e)
        finally:
            on_end()
    return asyncio.get_running_loop().create_task(read(), name=f"{kind}-reader")


async def _abort_with(context: grpc.aio.ServicerContext, error: BaseException, kind: str) -> None:
    if isinstance(error, BrokerError):
        await context.abort(status_for(error), str(error))
    await context.abort(grpc.StatusCode.INTERNAL, f"{kind} stream failed: {error!r}")


def _produce_error(request_id: int, error: BrokerError) -> messaging_pb2.ProduceResponse:
    return messaging_pb2.ProduceResponse(request_id=request_id, code=status_for(error).value[0], error=str(error),
                                         error_class=type(error).__name__)


def _open_queue(pb) -> OpenQueue:
    return OpenQueue(handle=pb.handle, group=pb.group, topic=pb.topic, queue_id=pb.queue_id, offset=pb.offset,
                     subscription=pb.subscription, fence=fence_from_pb(pb.fence, pb.HasField("fence")),
                     credit_messages=pb.credit_messages, credit_bytes=pb.credit_bytes,
                     batch_size=pb.batch_size or MAX_RECORDS_PER_READ,
                     expression_type=expression_type(pb.expression_type), after_lock=pb.after_lock)


def _ended_pb(end: QueueEnded) -> messaging_pb2.FetchEnded:
    pb = messaging_pb2.FetchEnded(handle=end.handle, next_offset=end.next_offset,
                                  reset_generation=end.reset_generation)
    if end.reason is EndReason.ERROR:
        pb.code = status_for(end.error).value[0]
        pb.error = str(end.error)
        pb.error_class = type(end.error).__name__
    else:
        pb.status = _PULL_STATUS[end.reason.value]
    return pb
