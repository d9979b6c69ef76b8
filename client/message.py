"""Messages, queues and results as the client library hands them to applications."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from tidemark.client.errors import InvalidArgumentError, InvalidTypeError
from tidemark.common import records
from tidemark.common.protocol import PropertyKey


@dataclass(frozen=True, slots=True, order=True)
class MessageQueue:
    """A queue of a topic on one broker: the unit of ordering, ownership and offsets."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"MessageQueue [topic={self.topic}, brokerName={self.broker_name}, queueId={self.queue_id}]"


# RocketMQ 5's limit on a message group (the broker's RocketMQ 5 adapter refuses longer ones too).
MAX_MESSAGE_GROUP_LENGTH = 64


@dataclass(frozen=True, slots=True)
class Message:
    """A message to send. `keys` may hold several keys separated by spaces.

    `message_group` (RocketMQ 5 FIFO): messages of one group go to one queue (a hash of the group,
    unless a queue or selector is given) and an orderly consumer keeps their order while other groups
    of the queue flow past a slow one. It is stored as the `__SHARDINGKEY` property, where RocketMQ 5
    clients put it, and is read back from there (copies that keep the properties keep the group)."""

    topic: str
    body: bytes
    tags: str = ""
    keys: str = ""
    properties: Mapping[str, str] = field(default_factory=dict)
    delay_level: int = 0
    flag: int = 0
    message_group: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.body, str):
            object.__setattr__(self, "body", self.body.encode("utf-8"))
        if not isinstance(self.body, bytes | bytearray | memoryview):
            raise InvalidTypeError(f"message body must be bytes or str, not {type(self.body).__name__}")
        group, stored = self.message_group, self.properties.get(PropertyKey.SHARDING_KEY)
        if group is None:
            # A copy of a stored message (a retry, a requeue) keeps a group its property holds. One that is
            # not a group by the rule below (other producers store what they like there) is only a property:
            # refusing it would make such messages impossible to send back or requeue.
            if stored is not None and _group_problem(stored) is None:
                object.__setattr__(self, "message_group", stored)
            return
        if stored is not None and stored != group:
            raise InvalidArgumentError(f"message_group {group!r} differs from the {PropertyKey.SHARDING_KEY} "
                                       f"property {stored!r}: give it once")
        if not isinstance(group, str):
            raise InvalidTypeError(f"message_group must be a str, not {type(group).__name__}")
        problem = _group_problem(group)
        if problem is not None:
            raise InvalidArgumentError(problem)
        if stored is None:
            object.__setattr__(self, "properties", {**self.properties, PropertyKey.SHARDING_KEY: group})


def _group_problem(group: object) -> str | None:
    """Why a value is not a message group by RocketMQ's rule (a non-blank string of at most 64 characters,
    no control characters); None when it is one."""
    if not isinstance(group, str):
        return f"message_group must be a str, not {type(group).__name__}"
    if not group.strip():
        return "message_group must not be empty or blank (leave it None for no group)"
    if len(group) > MAX_MESSAGE_GROUP_LENGTH:
        return f"message_group is {len(group)} characters; at most {MAX_MESSAGE_GROUP_LENGTH} are allowed"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in group):
        return f"message_group {group!r} must not contain control characters"
    return None


_HIDDEN_PROPERTIES = (PropertyKey.TAGS, PropertyKey.KEYS, PropertyKey.UNIQ_KEY)
_FIELDS = ("topic", "broker_name", "queue_id", "queue_offset", "msg_id", "body", "tags", "keys", "properties",
           "born_timestamp", "store_timestamp", "reconsume_times", "commit_log_offset", "store_size", "flag",
           "born_host")


