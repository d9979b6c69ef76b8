"""Messages, queues and results as the client library hands them to applications."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from tidemark.protocol import PropertyKey


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """A queue of a topic on one broker: the unit of ordering, ownership and offsets."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"


@dataclass(frozen=True, slots=True)
class Message:
    """A message to send. `keys` may hold several keys separated by spaces."""

    topic: str
    body: bytes
    tags: str = ""
    keys: str = ""
    properties: Mapping[str, str] = field(default_factory=dict)
    delay_level: int = 0
    flag: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.body, str):
            object.__setattr__(self, "body", self.body.encode("utf-8"))
        if not isinstance(self.body, bytes | bytearray | memoryview):
            raise TypeError(f"message body must be bytes or str, not {type(self.body).__name__}")


@dataclass(frozen=True, slots=True)
class MessageExt:
    """A stored message as a consumer receives it."""

    topic: str
    broker_name: str
    queue_id: int
    queue_offset: int
    msg_id: str
    body: bytes
    tags: str = ""
    keys: str = ""
    properties: Mapping[str, str] = field(default_factory=dict)
    born_timestamp: int = 0
    store_timestamp: int = 0
    reconsume_times: int = 0
    commit_log_offset: int = 0
    store_size: int = 0
    flag: int = 0
    born_host: str = ""

    @property
    def message_queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    @property
    def origin_topic(self) -> str:
        """The topic the message was first sent to (differs for retried messages)."""
        return self.properties.get(PropertyKey.RETRY_TOPIC, self.topic)


class SendStatus(enum.Enum):
    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"


@dataclass(frozen=True, slots=True)
class SendResult:
    msg_id: str
    message_queue: MessageQueue
    queue_offset: int
    status: SendStatus = SendStatus.SEND_OK


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"
    OFFSET_RESET = "OFFSET_RESET"


@dataclass(frozen=True, slots=True)
class PullResult:
    status: PullStatus
    messages: list[MessageExt]
    next_begin_offset: int
    min_offset: int
    max_offset: int
    reset_generation: int = 0


class MessageModel(enum.Enum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ConsumeFromWhere(enum.Enum):
    """Where a group starts on a queue it has no committed offset for (seed 000)."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class ConsumeConcurrentlyStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"
