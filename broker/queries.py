"""Read-only questions about stored messages: one message by position, messages by key, per-queue stats.

Domain code for the admin and messaging servicers (no grpc): names and ranges
are checked here, and the answers are domain objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.errors import InvalidArgumentError, NotFoundError
from broker.pull import check_queue
from broker.store import MessageStore, StoredMessage
from broker.topics import TopicConfigManager
from tidemark.protocol import split_keys

MAX_KEY_QUERY_RESULTS = 1000
DEFAULT_KEY_QUERY_RESULTS = 64
# Messages read per step while scanning a queue for a key (there is no key index).
_SCAN_STEP = 256


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

    def _scan_keys(self, topic: str, queue_id: int, key: str, begin: int, end: int,
                   limit: int) -> list[StoredMessage]:
        store = self._store
        offset = store.search_offset_by_timestamp(topic, queue_id, begin)
        high = store.max_offset(topic, queue_id)
        out: list[StoredMessage] = []
        while offset < high and len(out) < limit:
            result = store.get_messages(topic, queue_id, offset, _SCAN_STEP)
            if not result.messages:
                break
            for m in result.messages:
                if m.store_timestamp > end:
                    return out
                if key in split_keys(m.keys):
                    out.append(m)
            offset = result.next_begin_offset
        return out

    def topic_stats(self, topic_name: str) -> list[QueueStats]:
        topic = self._topics.require(topic_name)
        stats = []
        for q in range(topic.queue_nums):
            high = self._store.max_offset(topic.name, q)
            last = self._store.store_timestamp_at(topic.name, q, high - 1) if high > 0 else None
            stats.append(QueueStats(q, self._store.min_offset(topic.name, q), high, last or 0))
        return stats
