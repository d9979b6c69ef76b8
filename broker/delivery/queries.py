"""Read-only questions about stored messages: one message by position, by key or by msg id, per-queue stats.

Domain code for the admin and messaging servicers (no grpc): names and ranges
are checked here, and the answers are domain objects.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from tidemark.broker.delivery.pull import check_queue
from tidemark.broker.errors import InvalidArgumentError, NotFoundError
from tidemark.broker.store import MessageStore, StoredMessage
from tidemark.broker.topics import TopicConfigManager
from tidemark.common.protocol import PropertyKey, is_broker_topic, split_keys

MAX_KEY_QUERY_RESULTS = 1000
DEFAULT_KEY_QUERY_RESULTS = 64
# Messages read per step while scanning a queue for a key or a msg id (there is no index).
_SCAN_STEP = 256
# A msg id is found through the time it carries: the producer's clock may be off the broker's by this much.
MSG_ID_CLOCK_SKEW_MS = 10 * 60 * 1000
MAX_MSG_ID_RESULTS = 64
_TIDEMARK_ID = re.compile(r"[0-9A-F]{32}")  # tidemark.common.protocol.MessageIdGenerator
_RMQ5_ID = re.compile(r"01[0-9A-F]{32}")  # RocketMQ 5 clients' MessageIdCodec, version 01
_RMQ5_EPOCH_S = int(datetime(2021, 1, 1, tzinfo=UTC).timestamp())
_EARLIEST_ID_MS = int(datetime(2000, 1, 1, tzinfo=UTC).timestamp() * 1000)


def msg_id_time_ms(msg_id: str) -> int:
    """When the producer made a msg id (ms since the epoch); InvalidArgumentError for anything that is not one.

    Two shapes reach this broker: Tidemark's (32 hex digits: 6 bytes of process prefix, the milliseconds,
    a 2-byte counter) and RocketMQ 5 clients' (34: version 01, MAC, pid, seconds since 2021-01-01,
    sequence). There is no offset message id: a message is found by scanning around that time."""
    if not isinstance(msg_id, str) or not msg_id:
        raise InvalidArgumentError("msg id must not be empty")
    text = msg_id.upper()
    if _TIDEMARK_ID.fullmatch(text):
        born = int(text[12:28], 16)
    elif _RMQ5_ID.fullmatch(text):
        born = (_RMQ5_EPOCH_S + int(text[18:26], 16)) * 1000
    else:
        shown = msg_id if len(msg_id) <= 80 else msg_id[:80] + "..."
        raise InvalidArgumentError(f"msg id {shown!r} is malformed: expected 32 hex digits (Tidemark) or 34 "
                                   f"starting with 01 (RocketMQ 5 clients)")
    if born < _EARLIEST_ID_MS:
        raise InvalidArgumentError(f"msg id {msg_id!r} is malformed: the time it carries is before 2000")
    return born


@dataclass(frozen=True, slots=True)
class QueueStats:
    queue_id: int
    min_offset: int
    max_offset: int
    last_store_timestamp: int  # of the newest message; 0 when the queue is empty


class MessageQueries:
    def __init__(self, *, store: MessageStore, topics: TopicConfigManager) -> None:
        self._store = store
        self._topics = topics

    def message_at(self, topic_name: str, queue_id: int, offset: int) -> StoredMessage:
        """The message at a queue position (NotFoundError saying which offsets the queue holds)."""
        check_queue(self._topics.require(topic_name), queue_id)
        if offset < 0:
            raise InvalidArgumentError(f"queue offset must be >= 0, got {offset}")
        message = self._store.message_at(topic_name, queue_id, offset)
        if message is None:
            low = self._store.min_offset(topic_name, queue_id)
            high = self._store.max_offset(topic_name, queue_id)
            raise NotFoundError(f"no message at {topic_name}:{queue_id}@{offset} (queue holds offsets "
                                f"{low}..{high - 1})")
        return message

    def by_key(self, topic_name: str, key: str, begin_ms: int, end_ms: int, max_num: int) -> list[StoredMessage]:
        """Messages of a topic stored within [begin_ms, end_ms] whose keys include `key`, oldest first.

        There is no key index: each queue is scanned from the first message stored at begin_ms, so the
        cost grows with the time range; at most MAX_KEY_QUERY_RESULTS are returned."""
        topic = self._topics.require(topic_name)
        if not key:
            raise InvalidArgumentError("key must not be empty")
        if begin_ms < 0 or end_ms < begin_ms:
            raise InvalidArgumentError(f"time range [{begin_ms}, {end_ms}] is empty or negative")
        limit = min(max_num or DEFAULT_KEY_QUERY_RESULTS, MAX_KEY_QUERY_RESULTS)
        found: list[StoredMessage] = []
        for queue_id in range(topic.queue_nums):
            found.extend(self._scan_keys(topic.name, queue_id, key, begin_ms, end_ms, limit))
        found.sort(key=lambda m: m.store_timestamp)
        return found[:limit]

    async def by_msg_id(self, msg_id: str, topic_name: str, *, later_ms: int) -> list[StoredMessage]:
        """Messages whose msg id (UNIQ_KEY) is `msg_id`, in one topic or (empty) every topic a client can
        read (retry and dead-letter topics included: a retried message keeps its id), oldest first.

        Queues are scanned from MSG_ID_CLOCK_SKEW_MS before the time the id carries to `later_ms` (the
        longest delay level) plus the skew after it, so a copy made later than that is not found. There is
        no msg id index: the scan yields to the event loop after every step, so other requests go on."""
        if topic_name:
            topics = [self._topics.require(topic_name)]
        else:
            topics = [t for t in self._topics.list(include_system=True) if not is_broker_topic(t.name)]
        born = msg_id_time_ms(msg_id)
        wanted = msg_id.upper()

        def match(m: StoredMessage) -> bool:
            return m.properties.get(PropertyKey.UNIQ_KEY, "").upper() == wanted

        begin, end = born - MSG_ID_CLOCK_SKEW_MS, born + later_ms + MSG_ID_CLOCK_SKEW_MS
        found: list[StoredMessage] = []
        for topic in topics:
            for queue_id in range(topic.queue_nums):
                for batch in self._steps(topic.name, queue_id, begin, end):
                    found.extend(m for m in batch if match(m))
                    await asyncio.sleep(0)
        found.sort(key=lambda m: (m.store_timestamp, m.commit_log_offset))
        return found[:MAX_MSG_ID_RESULTS]

    def _scan_keys(self, topic: str, queue_id: int, key: str, begin: int, end: int,
                   limit: int) -> list[StoredMessage]:
        return self._scan(topic, queue_id, lambda m: key in split_keys(m.keys), begin, end, limit)

    def _scan(self, topic: str, queue_id: int, match: Callable[[StoredMessage], bool], begin: int, end: int,
              limit: int) -> list[StoredMessage]:
        out: list[StoredMessage] = []
        for batch in self._steps(topic, queue_id, begin, end):
            out.extend(m for m in batch if match(m))
            if len(out) >= limit:
                break
        return out[:limit]

    def _steps(self, topic: str, queue_id: int, begin: int, end: int) -> Iterator[list[StoredMessage]]:
        """A queue's messages stored within [begin, end], _SCAN_STEP at a time."""
        store = self._store
        offset = store.search_offset_by_timestamp(topic, queue_id, begin)
        while offset < store.max_offset(topic, queue_id):
            result = store.get_messages(topic, queue_id, offset, _SCAN_STEP)
            if not result.messages:
                return
            batch = [m for m in result.messages if m.store_timestamp <= end]
            if batch:
                yield batch
            if len(batch) < len(result.messages):
                return
            offset = result.next_begin_offset

    def topic_stats(self, topic_name: str) -> list[QueueStats]:
        topic = self._topics.require(topic_name)
        stats = []
        for q in range(topic.queue_nums):
            high = self._store.max_offset(topic.name, q)
            last = self._store.store_timestamp_at(topic.name, q, high - 1) if high > 0 else None
            stats.append(QueueStats(q, self._store.min_offset(topic.name, q), high, last or 0))
        return stats