class MessageExt:
    """A stored message as a consumer receives it.

    Built from the record bytes the broker served (`from_record`): the fixed
    header fields are read at once, the body, properties, tags, keys and message
    id only when first asked for, so a listener that reads only `body` never
    pays for the rest. Treat it as immutable; `replace()` gives a changed copy.
    """

    __slots__ = ("topic", "broker_name", "queue_id", "queue_offset", "born_timestamp", "store_timestamp",
                 "reconsume_times", "commit_log_offset", "store_size", "flag", "_record", "_at", "_body",
                 "_properties", "_msg_id", "_tags", "_keys", "_born_host")

    def __init__(self, topic: str, broker_name: str, queue_id: int, queue_offset: int, msg_id: str,
                 body: bytes, tags: str = "", keys: str = "", properties: Mapping[str, str] | None = None,
                 born_timestamp: int = 0, store_timestamp: int = 0, reconsume_times: int = 0,
                 commit_log_offset: int = 0, store_size: int = 0, flag: int = 0, born_host: str = "") -> None:
        self.topic = topic
        self.broker_name = broker_name
        self.queue_id = queue_id
        self.queue_offset = queue_offset
        self.born_timestamp = born_timestamp
        self.store_timestamp = store_timestamp
        self.reconsume_times = reconsume_times
        self.commit_log_offset = commit_log_offset
        self.store_size = store_size
        self.flag = flag
        self._record = None
        self._at = 0
        self._body = body
        self._properties = dict(properties) if properties else {}
        self._msg_id = msg_id
        self._tags = tags
        self._keys = keys
        self._born_host = born_host

    @classmethod
    def from_record(cls, record: bytes, at: int, *, topic: str, broker_name: str) -> MessageExt:
        """A message over the record starting at `at` (the topic is the queue's: every record of a queue
        carries it, so it is not decoded)."""
        self = cls.__new__(cls)
        (self.store_size, _magic, _crc, self.queue_id, self.flag, self.queue_offset, self.commit_log_offset,
         _sys_flag, self.born_timestamp, self.store_timestamp, self.reconsume_times,
         _tags_code) = records.HEADER.unpack_from(record, at)
        self.topic = topic
        self.broker_name = broker_name
        self._record = record
        self._at = at
        self._body = self._properties = None
        return self

    def _decode(self) -> None:
        record = self._record
        host_at, nh, _topic_at, _nt, props_at, npr, body_at, nb = records.variable_fields(record, self._at)
        self._born_host = str(record[host_at:host_at + nh], "utf-8")
        props = records.decode_properties(record[props_at:props_at + npr])
        self._msg_id = props.pop(PropertyKey.UNIQ_KEY, "")
        self._tags = props.pop(PropertyKey.TAGS, "")
        self._keys = props.pop(PropertyKey.KEYS, "")
        self._properties = props
        self._body = record[body_at:body_at + nb]

    @property
    def body(self) -> bytes:
        if self._body is None:
            self._decode()
        return self._body

    @property
    def properties(self) -> Mapping[str, str]:
        """User properties (tags, keys and the message id have their own attributes)."""
        if self._properties is None:
            self._decode()
        return self._properties

    @property
    def msg_id(self) -> str:
        """Stays the same across retries (RocketMQ's UNIQ_KEY)."""
        if self._properties is None:
            self._decode()
        return self._msg_id

    @property
    def tags(self) -> str:
        if self._properties is None:
            self._decode()
        return self._tags

    @property
    def keys(self) -> str:
        if self._properties is None:
            self._decode()
        return self._keys

    @property
    def born_host(self) -> str:
        if self._properties is None:
            self._decode()
        return self._born_host

    @property
    def message_group(self) -> str | None:
        """The message group it was sent with (the `__SHARDINGKEY` property), None without one."""
        return self.properties.get(PropertyKey.SHARDING_KEY) or None

    @property
    def message_queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_name, self.queue_id)

    @property
    def origin_topic(self) -> str:
        """The topic the message was first sent to (differs for retried messages)."""
        return self.properties.get(PropertyKey.RETRY_TOPIC, self.topic)

    def replace(self, **changes: object) -> MessageExt:
        """A copy with some fields changed (like dataclasses.replace)."""
        fields = {name: getattr(self, name) for name in _FIELDS}
        unknown = set(changes) - set(fields)
        if unknown:
            raise InvalidTypeError(f"MessageExt has no field(s) {', '.join(sorted(unknown))}")
        fields.update(changes)
        return MessageExt(**fields)  # type: ignore[arg-type]

    def _key(self) -> tuple:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageExt):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((self.topic, self.broker_name, self.queue_id, self.queue_offset, self.commit_log_offset))

    def __repr__(self) -> str:
        return "MessageExt(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS) + ")"


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
    """Where a group starts on a queue it has no committed offset for (RocketMQ's ConsumeFromWhere)."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


class ConsumeConcurrentlyStatus(enum.Enum):
    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class ConsumeOrderlyStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"
