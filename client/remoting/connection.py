"""BrokerConnection: one gRPC channel to one broker and a typed async method per RPC.

Every call goes through `_call`, which applies the timeout and turns gRPC
errors into `tidemark.client.errors` exceptions. Must be created and used on one event
loop (grpc.aio channels are loop-bound).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from tidemark.client.errors import (
    BrokerUnreachableError,
    InvalidArgumentError,
    Status,
    TidemarkError,
    UnavailableError,
    from_status,
)
from tidemark.client.message import Message, MessageExt, MessageQueue, PullResult, SendResult
from tidemark.client.remoting import convert
from tidemark.client.remoting.commits import CommitStream
from tidemark.client.remoting.rpc_errors import from_rpc_error
from tidemark.client.remoting.security import open_channel
from tidemark.client.remoting.streams import (
    FetchStream,
    OnBroken,
    OnEnded,
    OnRecords,
    OnStarted,
    ProduceStream,
    produce_call,
)
from tidemark.client.security import TlsSettings
from tidemark.client.types import (
    AclRuleInfo,
    BrokerInfo,
    BrokerStatus,
    CommitOffsetsResult,
    Delivery,
    GroupConfig,
    GroupDescription,
    GroupSummary,
    HalfMessage,
    OffsetChange,
    OffsetCommit,
    PopQueueInflight,
    ProducerInfo,
    ProducerQueueState,
    QueueLockGrant,
    QueueLockInfo,
    QueueStats,
    ResetTarget,
    SendBackResult,
    TopicConfig,
    TopicQueueStats,
    TopicRoute,
    UserInfo,
)
from tidemark.common.auth import Credentials
from tidemark.common.protocol import ERROR_CLASS_KEY, PROMOTE_DEADLINE_S, ExpressionType
from tidemark.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    membership_pb2,
    membership_pb2_grpc,
    messaging_pb2,
    messaging_pb2_grpc,
    offsets_pb2,
    offsets_pb2_grpc,
)

MAX_GRPC_MESSAGE_BYTES = 64 * 1024 * 1024
KEEPALIVE_MS = 3_000  # a client's keepalive ping interval; a broker's keepalive_min_interval_ms must allow it
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
    # A partition that drops packets leaves the TCP connection open while TCP retransmits, on a timer that
    # doubles (the fault checker's partition runs: sends got through 3 to 6 s after a partition of a few
    # seconds healed, 13 s after a longer one): every call and stream waits out its timeout, then is tried
    # again on the same silent connection. A ping every 3 s, unanswered for 3 s, closes it and the channel
    # dials anew for the next call (RocketMQ closes a channel whose call timed out). Idle connections ping
    # too (a consumer's fetch stream sends nothing while it waits for records); the broker allows pings
    # this often (keepalive_min_interval_ms, 1 s). gRPC 1.85 times a ping out by ping_timeout_ms
    # (broker/cluster/replica_sync.py does the same for a replica's link). An older broker (10 s) answers
    # GOAWAY too_many_pings, and gRPC doubles the interval until it is allowed (3, 6, then 12 s).
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.http2.ping_timeout_ms", 3_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # A restarted broker is found again within a couple of seconds (gRPC's default backoff grows to
    # two minutes), and each connection dials on its own: a channel made after a broker came back does
    # not inherit the backoff of a process-wide subchannel that saw it die.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    # Despite its name, gRPC core takes this as the least time one connection attempt (TCP, TLS handshake,
    # the broker's HTTP/2 SETTINGS) may take, not as a backoff. At 100 ms a handshake slowed by a busy
    # machine failed the first request at once (UNAVAILABLE "connection attempt timed out before receiving
    # SETTINGS frame"), well within its own timeout. A refused connection (broker down) still fails at once.
    ("grpc.min_reconnect_backoff_ms", 20_000),
    ("grpc.use_local_subchannel_pool", 1),
)
_MESSAGE_MODEL = {"CLUSTERING": common_pb2.CLUSTERING, "BROADCASTING": common_pb2.BROADCASTING}


def _unreachable(e: grpc.RpcError) -> bool:
    """A transport failure (connection refused or lost), not a broker's own answer: a broker's refusals carry
    their error class (a full disk, a replication timeout are UNAVAILABLE too, from a live broker)."""
    trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    return e.code() is grpc.StatusCode.UNAVAILABLE and not any(k == ERROR_CLASS_KEY for k, _ in trailing or ())


class BrokerConnection:
    def __init__(self, address: str, *, timeout_s: float = 3.0, credentials: Credentials | None = None,
                 tls: TlsSettings | None = None,
                 on_unavailable: Callable[[BrokerConnection], None] = lambda conn: None,
                 on_retriable: Callable[[BrokerConnection, TidemarkError], None] = lambda conn, error: None) -> None:
        self.address = address
        self._on_unavailable = on_unavailable  # a call found the broker unreachable (BrokerCluster fails over)
        # Any call or stream failed retriably: its master may have been replaced (BrokerCluster.suspect).
        self._on_retriable = on_retriable
        self.broker_name: str | None = None
        self.info: BrokerInfo | None = None  # from the last broker_info()
        self._timeout = timeout_s
        self._tls = tls
        self._channel = open_channel(address, options=_CHANNEL_OPTIONS, credentials=credentials, tls=tls)
        self._messaging = messaging_pb2_grpc.MessagingServiceStub(self._channel)
        self._offsets = offsets_pb2_grpc.OffsetServiceStub(self._channel)
        self._membership = membership_pb2_grpc.MembershipServiceStub(self._channel)
        self._admin = admin_pb2_grpc.AdminServiceStub(self._channel)
        self._produce_call = produce_call(self._channel)  # requests as their wire bytes (streams.produce_request)
        self._produce: ProduceStream | None = None

    async def close(self) -> None:
        if self._produce is not None:
            await self._produce.close()
            self._produce = None
        await self._channel.close()

    # -- data plane ------------------------------------------------------------

    def produce_stream(self) -> ProduceStream:
        """The connection's Produce stream, opened (again) when there is none or it broke."""
        if self._produce is None or not self._produce.usable:
            self._produce = ProduceStream(self._produce_call(), self.address, error=self.error)
        return self._produce

    def open_fetch_stream(self, *, on_records: OnRecords, on_ended: OnEnded, on_broken: OnBroken,
                          on_started: OnStarted = lambda handle, start: None) -> FetchStream:
        return FetchStream(self._messaging.Fetch(), self.address, error=self.error, on_records=on_records,
                           on_ended=on_ended, on_broken=on_broken, on_started=on_started)

    def error(self, e: grpc.RpcError) -> TidemarkError:
        """The client exception for a failed call or stream on this connection (a refused TLS handshake says
        why); an unreachable broker is reported to on_unavailable, any retriable failure to on_retriable."""
        error = from_rpc_error(e, address=self.address, tls=self._tls is not None,
                               client_cert=bool(self._tls and self._tls.cert_file))
        if type(error) in (UnavailableError, BrokerUnreachableError) and _unreachable(e):
            self._on_unavailable(self)
        if error.retriable:
            self._on_retriable(self, error)
        return error

    async def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return await method(request, timeout=timeout or self._timeout)
        except grpc.RpcError as e:
            raise self.error(e) from None

    # -- messaging -------------------------------------------------------------

    async def send(self, topic: str, messages: Sequence[Message], *, queue_id: int | None = None,
                   born_host: str = "", timeout: float | None = None) -> list[SendResult]:
        now = time.time_ns() // 1_000_000
        request = messaging_pb2.SendMessageRequest(
            topic=topic, messages=[convert.message_pb(m, now, born_host) for m in messages])
        if queue_id is not None:
            request.queue_id = queue_id
        pb = await self._call(self._messaging.SendMessage, request, timeout)
        return [SendResult(r.msg_id, MessageQueue(topic, pb.broker_name, r.queue_id), r.queue_offset)
                for r in pb.results]

    async def pull(self, group: str, mq: MessageQueue, offset: int, *, max_nums: int = 32,
                   suspend_ms: int = 0, subscription: str = "*", commit: OffsetCommit | None = None,
                   fence: OffsetCommit | None = None, timeout: float | None = None,
                   expression_type: str = ExpressionType.TAG) -> PullResult:
        """Pull from a queue; `fence` carries client id / owner epoch / reset generation (offset ignored)."""
        request = messaging_pb2.PullMessageRequest(
            group=group, topic=mq.topic, queue_id=mq.queue_id, queue_offset=offset, max_msg_nums=max_nums,
            suspend_timeout_ms=suspend_ms, subscription=subscription)
        if expression_type == ExpressionType.SQL92:
            request.expression_type = common_pb2.SQL92
        if commit is not None:
            request.commit_offset = commit.offset
        fence_pb = convert.fence_pb(fence) if fence is not None else None
        if fence_pb is not None:
            request.fence.CopyFrom(fence_pb)
        wait = (timeout or self._timeout) + suspend_ms / 1000
        return convert.pull_result(await self._call(self._messaging.PullMessage, request, wait))

    async def send_back(self, group: str, message: MessageExt, *, delay_level: int = 0,
                        max_reconsume_times: int = 0, client_id: str = "") -> SendBackResult:
        pb = await self._call(self._messaging.ConsumerSendMsgBack, messaging_pb2.ConsumerSendMsgBackRequest(
            group=group, commit_log_offset=message.commit_log_offset, msg_id=message.msg_id,
            delay_level=delay_level, max_reconsume_times=max_reconsume_times, client_id=client_id))
        return SendBackResult(pb.topic, pb.queue_id, pb.queue_offset, pb.delay_level, pb.reconsume_times)

    async def view_message(self, topic: str, queue_id: int, offset: int) -> MessageExt:
        pb = await self._call(self._messaging.ViewMessage, messaging_pb2.ViewMessageRequest(
            topic=topic, queue_id=queue_id, queue_offset=offset))
        return convert.message_ext(pb.message)

    async def query_message_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int,
                                   max_num: int = 64) -> list[MessageExt]:
        pb = await self._call(self._messaging.QueryMessageByKey, messaging_pb2.QueryMessageByKeyRequest(
            topic=topic, key=key, begin_timestamp=begin_ms, end_timestamp=end_ms, max_num=max_num), 30.0)
        return [convert.message_ext(m) for m in pb.messages]

    # -- offsets ---------------------------------------------------------------

    async def update_consumer_offset(self, commit: OffsetCommit) -> None:
        await self._call(self._offsets.UpdateConsumerOffset,
                         offsets_pb2.UpdateConsumerOffsetRequest(commit=convert.commit_pb(commit)))

    def open_commit_stream(self, *, timeout: float | None = None) -> CommitStream:
        return CommitStream(self, self._offsets.CommitOffsets(timeout=timeout))

    async def commit_offsets(self, commits: Sequence[OffsetCommit], *, batch_size: int = 64) -> CommitOffsetsResult:
        """Oneway-style batched commits over one stream; returns the broker's summary."""
        stream = self.open_commit_stream(timeout=self._timeout + len(commits) / 10_000)
        for i in range(0, len(commits), batch_size):
            await stream.write(commits[i:i + batch_size])
        return await stream.close()

    async def query_consumer_offset(self, group: str, mq: MessageQueue) -> tuple[int, int]:
        """(committed offset or -1, reset generation)."""
        pb = await self._call(self._offsets.QueryConsumerOffset, offsets_pb2.QueryConsumerOffsetRequest(
            group=group, topic=mq.topic, queue_id=mq.queue_id))
        return pb.offset, pb.reset_generation

    async def min_offset(self, mq: MessageQueue) -> int:
        request = offsets_pb2.QueueRequest(topic=mq.topic, queue_id=mq.queue_id)
        return (await self._call(self._offsets.GetMinOffset, request)).offset

    async def max_offset(self, mq: MessageQueue) -> int:
        request = offsets_pb2.QueueRequest(topic=mq.topic, queue_id=mq.queue_id)
        return (await self._call(self._offsets.GetMaxOffset, request)).offset

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        request = offsets_pb2.SearchOffsetByTimestampRequest(topic=mq.topic, queue_id=mq.queue_id,
                                                             timestamp=timestamp_ms)
        return (await self._call(self._offsets.SearchOffsetByTimestamp, request)).offset

    async def reset_offset(self, group: str, topic: str, target: ResetTarget, value: int = 0, *,
                           queue_id: int | None = None, dry_run: bool = False) -> list[OffsetChange]:
        request = offsets_pb2.ResetOffsetRequest(group=group, topic=topic, dry_run=dry_run)
        if queue_id is not None:
            request.queue_id = queue_id
        if target in (ResetTarget.EARLIEST, ResetTarget.LATEST):
            setattr(request, target.value, True)
        else:
            setattr(request, target.value, value)
        pb = await self._call(self._offsets.ResetOffset, request)
        return [OffsetChange(convert.queue_from_pb(c.queue), c.old_offset, c.new_offset) for c in pb.changes]

    async def consume_stats(self, group: str, topic: str = "") -> list[QueueStats]:
        pb = await self._call(self._offsets.GetConsumeStats,
                              offsets_pb2.GetConsumeStatsRequest(group=group, topic=topic))
        return [convert.queue_stats(q) for q in pb.queues]

    # -- membership ------------------------------------------------------------

    async def heartbeat(self, *, client_id: str, group: str, subscriptions: Sequence[tuple[str, ...]],
                        message_model: str, consume_type: str, orderly: bool = False,
                        owned_queues: Sequence[MessageQueue] = (), allocate_strategy: str = "") -> list[str]:
        """Register or refresh the client's membership; returns the group's members on this broker.
        `subscriptions`: (topic, expression) or (topic, expression, expression type: TAG or SQL92)."""
        pb = await self._call(self._membership.Heartbeat, membership_pb2.HeartbeatRequest(
            client_id=client_id, group=group,
            subscriptions=[_subscription_pb(*s) for s in subscriptions],
            message_model=_MESSAGE_MODEL[message_model],
            consume_type=common_pb2.ConsumeType.Value(consume_type), orderly=orderly,
            owned_queues=[convert.queue_pb(q) for q in owned_queues], allocate_strategy=allocate_strategy))
        return list(pb.client_ids)

    async def unregister(self, client_id: str, group: str) -> None:
        await self._call(self._membership.UnregisterClient,
                         membership_pb2.UnregisterClientRequest(client_id=client_id, group=group))

    async def consumer_ids(self, group: str) -> list[str]:
        pb = await self._call(self._membership.GetConsumerList, membership_pb2.GetConsumerListRequest(group=group))
        return list(pb.client_ids)

    async def watch_consumer_ids(self, group: str, client_id: str) -> AsyncIterator[list[str]]:
        """The group's client ids now and after every change, until cancelled or the stream breaks."""
        call = self._membership.WatchConsumerIds(
            membership_pb2.WatchConsumerIdsRequest(group=group, client_id=client_id))
        try:
            async for change in call:
                yield list(change.client_ids)
        except grpc.RpcError as e:
            raise self.error(e) from None
        finally:
            call.cancel()

    async def lock_queues(self, group: str, client_id: str, mqs: Sequence[MessageQueue], *,
                          wait_ms: int = 0, renew: bool = False) -> list[QueueLockGrant]:
        """Lock (or, with `renew`, extend the locks held of) queues; with wait_ms the broker answers
        once one is granted or the wait ends."""
        pb = await self._call(self._membership.LockQueues, membership_pb2.LockQueuesRequest(
            group=group, client_id=client_id, queues=[convert.queue_pb(q) for q in mqs], wait_ms=wait_ms,
            renew=renew), self._timeout + wait_ms / 1000)
        return [QueueLockGrant(convert.queue_from_pb(g.queue), g.owner_epoch, g.expire_timestamp, g.consumer_offset,
                               g.reset_generation, g.lock_token, g.lock_expiry_ms) for g in pb.locked]

    async def unlock_queues(self, group: str, client_id: str, mqs: Sequence[MessageQueue],
                            final_offsets: Sequence[OffsetCommit] = (),
                            tokens: Sequence[int] = ()) -> list[tuple[MessageQueue, TidemarkError]]:
        """Release queues, after committing their final offsets (each fenced); the refused commits, each
        with its queue.
        `tokens` (empty, or one per queue; 0: any) name the grants released: a queue locked again
        since keeps its new lock and its final commit is refused."""
        request = membership_pb2.UnlockQueuesRequest(group=group, client_id=client_id,
                                                     queues=[convert.queue_pb(q) for q in mqs],
                                                     lock_tokens=tokens)
        for c in final_offsets:
            final = request.final_offsets.add(queue=convert.queue_pb(c.queue), offset=c.offset)
            fence = convert.fence_pb(c)
            if fence is not None:
                final.fence.CopyFrom(fence)
        pb = await self._call(self._membership.UnlockQueues, request)
        return [(convert.queue_from_pb(r.queue),
                 from_status(Status.FAILED_PRECONDITION, f"{r.queue.topic}:{r.queue.queue_id}: {r.message}",
                             error_class=r.error_class, address=self.address)) for r in pb.refused]

    # -- admin -----------------------------------------------------------------

    async def init_producer(self, key: str, topic: str, *, timeout: float | None = None) -> int:
        """A producer id for idempotent sends to this broker (the same one for the same non-empty key);
        `topic` is one it writes to (with auth on, asking needs Pub on it)."""
        pb = await self._call(self._messaging.InitProducer, messaging_pb2.InitProducerRequest(key=key, topic=topic),
                              timeout)
        return pb.producer_id

    async def end_transaction(self, group: str, topic: str, msg_id: str, half_offset: int, commit: bool, *,
                              from_check: bool = False) -> bool:
        """Commit or roll back a half message; False when it had ended that way already."""
        pb = await self._call(self._messaging.EndTransaction, messaging_pb2.EndTransactionRequest(
            group=group, topic=topic, msg_id=msg_id, half_offset=half_offset, from_check=from_check,
            resolution=messaging_pb2.TRANSACTION_COMMIT if commit else messaging_pb2.TRANSACTION_ROLLBACK))
        return not pb.already_ended

    async def watch_transaction_checks(self, group: str, client_id: str,
                                       topics: Sequence[str]) -> AsyncIterator[tuple[int, MessageExt]]:
        """(half offset, half message) for each check the broker sends, until cancelled or the stream breaks."""
        call = self._messaging.WatchTransactionChecks(messaging_pb2.WatchTransactionChecksRequest(
            group=group, client_id=client_id, topics=list(topics)))
        try:
            async for check in call:
                yield check.half_offset, convert.message_ext(check.message)
        except grpc.RpcError as e:
            raise self.error(e) from None
        finally:
            call.cancel()

    async def list_transactions(self, group: str = "") -> list[HalfMessage]:
        pb = await self._call(self._admin.ListTransactions, admin_pb2.ListTransactionsRequest(group=group))
        return [HalfMessage(self.broker_name or self.address, h.msg_id, h.half_offset, h.group, h.topic,
                            h.stored_ms, h.checks, h.next_check_ms, pb.max_checks) for h in pb.halves]

    async def broker_info(self, *, timeout: float | None = None) -> BrokerInfo:
        """The broker's identity and settings (also kept as `info`)."""
        info = convert.broker_info(await self._call(self._admin.GetBrokerInfo, admin_pb2.GetBrokerInfoRequest(),
                                                    timeout))
        self.broker_name = info.broker_name
        self.info = info
        return info

    async def promote(self) -> BrokerInfo:
        """Make this replica the master of its broker name (a new epoch)."""
        return convert.broker_info(await self._call(self._admin.PromoteBroker, admin_pb2.PromoteBrokerRequest(),
                                                    PROMOTE_DEADLINE_S))

    async def update_broker_permission(self, *, readable: bool, writable: bool) -> BrokerInfo:
        pb = await self._call(self._admin.UpdateBrokerPermission,
                              admin_pb2.UpdateBrokerPermissionRequest(readable=readable, writable=writable))
        return convert.broker_info(pb)

    async def create_topic(self, name: str, queue_nums: int) -> TopicConfig:
        pb = await self._call(self._admin.CreateTopic, admin_pb2.CreateTopicRequest(name=name, queue_nums=queue_nums))
        return convert.topic_config(pb)

    async def update_topic(self, name: str, *, read_queue_nums: int | None = None,
                           write_queue_nums: int | None = None, readable: bool | None = None,
                           writable: bool | None = None) -> TopicConfig:
        request = admin_pb2.UpdateTopicRequest(name=name)
        for field, value in (("read_queue_nums", read_queue_nums), ("write_queue_nums", write_queue_nums),
                             ("readable", readable), ("writable", writable)):
            if value is not None:
                setattr(request, field, value)
        return convert.topic_config(await self._call(self._admin.UpdateTopic, request))

    async def delete_topic(self, name: str) -> None:
        await self._call(self._admin.DeleteTopic, admin_pb2.DeleteTopicRequest(name=name))

    async def list_topics(self, *, include_system: bool = False) -> list[TopicConfig]:
        pb = await self._call(self._admin.ListTopics, admin_pb2.ListTopicsRequest(include_system=include_system))
        return [convert.topic_config(t) for t in pb.topics]

    async def route(self, topic: str) -> TopicRoute:
        return convert.topic_route(await self._call(self._admin.GetRoute, admin_pb2.GetRouteRequest(topic=topic)))

    async def topic_stats(self, topic: str) -> list[TopicQueueStats]:
        pb = await self._call(self._admin.GetTopicStats, admin_pb2.GetTopicStatsRequest(topic=topic))
        return [convert.topic_queue_stats(q) for q in pb.queues]

    async def list_producers(self, topic: str = "") -> list[ProducerInfo]:
        pb = await self._call(self._admin.ListProducers, admin_pb2.ListProducersRequest(topic=topic))
        return [ProducerInfo(self.broker_name or self.address, p.producer_id, p.key, p.created_ms, p.last_active_ms,
                             tuple(ProducerQueueState(q.topic, q.queue_id, q.epoch, q.last_sequence, q.last_offset)
                                   for q in p.queues))
                for p in pb.producers]

    async def list_groups(self, topic: str = "") -> list[GroupSummary]:
        pb = await self._call(self._admin.ListGroups, admin_pb2.ListGroupsRequest(topic=topic))
        return [GroupSummary(g.group, tuple(g.topics), g.member_count,
                             common_pb2.MessageModel.Name(g.message_model)) for g in pb.groups]

    async def describe_group(self, group: str) -> GroupDescription:
        pb = await self._call(self._admin.DescribeGroup, admin_pb2.DescribeGroupRequest(group=group))
        return GroupDescription(
            pb.group, tuple(convert.group_member(m) for m in pb.members),
            tuple(QueueLockInfo(convert.queue_from_pb(lk.queue), lk.client_id, lk.owner_epoch, lk.expire_timestamp)
                  for lk in pb.locks),
            tuple(PopQueueInflight(convert.queue_from_pb(p.queue), p.inflight, p.oldest_received_ms,
                                   p.earliest_invisible_until_ms, p.latest_invisible_until_ms, p.redelivered,
                                   p.max_attempt, p.overdue, p.pending_redelivery, p.waiting)
                  for p in pb.pop_queues))

    async def delete_group(self, group: str) -> None:
        await self._call(self._admin.DeleteGroup, admin_pb2.DeleteGroupRequest(group=group))

    async def group_config(self, group: str) -> GroupConfig:
        return convert.group_config(await self._call(self._admin.GetGroupConfig,
                                                     admin_pb2.GetGroupConfigRequest(group=group)))

    async def update_group_config(self, group: str, *, dry_run: bool = False, **changes: Any) -> GroupConfig:
        """updateSubGroup; with dry_run the config the change would give, nothing stored."""
        request = admin_pb2.UpdateGroupConfigRequest(group=group, dry_run=dry_run)
        for field, value in changes.items():
            if field not in ("consume_enable", "consume_broadcast_enable", "retry_queue_nums", "retry_max_times",
                             "consume_orderly"):
                raise InvalidArgumentError(f"unknown group setting {field!r}")
            if value is not None:
                setattr(request, field, value)
        return convert.group_config(await self._call(self._admin.UpdateGroupConfig, request))

    async def broker_status(self) -> BrokerStatus:
        pb = await self._call(self._admin.GetBrokerStatus, admin_pb2.GetBrokerStatusRequest())
        fields = {name: getattr(pb, name) for name in BrokerStatus.__slots__}
        # (a repeated field: a tuple, so the frozen status compares and hashes; empty from an older broker)
        return BrokerStatus(**fields | {"in_sync_replicas": tuple(pb.in_sync_replicas)})

    async def query_message_by_id(self, msg_id: str, topic: str = "") -> list[MessageExt]:
        pb = await self._call(self._admin.QueryMessageById,
                              admin_pb2.QueryMessageByIdRequest(msg_id=msg_id, topic=topic))
        return [convert.message_ext(m) for m in pb.messages]

    async def deliveries(self, topic: str, queue_id: int, offset: int) -> list[Delivery]:
        pb = await self._call(self._admin.GetDeliveries,
                              admin_pb2.GetDeliveriesRequest(topic=topic, queue_id=queue_id, offset=offset))
        return [Delivery(d.group, d.client_id, d.delivered_ms, d.first_offset, d.next_offset) for d in pb.deliveries]

    async def delete_group_offsets(self, group: str, topic: str, *, dry_run: bool = False) -> list[OffsetChange]:
        pb = await self._call(self._admin.DeleteGroupOffsets,
                              admin_pb2.DeleteGroupOffsetsRequest(group=group, topic=topic, dry_run=dry_run))
        return [OffsetChange(convert.queue_from_pb(c.queue), c.old_offset, c.new_offset) for c in pb.changes]

    async def clone_group_offsets(self, src_group: str, dest_group: str, topic: str, *,
                                  dry_run: bool = False) -> list[OffsetChange]:
        pb = await self._call(self._admin.CloneGroupOffsets, admin_pb2.CloneGroupOffsetsRequest(
            src_group=src_group, dest_group=dest_group, topic=topic, dry_run=dry_run))
        return [OffsetChange(convert.queue_from_pb(c.queue), c.old_offset, c.new_offset) for c in pb.changes]

    async def delete_expired_commitlog(self) -> int:
        pb = await self._call(self._admin.DeleteExpiredCommitLog, admin_pb2.DeleteExpiredCommitLogRequest())
        return pb.deleted_segments

    # -- users and ACL rules ---------------------------------------------------

    async def create_user(self, name: str, secret_key: str, *, super_user: bool = False) -> UserInfo:
        pb = await self._call(self._admin.CreateUser, admin_pb2.CreateUserRequest(
            name=name, secret_key=secret_key, super_user=super_user))
        return UserInfo(pb.name, pb.super_user)

    async def update_user(self, name: str, *, secret_key: str | None = None,
                          super_user: bool | None = None) -> UserInfo:
        request = admin_pb2.UpdateUserRequest(name=name)
        if secret_key is not None:
            request.secret_key = secret_key
        if super_user is not None:
            request.super_user = super_user
        pb = await self._call(self._admin.UpdateUser, request)
        return UserInfo(pb.name, pb.super_user)

    async def delete_user(self, name: str) -> int:
        """Delete a user and its ACL rules; how many rules went with it."""
        return (await self._call(self._admin.DeleteUser, admin_pb2.DeleteUserRequest(name=name))).deleted_acls

    async def list_users(self) -> list[UserInfo]:
        pb = await self._call(self._admin.ListUsers, admin_pb2.ListUsersRequest())
        return [UserInfo(u.name, u.super_user) for u in pb.users]

    async def create_acl(self, user: str, resource: str, actions: Sequence[str], decision: str,
                         source_ips: Sequence[str] = ()) -> AclRuleInfo:
        pb = await self._call(self._admin.CreateAcl, admin_pb2.CreateAclRequest(
            user=user, resource=resource, actions=list(actions), decision=decision, source_ips=list(source_ips)))
        return convert.acl_rule(pb)

    async def delete_acl(self, user: str, resource: str | None = None) -> int:
        request = admin_pb2.DeleteAclRequest(user=user)
        if resource is not None:
            request.resource = resource
        return (await self._call(self._admin.DeleteAcl, request)).deleted

    async def list_acls(self, user: str | None = None) -> list[AclRuleInfo]:
        request = admin_pb2.ListAclsRequest()
        if user is not None:
            request.user = user
        return [convert.acl_rule(r) for r in (await self._call(self._admin.ListAcls, request)).rules]


def _subscription_pb(topic: str, expression: str, expression_type: str = ExpressionType.TAG) -> common_pb2.Subscription:
    pb = common_pb2.Subscription(topic=topic, expression=expression)
    if expression_type == ExpressionType.SQL92:
        pb.expression_type = common_pb2.SQL92
    return pb
