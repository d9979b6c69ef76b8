"""SendBackService: RocketMQ's CONSUMER_SEND_MSG_BACK on the broker: a failed message
copied to its group's retry topic with the next delay level, or to the DLQ after max reconsume times.

A consumed message that failed goes to %RETRY%<group> with delay level
3 + reconsume_times (or the level the client gives), reconsume_times + 1, and
its original topic and msg id kept in properties; past the max reconsume times,
or with a negative delay level, it goes to %DLQ%<group>. Both topics are
created on first use. A broker whose write permission is closed refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tidemark.broker.cluster.permission import BrokerPermission
from tidemark.broker.errors import InvalidArgumentError, NotFoundError
from tidemark.broker.ingest.delays import ScheduleMessageService
from tidemark.broker.membership.groups import SubscriptionGroupManager, check_group
from tidemark.broker.store import MessageRecord, MessageStore, StoredMessage
from tidemark.broker.topics import TopicConfigManager
from tidemark.common.logs import get_logger
from tidemark.common.protocol import PropertyKey, dlq_topic, retry_topic, tag_hash

log = get_logger("tidemark.broker.ingest.send_back")

FIRST_RETRY_DELAY_LEVEL = 3


@dataclass(frozen=True, slots=True)
class SendBackResult:
    topic: str
    queue_id: int
    queue_offset: int
    delay_level: int
    reconsume_times: int

    @property
    def to_dlq(self) -> bool:
        return self.topic.startswith("%DLQ%")


def retry_delay_level(requested: int, reconsume_times: int, levels: int) -> int:
    """The delay level a retried message waits: the client's, or 3 + reconsume times, capped at the last level."""
    level = requested if requested > 0 else FIRST_RETRY_DELAY_LEVEL + reconsume_times
    return min(level, levels)


def redelivery_copy(message: StoredMessage, *, topic: str, queue_id: int, reconsume_times: int,
                    max_reconsume_times: int) -> MessageRecord:
    """A failed message copied for another delivery (a retry topic) or for good (a DLQ): its body,
    tags, keys and msg id, with the topic it was first sent to (RETRY_TOPIC), its original msg id
    and how often it has been consumed."""
    props = dict(message.properties)
    props.setdefault(PropertyKey.RETRY_TOPIC, message.topic)
    if message.msg_id:
        props.setdefault(PropertyKey.ORIGIN_MESSAGE_ID, message.msg_id)
    props[PropertyKey.MAX_RECONSUME_TIMES] = str(max_reconsume_times)
    return message.rewritten(topic=topic, queue_id=queue_id, properties=props,
                             tags_code=tag_hash(props.get(PropertyKey.TAGS, "")), reconsume_times=reconsume_times)


class SendBackService:
    def __init__(self, *, store: MessageStore, topics: TopicConfigManager, groups: SubscriptionGroupManager,
                 permission: BrokerPermission, schedule: ScheduleMessageService,
                 clock_ms: Callable[[], int]) -> None:
        self._store = store
        self._topics = topics
        self._groups = groups
        self._permission = permission
        self._schedule = schedule
        self._clock_ms = clock_ms
        self._next_queue = 0
        self.retried = 0
        self.dead_lettered = 0

    async def send_back(self, *, group: str, commit_log_offset: int, msg_id: str, delay_level: int,
                        max_reconsume_times: int,
                        may_read: Callable[[str], None] = lambda topic: None) -> SendBackResult:
        """Copy a consumed message to the group's retry topic (or DLQ). `may_read(topic)` raises when the
        caller may not read the message's topic (or the topic it was first sent to): a send-back must not
        become a way to copy any stored message into a topic the caller can read."""
        check_group(group)
        if commit_log_offset < 0:
            raise InvalidArgumentError(f"commit_log_offset must be >= 0, got {commit_log_offset}")
        if max_reconsume_times < 0:
            raise InvalidArgumentError(f"max_reconsume_times must be >= 0, got {max_reconsume_times}")
        self._permission.check_writable()
        message = self._store.read_message(commit_log_offset)
        if message is None:
            raise NotFoundError(f"no message at commit log offset {commit_log_offset}")
        if msg_id and message.msg_id and msg_id != message.msg_id:
            raise InvalidArgumentError(
                f"message at commit log offset {commit_log_offset} has msg id {message.msg_id}, not {msg_id}")
        for topic_read in dict.fromkeys((message.topic, message.properties.get(PropertyKey.RETRY_TOPIC))):
            if topic_read:
                may_read(topic_read)
        config = self._groups.ensure(group)
        max_times = max_reconsume_times or config.retry_max_times
        reconsume = message.reconsume_times
        if delay_level < 0 or reconsume >= max_times:
            topic = self._topics.ensure_system_topic(dlq_topic(group), 1)
            queue_id, level = 0, 0
        else:
            topic = self._topics.ensure_system_topic(retry_topic(group), config.retry_queue_nums)
            queue_id = self._next_queue % topic.write_queue_nums
            self._next_queue += 1
            level = retry_delay_level(delay_level, reconsume, len(self._schedule.levels_ms))
        record = redelivery_copy(message, topic=topic.name, queue_id=queue_id, reconsume_times=reconsume + 1,
                                 max_reconsume_times=max_times)
        if level > 0:
            record = self._schedule.to_schedule_record(record, level, self._clock_ms())
        (put,) = await self._store.put_messages([record])
        if level > 0:
            self.retried += 1
        else:
            self.dead_lettered += 1
            log.warning("message moved to DLQ",
                        event="dlq", group=group, msg_id=message.msg_id, reconsume_times=reconsume + 1)
        return SendBackResult(topic.name, queue_id, put.queue_offset, level, reconsume + 1)
