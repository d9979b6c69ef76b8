"""Value types of the message store: its settings, what is stored, what reads return.

Kept apart from `message_store` so the codec can build `StoredMessage`s without
importing the facade. Everything here is re-exported by `tidemark.broker.store`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tidemark.broker.store.openfiles import DEFAULT_MAX_OPEN_FILES
from tidemark.common.protocol import DEFAULT_MAX_MESSAGE_SIZE, PropertyKey

# A segment must hold at least one small record plus the end-of-segment marker.
MIN_SEGMENT_SIZE = 1024


class FlushMode(enum.Enum):
    """RocketMQ's FlushDiskType: ASYNC_FLUSH (default) or SYNC_FLUSH (group commit)."""

    ASYNC = "async"
    SYNC = "sync"


@dataclass(frozen=True)
class StoreConfig:
    """Settings of one MessageStore; defaults are RocketMQ's MessageStoreConfig ones."""

    data_dir: Path
    commitlog_segment_size: int = 64 * 1024 * 1024
    consume_queue_entries_per_file: int = 300_000
    flush_mode: FlushMode = FlushMode.ASYNC
    flush_interval_ms: int = 500
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE  # body + encoded properties
    file_reserved_hours: float = 72.0
    # Consume-queue fds held at once (an LRU over all queues); not a RocketMQ setting (it mmaps).
    max_open_consume_queue_files: int = DEFAULT_MAX_OPEN_FILES

    def __post_init__(self) -> None:
        # Accept a str path and a "sync"/"async" string from config files; store the real types.
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "flush_mode", FlushMode(self.flush_mode))
        if not MIN_SEGMENT_SIZE <= self.commitlog_segment_size <= 2**31 - 1:
            raise ValueError(
                f"commitlog_segment_size {self.commitlog_segment_size} must be between "
                f"{MIN_SEGMENT_SIZE} and {2**31 - 1} bytes"
            )
        if self.consume_queue_entries_per_file < 1:
            raise ValueError(
                f"consume_queue_entries_per_file {self.consume_queue_entries_per_file} must be >= 1"
            )
        if self.flush_interval_ms < 1:
            raise ValueError(f"flush_interval_ms {self.flush_interval_ms} must be >= 1")
        if self.max_message_size < 1:
            raise ValueError(f"max_message_size {self.max_message_size} must be >= 1")
        if self.file_reserved_hours < 0:
            raise ValueError(f"file_reserved_hours {self.file_reserved_hours} must be >= 0")
        if self.max_open_consume_queue_files < 1:
            raise ValueError(
                f"max_open_consume_queue_files {self.max_open_consume_queue_files} must be >= 1"
            )


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """A message the broker asks the store to append."""

    topic: str
    queue_id: int
    body: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    # Stored in the consume-queue entry: the tag hash, or the deliver time for SCHEDULE_TOPIC.
    tags_code: int = 0
    flag: int = 0
    born_timestamp: int = 0  # ms
    born_host: str = ""
    reconsume_times: int = 0
    sys_flag: int = 0


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message read back from the commit log, with its position."""

    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    store_size: int
    body: bytes
    properties: dict[str, str]
    flag: int
    born_timestamp: int
    store_timestamp: int
    born_host: str
    reconsume_times: int
    tags_code: int
    sys_flag: int

    @property
    def tags(self) -> str:
        return self.properties.get(PropertyKey.TAGS, "")

    @property
    def keys(self) -> str:
        return self.properties.get(PropertyKey.KEYS, "")

    @property
    def msg_id(self) -> str:
        return self.properties.get(PropertyKey.UNIQ_KEY, "")

    def rewritten(self, *, topic: str, queue_id: int, properties: dict[str, str], tags_code: int,
                  reconsume_times: int | None = None) -> MessageRecord:
        """This message put again elsewhere (its real topic after a delay, a retry topic, a DLQ, the
        next delay level): body, flag, born time and host, sys flag kept; the rest as given."""
        return MessageRecord(
            topic=topic,
            queue_id=queue_id,
            body=self.body,
            properties=properties,
            tags_code=tags_code,
            flag=self.flag,
            born_timestamp=self.born_timestamp,
            born_host=self.born_host,
            reconsume_times=self.reconsume_times if reconsume_times is None else reconsume_times,
            sys_flag=self.sys_flag,
        )


@dataclass(frozen=True, slots=True)
class PutResult:
    queue_offset: int
    commit_log_offset: int
    store_timestamp: int
    store_size: int


class GetStatus(enum.Enum):
    """RocketMQ's GetMessageStatus, the cases a pull can meet."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"  # entries scanned, none matched the filter
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"  # max == 0 or min == max
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"  # offset == max: nothing new yet
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"  # offset > max
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"  # offset < min


@dataclass(frozen=True)
class GetResult:
    status: GetStatus
    messages: list[StoredMessage]
    next_begin_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class RecordsPut:
    """Where a producer's record batch landed: queue offsets first_offset.., durable up to `end`."""

    first_offset: int
    msg_ids: Sequence[str]  # decoded one by one when read (batches.MsgIds)
    store_timestamp: int
    end: int  # commit-log offset just past the batch
    # An idempotent producer's retry of a batch stored before: nothing was written (first_offset is the
    # original's, or -1 when the broker no longer remembers it).
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class RawRead:
    """Stored records of one queue as bytes, back to back (tidemark.common.records layout).

    next_offset follows the last consume-queue entry examined, so a read whose
    entries were all filtered out still moves forward.
    """

    status: GetStatus
    data: bytes
    count: int
    next_offset: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class RecoveryReport:
    """What load() found and repaired."""

    clean_shutdown: bool
    scanned_from: int  # commit-log offset the scan started at
    commit_log_end: int  # valid end after recovery
    truncated_bytes: int  # commit-log bytes dropped behind a torn or corrupt record
    redispatched: int  # consume-queue entries (re)written from scanned records
    consume_queue_entries_dropped: int  # torn entries and entries pointing past the valid end
    duration_s: float
