"""OffsetStore: where a consumer keeps its progress (RocketMQ's OffsetStore).

- RemoteBrokerOffsetStore (CLUSTERING): an in-memory table persisted to the
  brokers oneway over the CommitOffsets stream every 5 s, on shutdown and when a
  queue is dropped. Each commit carries the fence of the queue's current lease
  (owner epoch, reset generation) so the broker can refuse a stale owner.
- LocalFileOffsetStore (BROADCASTING):
  ~/.tidemark_offsets/<clientId>/<group>/offsets.json (TIDEMARK_OFFSET_DIR
  overrides the root), written atomically in a worker thread.

Both are confined to the consumer's event loop.
"""

from __future__ import annotations

import asyncio
import enum
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tidemark.client.consumer.lease import QueueLease
from tidemark.client.errors import TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.types import (
    CommitOffsetsResult,
    CommitRejectReason,
    OffsetCommit,
    RejectedCommit,
)
from tidemark.common.fsutil import atomic_write
from tidemark.common.logs import get_logger

log = get_logger("tidemark.client.offsets")

OFFSET_DIR_ENV = "TIDEMARK_OFFSET_DIR"


class ReadOffsetType(enum.Enum):
    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


@dataclass(slots=True)
class _Entry:
    offset: int
    lease: QueueLease | None = None  # whose fence a commit of this offset quotes


class OffsetStore(ABC):
    def __init__(self) -> None:
        self._table: dict[MessageQueue, _Entry] = {}

    async def load(self) -> None:  # noqa: B027 - a hook: only the local store has anything to load
        """Read persisted offsets (local store only)."""
        return None

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        """Record progress in memory; increase_only keeps the larger of old and new (concurrent completions)."""
        entry = self._table.get(mq)
        if entry is None:
            self._table[mq] = _Entry(offset)
        elif not increase_only or offset > entry.offset:
            entry.offset = offset

    def bind(self, lease: QueueLease, offset: int | None = None) -> None:
        """Commits of the lease's queue quote this lease's fence from now on; offset, if given, replaces
        the progress (a new lease starts where it starts)."""
        entry = self._table.get(lease.mq)
        if entry is None:
            self._table[lease.mq] = _Entry(-1 if offset is None else offset, lease)
        else:
            entry.lease = lease
            if offset is not None:
                entry.offset = offset

    def read_memory(self, mq: MessageQueue) -> int:
        entry = self._table.get(mq)
        return entry.offset if entry is not None else -1

    @abstractmethod
    async def read_offset(self, mq: MessageQueue, kind: ReadOffsetType) -> int:
        """-1 when there is no offset (a new group); READ_FROM_STORE asks the broker or the file."""

    @abstractmethod
    async def persist_all(self, mqs: Iterable[MessageQueue]) -> CommitOffsetsResult | None: ...

    @abstractmethod
    async def persist(self, mq: MessageQueue) -> None:
        """Persist one queue now (acknowledged), e.g. before releasing it."""

    def remove_offset(self, mq: MessageQueue) -> None:
        self._table.pop(mq, None)

    def generation(self, mq: MessageQueue) -> int | None:
        """The queue's reset generation as last read from the broker (None: the store has none)."""
        return None

    def commit_for(self, mq: MessageQueue) -> OffsetCommit | None:
        """The commit a piggybacked or streamed commit of mq would send now (None: nothing to send)."""
        return None

    def preload(self, mq: MessageQueue, offset: int, generation: int) -> None:  # noqa: B027 - remote only
        """The broker's committed offset and reset generation, learnt with a lock grant (remote store only)."""

    def clone_offset_table(self, topic: str | None = None) -> dict[MessageQueue, int]:
        return {mq: e.offset for mq, e in self._table.items() if topic is None or mq.topic == topic}


