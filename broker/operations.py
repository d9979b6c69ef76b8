"""What a client may ask of the broker, in the broker's own terms, once for every protocol.

Tidemark's v1 servicers (`services/`) and the RocketMQ 5 adapter (`services/rmq5/`) are translations:
a wire message in, one call here, the answer out. The rules both protocols need live here and nowhere
else: which topic exists and who may read or write it (`route`), where an offset query by policy lands
(`queue_offset`), how a pop receive is bounded (`receive`), what a transaction check shows the producer
(`TransactionWatch`), and the throughput metrics, counted once per stored or delivered message whatever
protocol carried it.

The adapters name the domain's types through this module (the names re-exported below), not by importing
the domain packages: tests/unit/test_import_rules.py holds them to it.

Operations reads the controller's managers at each call, not once: a promotion replaces the replication
source and the config, and the next call sees the new ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tidemark.broker.cluster.replication import decode_offsets
from tidemark.broker.delivery.fetch import (
    MAX_RECORDS_PER_READ,
    EndReason,
    FetchSession,
    Frame,
    OpenQueue,
    QueueEnded,
)
from tidemark.broker.delivery.pull import PullOutcome, PullRequest, PullStatus, check_queue
from tidemark.broker.delivery.queries import QueueStats
from tidemark.broker.errors import FailedPreconditionError, InvalidArgumentError
from tidemark.broker.ingest.send import GroupsSent, OutgoingMessage, Sent
from tidemark.broker.ingest.send_back import FIRST_RETRY_DELAY_LEVEL, SendBackResult
from tidemark.broker.membership.locks import LockInfo
from tidemark.broker.observe import traces
from tidemark.broker.observe.journey import Delivery, DeliveryLog
from tidemark.broker.offsets import Fence
from tidemark.broker.offsets.commits import (
    BatchResult,
    Commit,
    CommitTally,
    OffsetChange,
    QueueProgress,
    ResetKind,
    ResetTarget,
)
from tidemark.broker.pop.inflight import QueueInflight
from tidemark.broker.pop.service import MAX_BATCH, Received, ReceiveRequest
from tidemark.broker.producers.service import BatchSequence
from tidemark.broker.producers.table import ProducerState, QueueSequence
from tidemark.broker.store import RecordsPut, StoredMessage
from tidemark.broker.topics import TopicConfig
from tidemark.broker.transactions.service import Check, real_view
from tidemark.broker.transactions.table import Half, Outcome

if TYPE_CHECKING:
    from tidemark.broker.controller import BrokerController

__all__ = [
    "MAX_BATCH", "MAX_RECORDS_PER_READ", "Appended", "Delivery", "EndReason", "OpenQueue", "QueueEnded", "BatchResult", "BatchSequence", "Commit", "CommitTally", "Fence", "GroupsSent", "OffsetChange",
    "OffsetPolicy", "Operations", "Outcome", "OutgoingMessage", "PendingCheck", "PullOutcome", "PullRequest",
    "PullStatus", "QueueInflight", "QueueProgress", "ReceiveRequest", "Received", "ResetKind", "ResetTarget", "Route",
    "SendBackResult", "Sent", "StoredMessage", "TopicConfig", "TransactionWatch",
]


class OffsetPolicy(enum.Enum):
    """Where a queue-offset query lands: the first stored offset, the end, or the first stored at or
    after a time (Kafka's earliest/latest/offsetsForTimes, RocketMQ's min/max/searchOffset)."""

    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"


@dataclass(frozen=True, slots=True)
class Route:
    """A topic as a client routes to it on this broker: its queues, and whether each side is open (the
    topic's permission and the broker's: a replica or a fenced master is not writable)."""

    topic: TopicConfig
    readable: bool
    writable: bool

    def queue_readable(self, queue_id: int) -> bool:
        return self.readable and queue_id < self.topic.read_queue_nums

    def queue_writable(self, queue_id: int) -> bool:
        return self.writable and queue_id < self.topic.write_queue_nums

    @property
    def queue_count(self) -> int:
        return max(self.topic.read_queue_nums, self.topic.write_queue_nums)


@dataclass(frozen=True, slots=True)
class Appended:
    """A record batch stored (or recognised as a duplicate); `durable`, when set, waits until it is as
    safe as the configuration promises (fsynced, on a replica) and must finish before the batch is
    acknowledged."""

    put: RecordsPut
    durable: Callable[[], Awaitable[None]] | None


@dataclass(frozen=True, slots=True)
class PendingCheck:
    """A transaction check as the producer is asked it: the half message shown as it was sent."""

    msg_id: str
    half_offset: int
    message: StoredMessage


class TransactionWatch:
    """A producer's subscription to the checks of its open transactions on some topics."""

    def __init__(self, operations: Operations, group: str, client_id: str, topics: frozenset[str]) -> None:
        self._transactions = operations.broker.transactions
        self._group = group
        self._queue: asyncio.Queue[Check] = self._transactions.watch(group, client_id, topics)

    async def get(self) -> PendingCheck:
        check = await self._queue.get()
        return PendingCheck(check.msg_id, check.half_offset, real_view(check.message))

    def close(self) -> None:
        self._transactions.unwatch(self._group, self._queue)


