"""Protobuf <-> client dataclasses. Nothing outside client/remoting sees protobuf."""

from __future__ import annotations

from tidemark.client.message import Message, MessageExt, MessageQueue, PullResult, PullStatus
from tidemark.client.types import (
    AclRuleInfo,
    BrokerInfo,
    CommitRejectReason,
    GroupConfig,
    GroupMember,
    OffsetCommit,
    QueueData,
    QueueStats,
    RejectedCommit,
    TopicConfig,
    TopicQueueStats,
    TopicRoute,
)
from tidemark.v1 import admin_pb2, common_pb2, messaging_pb2, offsets_pb2

_PULL_STATUS = {
    messaging_pb2.FOUND: PullStatus.FOUND,
    messaging_pb2.NO_NEW_MSG: PullStatus.NO_NEW_MSG,
    messaging_pb2.NO_MATCHED_MSG: PullStatus.NO_MATCHED_MSG,
    messaging_pb2.OFFSET_ILLEGAL: PullStatus.OFFSET_ILLEGAL,
    messaging_pb2.OFFSET_RESET: PullStatus.OFFSET_RESET,
}
_REJECT = {
    offsets_pb2.FENCED: CommitRejectReason.FENCED,
    offsets_pb2.STALE_RESET_GENERATION: CommitRejectReason.STALE_RESET_GENERATION,
    offsets_pb2.INVALID: CommitRejectReason.INVALID,
}


def queue_pb(mq: MessageQueue) -> common_pb2.MessageQueue:
    return common_pb2.MessageQueue(topic=mq.topic, broker_name=mq.broker_name, queue_id=mq.queue_id)


def queue_from_pb(pb: common_pb2.MessageQueue) -> MessageQueue:
    return MessageQueue(pb.topic, pb.broker_name, pb.queue_id)


def message_pb(m: Message, born_timestamp: int, born_host: str) -> common_pb2.Message:
    return common_pb2.Message(body=bytes(m.body), tags=m.tags, keys=m.keys, properties=dict(m.properties),
                              flag=m.flag, born_timestamp=born_timestamp, delay_level=m.delay_level,
                              born_host=born_host)


def message_ext(pb: common_pb2.MessageExt) -> MessageExt:
    return MessageExt(
        topic=pb.topic, broker_name=pb.broker_name, queue_id=pb.queue_id, queue_offset=pb.queue_offset,
        msg_id=pb.msg_id, body=pb.body, tags=pb.tags, keys=pb.keys, properties=dict(pb.properties),
        born_timestamp=pb.born_timestamp, store_timestamp=pb.store_timestamp,
        reconsume_times=pb.reconsume_times, commit_log_offset=pb.commit_log_offset,
        store_size=pb.store_size, flag=pb.flag, born_host=pb.born_host,
    )


def pull_result(pb: messaging_pb2.PullMessageResponse) -> PullResult:
    return PullResult(
        status=_PULL_STATUS[pb.status],
        messages=[message_ext(m) for m in pb.messages],
        next_begin_offset=pb.next_begin_offset,
        min_offset=pb.min_offset,
        max_offset=pb.max_offset,
        reset_generation=pb.reset_generation,
    )


def fence_pb(c: OffsetCommit) -> common_pb2.CommitFence | None:
    if not c.client_id and c.owner_epoch is None and c.reset_generation is None:
        return None
    fence = common_pb2.CommitFence(client_id=c.client_id)
    if c.owner_epoch is not None:
        fence.owner_epoch = c.owner_epoch
    if c.reset_generation is not None:
        fence.reset_generation = c.reset_generation
    return fence


def commit_pb(c: OffsetCommit) -> offsets_pb2.OffsetCommit:
    return offsets_pb2.OffsetCommit(group=c.group, topic=c.queue.topic, queue_id=c.queue.queue_id,
                                    offset=c.offset, fence=fence_pb(c))


def rejected(pb: offsets_pb2.RejectedCommit, broker_name: str) -> RejectedCommit:
    c = pb.commit
    return RejectedCommit(group=c.group, queue=MessageQueue(c.topic, broker_name, c.queue_id), offset=c.offset,
                          reason=_REJECT.get(pb.reason, CommitRejectReason.INVALID), message=pb.message)


def topic_config(pb: admin_pb2.TopicConfig) -> TopicConfig:
    return TopicConfig(pb.name, pb.read_queue_nums, pb.write_queue_nums, pb.readable, pb.writable, pb.system)


def topic_route(pb: admin_pb2.TopicRoute) -> TopicRoute:
    return TopicRoute(pb.topic, tuple(
        QueueData(d.broker_name, d.broker_addr, d.read_queue_nums, d.write_queue_nums, d.readable, d.writable)
        for d in pb.queue_datas))


def broker_info(pb: admin_pb2.BrokerInfo) -> BrokerInfo:
    return BrokerInfo(pb.broker_name, pb.broker_addr, pb.readable, pb.writable, pb.version, pb.flush_mode,
                      tuple(pb.delay_levels), pb.broker_id, pb.epoch, pb.fenced)


def queue_stats(pb: offsets_pb2.QueueStats) -> QueueStats:
    return QueueStats(queue_from_pb(pb.queue), pb.min_offset, pb.max_offset, pb.consumer_offset, pb.lag,
                      pb.last_timestamp)


def topic_queue_stats(pb: admin_pb2.TopicQueueStats) -> TopicQueueStats:
    return TopicQueueStats(queue_from_pb(pb.queue), pb.min_offset, pb.max_offset, pb.last_update_timestamp)


def group_member(pb: admin_pb2.GroupMember) -> GroupMember:
    return GroupMember(
        client_id=pb.client_id, host=pb.host,
        subscriptions=tuple((s.topic, s.expression) for s in pb.subscriptions),
        owned_queues=tuple(queue_from_pb(q) for q in pb.owned_queues),
        message_model=common_pb2.MessageModel.Name(pb.message_model),
        consume_type=common_pb2.ConsumeType.Name(pb.consume_type),
        orderly=pb.orderly, last_heartbeat_timestamp=pb.last_heartbeat_timestamp,
        allocate_strategy=pb.allocate_strategy,
    )


def group_config(pb: admin_pb2.GroupConfig) -> GroupConfig:
    return GroupConfig(pb.group, pb.consume_enable, pb.consume_broadcast_enable, pb.retry_queue_nums,
                       pb.retry_max_times, pb.consume_orderly)


def acl_rule(pb: admin_pb2.AclRule) -> AclRuleInfo:
    return AclRuleInfo(pb.user, pb.resource, tuple(pb.actions), pb.decision, tuple(pb.source_ips))