class RemoteBrokerOffsetStore(OffsetStore):
    def __init__(self, cluster: BrokerCluster, group: str, client_id: str, *,
                 on_rejected: Callable[[RejectedCommit], None] | None = None, require_fence: bool = False) -> None:
        super().__init__()
        # With queue locks, every commit must carry the owner epoch: an entry without one is never sent.
        self._require_fence = require_fence
        self._cluster = cluster
        self._group = group
        self._client_id = client_id
        self._on_rejected = on_rejected or (lambda r: None)
        self._generations: dict[MessageQueue, int] = {}

    def _commit(self, mq: MessageQueue, entry: _Entry) -> OffsetCommit:
        lease = entry.lease
        if lease is None:
            return OffsetCommit(self._group, mq, entry.offset, client_id=self._client_id)
        return OffsetCommit(self._group, mq, entry.offset, client_id=self._client_id,
                            owner_epoch=lease.owner_epoch, reset_generation=lease.reset_generation)

    def _sendable(self, entry: _Entry | None) -> bool:
        if entry is None or entry.offset < 0:
            return False
        return not self._require_fence or (entry.lease is not None and entry.lease.owner_epoch is not None)

    def commit_for(self, mq: MessageQueue) -> OffsetCommit | None:
        entry = self._table.get(mq)
        return self._commit(mq, entry) if self._sendable(entry) else None

    async def read_offset(self, mq: MessageQueue, kind: ReadOffsetType) -> int:
        if kind is not ReadOffsetType.READ_FROM_STORE:
            entry = self._table.get(mq)
            if entry is not None or kind is ReadOffsetType.READ_FROM_MEMORY:
                return entry.offset if entry is not None else -1
        conn = await self._cluster.connection(mq.broker_name)
        offset, generation = await conn.query_consumer_offset(self._group, mq)
        self._generations[mq] = generation
        if offset >= 0:
            self.update_offset(mq, offset, increase_only=False)
        return offset

    def generation(self, mq: MessageQueue) -> int:
        """The reset generation the broker reported with the last offset read from it."""
        return self._generations.get(mq, 0)

    def preload(self, mq: MessageQueue, offset: int, generation: int) -> None:
        """What the broker said with a lock grant, as if read_offset(READ_FROM_STORE) had asked."""
        self._generations[mq] = generation
        if offset >= 0:
            self.update_offset(mq, offset, increase_only=False)

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> CommitOffsetsResult | None:
        """Oneway-style: one CommitOffsets stream per broker; offsets of queues no longer owned are forgotten."""
        wanted = set(mqs)
        by_broker: dict[str, list[OffsetCommit]] = {}
        for mq in list(self._table):
            entry = self._table[mq]
            if mq not in wanted:
                del self._table[mq]
            elif self._sendable(entry):
                by_broker.setdefault(mq.broker_name, []).append(self._commit(mq, entry))
        if not by_broker:
            return None
        applied = rejected = 0
        rejections: list[RejectedCommit] = []
        for broker, commits in by_broker.items():
            try:
                conn = await self._cluster.connection(broker)
                result = await conn.commit_offsets(commits)
            except TidemarkError as e:
                log.warning("offset persist failed",
                            event="persist_failed", group=self._group, broker=broker, error=e)
                continue
            applied += result.applied
            rejected += result.rejected
            rejections.extend(result.rejections)
        for r in rejections:
            if r.reason is not CommitRejectReason.INVALID:
                self._on_rejected(r)
            log.warning("offset commit rejected",
                        event="commit_rejected", group=self._group, queue=r.queue, offset=r.offset,
                        reason=r.reason.value, detail=r.message)
        return CommitOffsetsResult(applied, rejected, rejections)

    async def persist(self, mq: MessageQueue) -> None:
        """Acknowledged commit of one queue (FencedError when the broker refuses it)."""
        commit = self.commit_for(mq)
        if commit is not None:
            conn = await self._cluster.connection(mq.broker_name)
            await conn.update_consumer_offset(commit)


def local_offsets_path(client_id: str, group: str) -> Path:
    root = os.environ.get(OFFSET_DIR_ENV) or str(Path.home() / ".tidemark_offsets")
    return Path(root) / client_id / group / "offsets.json"


class LocalFileOffsetStore(OffsetStore):
    """Broadcasting: each client keeps its own offsets in a local file (written atomically)."""

    def __init__(self, client_id: str, group: str) -> None:
        super().__init__()
        self.path = local_offsets_path(client_id, group)
        self._writing = asyncio.Lock()  # one write at a time: they share the temp file

    async def load(self) -> None:
        for mq, offset in self._read_file().items():
            self._table[mq] = _Entry(offset)

    def _read_file(self) -> dict[MessageQueue, int]:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("local offsets unreadable, starting without them",
                        event="local_offsets_bad", path=self.path, error=e)
            return {}
        out = {}
        for item in doc.get("offsetTable", []):
            try:
                out[MessageQueue(str(item["topic"]), str(item["brokerName"]), int(item["queueId"]))] = int(item["offset"])
            except (KeyError, TypeError, ValueError):
                log.warning("skipping malformed local offset", event="local_offset_skip", entry=item)
        return out

    async def read_offset(self, mq: MessageQueue, kind: ReadOffsetType) -> int:
        # This process is the file's only writer, so memory is never older than the file.
        if mq in self._table or kind is ReadOffsetType.READ_FROM_MEMORY:
            return self.read_memory(mq)
        offset = self._read_file().get(mq, -1)
        if offset >= 0:
            self.update_offset(mq, offset, increase_only=False)
        return offset

    def remove_offset(self, mq: MessageQueue) -> None:
        """Kept: a broadcasting client's progress outlives any one assignment (as RocketMQ's no-op)."""

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        """Write every known offset (not only mqs): the file is this client's whole progress.

        The snapshot is taken on the loop; the write and its fsyncs run in a worker thread."""
        doc = {"offsetTable": [
            {"topic": mq.topic, "brokerName": mq.broker_name, "queueId": mq.queue_id, "offset": e.offset}
            for mq, e in sorted(self._table.items()) if e.offset >= 0]}
        async with self._writing:
            await asyncio.to_thread(atomic_write, self.path, json.dumps(doc, indent=2).encode("utf-8"))
        return None

    async def persist(self, mq: MessageQueue) -> None:
        await self.persist_all(self._table.keys())