class Operations:
    def __init__(self, broker: BrokerController) -> None:
        self.broker = broker
        self.deliveries = DeliveryLog()  # what was handed to which client: the journeys' delivered steps

    # ---- topics ---------------------------------------------------------------------------------------

    def require_topic(self, name: str) -> TopicConfig:
        """The topic, or TopicNotFoundError (InvalidArgumentError for a name no topic may have)."""
        return self.broker.topics.require(name)

    def route(self, name: str) -> Route:
        b = self.broker
        topic = b.topics.require(name)
        return Route(topic, readable=topic.readable and b.permission.readable,
                     writable=topic.writable and b.permission.writable)

    # ---- sending --------------------------------------------------------------------------------------

    async def send(self, topic: str, queue_id: int | None, messages: Sequence[OutgoingMessage], *,
                   queue_key: str = "") -> list[Sent]:
        """Store messages in one queue (SendService.send says which) and count them."""
        b = self.broker
        started = time.perf_counter()
        begun = time.time_ns() if traces.ENABLED else 0
        sent = await b.sender.send(topic, queue_id, messages, queue_key=queue_key)
        if traces.ENABLED:
            traces.stored_messages(topic, [(m.properties, s.queue_id, s.put.queue_offset, s.msg_id)
                                           for m, s in zip(messages, sent, strict=False)], begun, time.time_ns())
        metrics = b.metrics
        metrics.send_latency.observe(time.perf_counter() - started)
        metrics.stored(topic, len(sent), sum(s.put.store_size for s in sent))
        return sent

    async def send_groups(self, topic: str, groups: Sequence[tuple[str, Sequence[OutgoingMessage]]]) -> GroupsSent:
        """Store several message groups' messages, each in its group's queue, all or nothing as far as any
        check can tell (SendService.send_groups says what a failing store write leaves), and count them."""
        b = self.broker
        started = time.perf_counter()
        begun = time.time_ns() if traces.ENABLED else 0
        result = await b.sender.send_groups(topic, groups)
        if traces.ENABLED:
            traces.stored_messages(topic, [(m.properties, s.queue_id, s.put.queue_offset, s.msg_id)
                                           for (_, messages), sent in zip(groups, result.sent, strict=False)
                                           for m, s in zip(messages, sent, strict=False)], begun, time.time_ns())
        metrics = b.metrics
        metrics.send_latency.observe(time.perf_counter() - started)
        stored = [s for group in result.sent for s in group]
        metrics.stored(topic, len(stored), sum(s.put.store_size for s in stored))
        return result

    def append(self, topic: str, queue_id: int, records: bytes, count: int,
               sequence: BatchSequence | None) -> Appended:
        """Store a producer's record batch as its bytes came (SendService.append_records). Whether it may
        be acknowledged at once or only after `durable()` is the configuration's: a sync flush, sync
        replication, or a topic this batch created that is not on disk yet."""
        b = self.broker
        started = time.perf_counter()
        begun = time.time_ns() if traces.ENABLED else 0
        put = b.sender.append_records(topic, queue_id, records, count, sequence)
        if traces.ENABLED and not put.duplicate:
            traces.stored_records(topic, queue_id, records, count, put.first_offset, put.msg_ids, begun, time.time_ns())
        metrics = b.metrics
        if put.duplicate:
            metrics.duplicate_batches.inc()
        else:
            metrics.stored(topic, count, len(records))  # bytes as they came, as stored
        if b.sender.acknowledges_at_once and not b.configs_dirty:
            metrics.send_latency.observe(time.perf_counter() - started)
            return Appended(put, None)

        async def durable() -> None:
            await b.flush_configs()  # a topic created by this batch is on disk before the answer
            await b.sender.wait_durable(put)
            metrics.send_latency.observe(time.perf_counter() - started)

        return Appended(put, durable)

    def init_producer(self, key: str, topic: str) -> int:
        """A producer id for an idempotent producer; only a writable broker gives one out."""
        b = self.broker
        b.permission.check_writable()
        return b.producers.allocate(key, topic)

    async def end_transaction(self, group: str, msg_id: str, half_offset: int, outcome: Outcome, *,
                              from_check: bool, topic: str) -> bool:
        """Commit or roll back a half message; False when it had ended already."""
        return await self.broker.transactions.end(group, msg_id, half_offset, outcome,
                                                  by="check" if from_check else "producer", topic=topic)

    def open_transactions(self, group: str = "") -> list[Half]:
        """Half messages not yet committed or rolled back (of one producer group, if given), oldest first."""
        return self.broker.transactions.halves(group)

    def idempotent_producers(self, topic: str = "") -> list[tuple[ProducerState, list[tuple[tuple[str, int],
                                                                                         QueueSequence]]]]:
        """Each idempotent producer the broker remembers, with its sequence per queue (of `topic`, if given)."""
        return self.broker.producers.producers(topic)

    def watch_transactions(self, group: str, client_id: str, topics: Iterable[str]) -> TransactionWatch:
        return TransactionWatch(self, group, client_id, frozenset(topics))

    # ---- reading by queue offset ----------------------------------------------------------------------

    async def pull(self, request: PullRequest) -> PullOutcome:
        b = self.broker
        started = time.perf_counter()
        outcome = await b.puller.pull(request)
        metrics = b.metrics
        metrics.pull_latency.labels(outcome.status.value).observe(time.perf_counter() - started)
        self._delivered(request.topic, request.group, outcome.messages)
        if outcome.messages:
            self.deliveries.record(request.topic, request.queue_id, request.group,
                                   request.fence.client_id if request.fence else "", outcome.messages[0].queue_offset,
                                   outcome.messages[-1].queue_offset + 1, b.clock_ms())
        if request.commit_offset is not None:
            metrics.offset_commits.labels("pull").inc()
        return outcome

    def open_fetch(self) -> FetchSession:
        """A fetch stream's session (broker/delivery/fetch.py); end it with `close_fetch`."""
        self.broker.metrics.fetch_streams.inc()
        return self.broker.fetch_session()

    def fetched(self, frame: Frame) -> None:
        """Count a frame a fetch stream is about to send."""
        metrics = self.broker.metrics
        now = size = 0
        for part in frame.records:
            size += len(part.data)
            if part.count:
                metrics.served(part.topic, part.group, part.count, len(part.data))
                now = now or self.broker.clock_ms()
                self.deliveries.record(part.topic, part.queue_id, part.group, part.client_id, part.first_offset,
                                       part.next_offset, now)
        metrics.fetch_frames.inc()
        if size:
            self.broker.trimmer.answered(size)

    def close_fetch(self, session: FetchSession) -> None:
        self.broker.metrics.fetch_streams.dec()
        session.close()

    def deliveries_of(self, topic: str, queue_id: int, offset: int) -> list[Delivery]:
        """The recent deliveries of a queue that covered `offset` (broker/observe/journey.py)."""
        check_queue(self.broker.topics.require(topic), queue_id)
        if offset < 0:
            raise InvalidArgumentError(f"queue offset must be >= 0, got {offset}")
        return self.deliveries.of(topic, queue_id, offset)

    def topic_stats(self, topic: str) -> list[QueueStats]:
        """Each queue's offsets and last store time."""
        return self.broker.queries.topic_stats(topic)

    async def messages_by_id(self, msg_id: str, topic: str) -> list[StoredMessage]:
        """The message with this id and its copies (retries, the DLQ, a delayed message's delivery): a
        delayed copy is looked for as far after the original as the longest delay level."""
        b = self.broker
        return await b.queries.by_msg_id(msg_id, topic, later_ms=max(b.config.delay_levels_ms, default=0))

    def message_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage:
        return self.broker.queries.message_at(topic, queue_id, offset)

    def messages_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int, max_num: int) -> list[StoredMessage]:
        """Messages of a topic carrying `key`, stored between the times (an end of 0: now)."""
        b = self.broker
        return b.queries.by_key(topic, key, begin_ms, end_ms or b.clock_ms(), max_num)

    def redelivery_delays_ms(self) -> list[int]:
        """The waits before a consumer's failed message comes again, in order: the delay levels from
        FIRST_RETRY_DELAY_LEVEL (10 s) on, as a send-back schedules them (the last level, if none)."""
        levels = self.broker.config.delay_levels_ms
        return list(levels[FIRST_RETRY_DELAY_LEVEL - 1:] or levels[-1:])

    async def send_back(self, *, group: str, commit_log_offset: int, msg_id: str, delay_level: int,
                        max_reconsume_times: int, may_read: Callable[[str], None]) -> SendBackResult:
        """A consumed message back to its group's retry topic, or to the DLQ (broker/ingest/send_back.py)."""
        b = self.broker
        result = await b.send_back.send_back(group=group, commit_log_offset=commit_log_offset, msg_id=msg_id,
                                             delay_level=delay_level, max_reconsume_times=max_reconsume_times,
                                             may_read=may_read)
        (b.metrics.dlq if result.to_dlq else b.metrics.retries).labels(group).inc()
        return result

    # ---- reading by pop -------------------------------------------------------------------------------

    @property
    def renew_slice_ms(self) -> int:
        """The invisible time of a delivery the broker renews for a live client (auto_renew)."""
        return self.broker.pop.ledger.settings.renew_slice_ms

    async def receive(self, request: ReceiveRequest) -> list[Received]:
        """Pop up to request.batch messages; a batch asked larger than the broker hands out at once
        (MAX_BATCH) is served as MAX_BATCH, as RocketMQ's proxy does."""
        if request.batch > MAX_BATCH:
            request = dataclasses.replace(request, batch=MAX_BATCH)
        received = await self.broker.pop.receive(request)
        self._delivered(request.topic, request.group, [item.message for item in received])
        if received:
            now = self.broker.clock_ms()
            for item in received:  # a pop delivery is one message (retries come from %RETRY% queues too)
                m = item.message
                self.deliveries.record(m.topic, m.queue_id, request.group, request.client_id, m.queue_offset,
                                       m.queue_offset + 1, now)
        return received

    def ack(self, group: str, topic: str, receipt_handle: str) -> None:
        self.broker.pop.ack(group, topic, receipt_handle)

    def change_invisible(self, group: str, topic: str, receipt_handle: str, invisible_ms: int) -> str:
        """Hide a delivery again for invisible_ms from now; its new receipt handle."""
        return self.broker.pop.change_invisible(group, topic, receipt_handle, invisible_ms)

    async def dead_letter(self, group: str, topic: str, receipt_handle: str) -> None:
        await self.broker.pop.dead_letter(group, topic, receipt_handle)

    # ---- offsets --------------------------------------------------------------------------------------

    async def commit(self, commit: Commit) -> None:
        """One acknowledged commit: stored (and replicated, under sync replication) before it returns."""
        b = self.broker
        try:
            await b.commits.commit_acknowledged(commit)
        except FailedPreconditionError as e:  # fenced, or made before a reset it did not see
            b.metrics.offset_commits_rejected.labels(type(e).__name__).inc()
            raise
        b.metrics.offset_commits.labels("unary").inc()

    async def commit_batch(self, commits: Iterable[Commit]) -> BatchResult:
        """Oneway-style commits: each applies or is rejected alone."""
        b = self.broker
        result = await b.commits.commit_batch(commits)
        b.metrics.offset_commits.labels("stream").inc(result.applied)
        for r in result.rejections:
            b.metrics.offset_commits_rejected.labels(r.reason.value).inc()
        return result

    def groups_of_topic(self, topic: str) -> list[str]:
        """The groups holding offsets of a topic the broker has."""
        b = self.broker
        b.topics.require(topic)
        return b.offsets.groups_of_topic(topic)

    def topics_of_group(self, group: str) -> list[str]:
        return self.broker.offsets.topics_of_group(group)

    def pop_inflight(self, group: str) -> list[QueueInflight]:
        """A pop group's deliveries under way on each queue it popped from (none for a group that never
        popped): how many, since when, until when invisible, how many came more than once."""
        return self.broker.pop.inflight(group)

    def queue_locks(self, group: str) -> list[LockInfo]:
        """The orderly-consumption locks a group's members hold now (expired ones left out)."""
        return [lock for lock in self.broker.locks.locks(group) if lock.live]

    def committed(self, group: str, topic: str, queue_id: int) -> tuple[int, int]:
        """A group's committed offset of a queue (-1: none) and the queue's reset generation."""
        return self.broker.commits.query(group, topic, queue_id)

    def queue_offset(self, topic: str, queue_id: int, policy: OffsetPolicy, timestamp_ms: int = 0) -> int:
        """A queue's offset by policy, for a queue the topic has."""
        b = self.broker
        check_queue(b.topics.require(topic), queue_id)
        store = b.store
        if policy is OffsetPolicy.EARLIEST:
            return store.min_offset(topic, queue_id)
        if policy is OffsetPolicy.LATEST:
            return store.readable_max_offset(topic, queue_id)
        if timestamp_ms < 0:
            raise InvalidArgumentError(f"timestamp must be >= 0, got {timestamp_ms}")
        return store.search_offset_by_timestamp(topic, queue_id, timestamp_ms)

    async def reset_offsets(self, group: str, topic: str, queue_id: int | None, target: ResetTarget, *,
                            dry_run: bool) -> list[OffsetChange]:
        return await self.broker.commits.reset(group, topic, queue_id, target, dry_run=dry_run)

    def progress(self, group: str, topic: str | None) -> list[QueueProgress]:
        return self.broker.commits.progress(group, topic)

    def delete_offsets(self, group: str, topic: str, *, dry_run: bool) -> list[OffsetChange]:
        """Forget a group's offsets of a topic; refused while a live member subscribes to it."""
        b = self.broker
        return b.commits.delete_offsets(group, topic, subscribers=b.consumers.subscribers(group, topic),
                                        dry_run=dry_run)

    async def clone_offsets(self, src_group: str, dest_group: str, topic: str, *,
                            dry_run: bool) -> list[OffsetChange]:
        return await self.broker.commits.clone_offsets(src_group, dest_group, topic, dry_run=dry_run)

    def take_back_offsets(self, offsets_json: bytes) -> int:
        """Offsets a replica's consumers committed while the master was away (the replica's offset table,
        as replication encodes it), taken where they are ahead; how many moved."""
        offsets = decode_offsets(offsets_json)
        return self.broker.commits.take_back(offsets.table, offsets.reset_generations)

    def replica_metadata(self):
        """What a replica copies besides the log: topics, groups, offsets, delay and pop progress, queue locks."""
        b = self.broker
        metadata = b.replication.metadata(b.topics, b.groups, b.offsets, b.schedule, b.pop)
        metadata.queue_locks_json = b.lock_file.encoded()
        return metadata

    # ---- storage --------------------------------------------------------------------------------------

    def delete_expired_segments(self) -> int:
        """Commit-log segments deleted now (an operator's request, not the retention timer's)."""
        return self.broker.store.delete_expired_segments(force=True)

    # ---- counting ------------------------------------------------------------------------------------

    def _delivered(self, topic: str, group: str, messages: Sequence[StoredMessage]) -> None:
        if messages:
            self.broker.metrics.served(topic, group, len(messages), sum(m.store_size for m in messages))
