"""Protobuf <-> domain conversion for the broker's servicers."""

from __future__ import annotations

from tidemark.broker.errors import InvalidArgumentError
from tidemark.broker.operations import Fence, StoredMessage, TopicConfig
from tidemark.common.protocol import (
    ExpressionType,
    InvalidNameError,
    PropertyKey,
    check_client_id,
    check_topic_name,
)
from tidemark.v1 import admin_pb2, common_pb2

# Properties that have their own MessageExt field are not repeated in the map.
_HIDDEN_PROPERTIES = frozenset({PropertyKey.TAGS, PropertyKey.KEYS, PropertyKey.UNIQ_KEY})


def checked_client_id(client_id: str, *, optional: bool = False) -> str:
    """The client id of a request, or InvalidArgumentError; `optional` lets an empty one through."""
    if optional and not client_id:
        return client_id
    try:
        check_client_id(client_id)
    except InvalidNameError as e:
        raise InvalidArgumentError(str(e)) from None
    return client_id


def checked_topic(topic: str) -> str:
    try:
        check_topic_name(topic)
    except InvalidNameError as e:
        raise InvalidArgumentError(str(e)) from None
    return topic


# ExpressionType on the wire (EXPRESSION_TYPE_UNSPECIFIED, sent by clients that predate the field: TAG).
_EXPRESSION_TYPES = {common_pb2.EXPRESSION_TYPE_UNSPECIFIED: ExpressionType.TAG, common_pb2.TAG: ExpressionType.TAG,
                     common_pb2.SQL92: ExpressionType.SQL92}


def expression_type(value: int) -> str:
    """The ExpressionType of a request: TAG or SQL92, else the number as text, which the read's checks
    refuse (INVALID_ARGUMENT for that read only: a fetch stream's other queues go on)."""
    return _EXPRESSION_TYPES.get(value) or str(value)


def expression_type_pb(value: str) -> int:
    return common_pb2.SQL92 if value == ExpressionType.SQL92 else common_pb2.TAG


def fence_from_pb(fence: common_pb2.CommitFence, present: bool) -> Fence | None:
    if not present:
        return None
    checked_client_id(fence.client_id, optional=True)
    return Fence(
        client_id=fence.client_id,
        owner_epoch=fence.owner_epoch if fence.HasField("owner_epoch") else None,
        reset_generation=fence.reset_generation if fence.HasField("reset_generation") else None,
    )


def message_ext(m: StoredMessage, broker_name: str) -> common_pb2.MessageExt:
    props = m.properties
    return common_pb2.MessageExt(
        topic=m.topic,
        broker_name=broker_name,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        msg_id=props.get(PropertyKey.UNIQ_KEY, ""),
        tags=props.get(PropertyKey.TAGS, ""),
        keys=props.get(PropertyKey.KEYS, ""),
        body=m.body,
        properties={k: v for k, v in props.items() if k not in _HIDDEN_PROPERTIES},
        born_timestamp=m.born_timestamp,
        store_timestamp=m.store_timestamp,
        reconsume_times=m.reconsume_times,
        commit_log_offset=m.commit_log_offset,
        store_size=m.store_size,
        flag=m.flag,
        born_host=m.born_host,
    )


def topic_config(t: TopicConfig) -> admin_pb2.TopicConfig:
    return admin_pb2.TopicConfig(name=t.name, read_queue_nums=t.read_queue_nums,
                                 write_queue_nums=t.write_queue_nums, readable=t.readable,
                                 writable=t.writable, system=t.system)


def queue(topic: str, broker_name: str, queue_id: int) -> common_pb2.MessageQueue:
    return common_pb2.MessageQueue(topic=topic, broker_name=broker_name, queue_id=queue_id)
