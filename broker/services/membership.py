"""MembershipService: heartbeats, member lists, the consumer-ids watch and queue locks."""

from __future__ import annotations

import grpc

from tidemark.broker.controller import BrokerController
from tidemark.broker.errors import BrokerError, InvalidArgumentError
from tidemark.broker.membership.groups import check_group
from tidemark.broker.membership.members import ConsumerInfo
from tidemark.broker.services.convert import (
    checked_client_id,
    checked_topic,
    expression_type,
    fence_from_pb,
    queue,
)
from tidemark.broker.services.errors import rpc, status_for
from tidemark.broker.services.streams import ends_when_asked, write
from tidemark.common.protocol import (
    ExpressionType,
    InvalidNameError,
    check_topic_name,
    parse_filter,
)
from tidemark.v1 import common_pb2, membership_pb2, membership_pb2_grpc


def _enum_name(enum, field: str, value: int) -> str:
    try:
        return enum.Name(value)
    except ValueError:
        names = ", ".join(n for n in enum.keys() if not n.endswith("UNSPECIFIED"))
        raise InvalidArgumentError(f"{field} {value} is not one of {names}") from None


class MembershipServicer(membership_pb2_grpc.MembershipServiceServicer):
    def __init__(self, broker: BrokerController) -> None:
        self._b = broker

    @rpc
    async def Heartbeat(self, request, context: grpc.aio.ServicerContext):
        check_group(request.group)
        checked_client_id(request.client_id)
        subscriptions, sql92 = [], set()
        for s in request.subscriptions:
            # Names only: a topic deleted while its consumers run must not make their heartbeats fail.
            kind = expression_type(s.expression_type)
            try:
                check_topic_name(s.topic)
                parse_filter(s.expression, kind)  # a bad SQL92 expression: INVALID_ARGUMENT with its column
            except (InvalidNameError, ValueError) as e:
                raise InvalidArgumentError(f"subscription to {s.topic!r}: {e}") from None
            subscriptions.append((s.topic, (s.expression or "*") if kind == ExpressionType.TAG else s.expression))
            if kind == ExpressionType.SQL92:
                sql92.add(s.topic)
        for q in request.owned_queues:
            checked_topic(q.topic)
        ids = self._b.heartbeat(ConsumerInfo(
            client_id=request.client_id,
            group=request.group,
            subscriptions=tuple(subscriptions),
            message_model=_enum_name(common_pb2.MessageModel, "message_model",
                                     request.message_model or common_pb2.CLUSTERING),
            consume_type=_enum_name(common_pb2.ConsumeType, "consume_type",
                                    request.consume_type or common_pb2.CONSUME_PASSIVELY),
            orderly=request.orderly,
            owned_queues=tuple((q.topic, q.broker_name, q.queue_id) for q in request.owned_queues),
            allocate_strategy=request.allocate_strategy,
            host=context.peer() or "",
            sql92_topics=frozenset(sql92),
        ))
        return membership_pb2.HeartbeatResponse(client_ids=ids)

    @rpc
    async def UnregisterClient(self, request, context: grpc.aio.ServicerContext):
        check_group(request.group)
        self._b.consumers.unregister(request.group, checked_client_id(request.client_id))
        return membership_pb2.UnregisterClientResponse()

    @rpc
    async def GetConsumerList(self, request, context: grpc.aio.ServicerContext):
        check_group(request.group)
        return membership_pb2.GetConsumerListResponse(client_ids=self._b.consumers.consumer_ids(request.group))

    async def WatchConsumerIds(self, request, context: grpc.aio.ServicerContext) -> None:
        """The group's member list at every change, for as long as the client watches: a coroutine that
        writes (services/streams.py), so the watch ends in this frame however the call ends."""
        try:
            check_group(request.group)
            checked_client_id(request.client_id)
        except BrokerError as e:
            await context.abort(status_for(e), str(e))
        consumers = self._b.consumers
        updates = consumers.watch(request.group, request.client_id)

        def finish() -> None:
            # A stop ends the watch after the write under way, never inside it: a handler cancelled in the
            # middle of grpc.aio's write could not send its status, and the call waited for the end of the
            # stop's grace to be cut ("Cancelling all calls" instead of "the broker is stopping").
            while not updates.empty():
                updates.get_nowait()
            updates.put_nowait(None)

        ends_when_asked(finish)
        try:
            while (ids := await updates.get()) is not None:
                await write(context, membership_pb2.ConsumerIdsChanged(group=request.group, client_ids=ids))
        finally:
            # A client that unregistered first is no longer a member, so this only starts a grace for crashes.
            consumers.unwatch(request.group, request.client_id, updates, broken=True)

    def _queues(self, request) -> list[tuple[str, int]]:
        """The request's queues on this broker. Bad names are errors; queues of a topic that is gone
        (or out of its range) are left out, so one deleted topic cannot fail a whole renewal."""
        check_group(request.group)
        checked_client_id(request.client_id)
        out = []
        for q in request.queues:
            if q.broker_name and q.broker_name != self._b.config.broker_name:
                raise InvalidArgumentError(
                    f"queue {q.topic}:{q.queue_id} belongs to broker {q.broker_name!r}, "
                    f"not {self._b.config.broker_name!r}")
            try:
                check_topic_name(q.topic)
            except InvalidNameError as e:
                raise InvalidArgumentError(str(e)) from None
            topic = self._b.topics.get(q.topic)
            if topic is not None and 0 <= q.queue_id < topic.queue_nums:
                out.append((q.topic, q.queue_id))
        return out

    @rpc
    async def LockQueues(self, request, context: grpc.aio.ServicerContext):
        if request.wait_ms < 0:
            raise InvalidArgumentError(f"wait_ms must be >= 0, got {request.wait_ms}")
        b = self._b
        grants = await b.lock_queues(request.group, request.client_id, self._queues(request), request.wait_ms,
                                     renew=request.renew)
        name = b.config.broker_name
        held = [b.held_queue(request.group, g) for g in grants]
        return membership_pb2.LockQueuesResponse(locked=[
            membership_pb2.QueueLock(queue=queue(h.grant.topic, name, h.grant.queue_id),
                                     owner_epoch=h.grant.owner_epoch, expire_timestamp=h.grant.expire_timestamp,
                                     consumer_offset=h.consumer_offset, reset_generation=h.reset_generation,
                                     lock_token=h.grant.lock_token, lock_expiry_ms=h.grant.expiry_ms)
            for h in held])

    @rpc
    async def UnlockQueues(self, request, context: grpc.aio.ServicerContext):
        check_group(request.group)
        checked_client_id(request.client_id)
        queues = self._queues(request)
        if request.lock_tokens and len(request.lock_tokens) != len(request.queues):
            raise InvalidArgumentError(f"lock_tokens must be empty or one per queue: {len(request.lock_tokens)} "
                                       f"tokens for {len(request.queues)} queues")
        tokens = {(q.topic, q.queue_id): t for q, t in zip(request.queues, request.lock_tokens, strict=False) if t}
        for f in request.final_offsets:
            checked_topic(f.queue.topic)
        finals = [(f.queue.topic, f.queue.queue_id, f.offset, fence_from_pb(f.fence, f.HasField("fence")))
                  for f in request.final_offsets]
        refused = self._b.unlock_queues(request.group, request.client_id, queues, finals, tokens)
        name = self._b.config.broker_name
        return membership_pb2.UnlockQueuesResponse(refused=[
            membership_pb2.RefusedFinalOffset(queue=queue(r.topic, name, r.queue_id), offset=r.offset,
                                              error_class=type(r.error).__name__, message=str(r.error))
            for r in refused])
