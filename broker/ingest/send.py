"""SendService: validates producer messages and puts them in the store (RocketMQ's SendMessageProcessor).

Picks the queue (given, or round-robin over the topic's write queues), fills in
TAGS/KEYS/UNIQ_KEY properties, and routes messages with a delay level or a
delivery time (deliver_at_ms, at most MAX_DELIVERY_DELAY_MS ahead) to the
schedule topic.
"""

from __future__ import annotations

import asyncio
import functools
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from tidemark.broker.cluster.permission import BrokerPermission
from tidemark.broker.config import BrokerConfig, FlushDiskType
from tidemark.broker.errors import (
    BrokerError,
    DeliveryTimeError,
    InvalidArgumentError,
    PermissionDeniedError,
    TopicNotFoundError,
)
from tidemark.broker.ingest.delays import ScheduleMessageService
from tidemark.broker.ingest.steering import check_no_steering, delay_from_property
from tidemark.broker.producers.service import BatchSequence, IdempotenceService
from tidemark.broker.producers.table import Verdict
from tidemark.broker.store import MessageRecord, MessageStore, PutResult, RecordsPut
from tidemark.broker.topics import TopicConfig, TopicConfigManager
from tidemark.broker.transactions.service import TransactionService
from tidemark.common.protocol import (
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    MessageIdGenerator,
    PropertyKey,
    dlq_topic,
    is_broker_topic,
    is_retry_topic,
    is_system_topic,
    tag_hash,
)
from tidemark.common.records import first_msg_id

# How far ahead a delivery time may be (RocketMQ 5 proxy's maxDelayTimeMills: one day).
MAX_DELIVERY_DELAY_MS = 86_400_000

# The store encodes properties with these separators (RocketMQ's NAME_VALUE / PROPERTY separators).
_RESERVED_CHARS = ("\x01", "\x02")


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """A message as a producer sent it, before the broker adds its properties."""

    body: bytes
    tags: str = ""
    keys: str = ""
    properties: Mapping[str, str] = field(default_factory=dict)
    flag: int = 0
    born_timestamp: int = 0
    delay_level: int = 0
    born_host: str = ""
    # Deliver at this epoch ms (RocketMQ 5's delivery timestamp); 0 = at once. Excludes delay_level.
    deliver_at_ms: int = 0


class SyncReplication(Protocol):
    """What a send needs of sync replication (broker/cluster/replication.py's ReplicationSource)."""

    def check_in_sync(self) -> None:
        """Refuse (NotEnoughReplicasError) before anything is stored while fewer than min_sync_replicas
        replicas are in sync."""

    async def wait_replicated(self, end: int) -> None:
        """Until min_sync_replicas replicas hold the commit log up to `end`; an unknown outcome
        (ReplicationTimeoutError) after the timeout."""


@dataclass(frozen=True, slots=True)
class Sent:
    msg_id: str
    queue_id: int
    put: PutResult


@dataclass(frozen=True, slots=True)
class GroupsSent:
    """send_groups' outcome: what each stored group got, in the order given (all of them, unless a failing
    store write stopped the appends part way: then `error` says why the groups after them are not stored)."""

    sent: list[list[Sent]]
    error: BrokerError | None = None


@dataclass(frozen=True, slots=True)
class _Put:
    """One queue's checked records, routed (the DLQ, a delay's schedule topic), ready to append."""

    queue_id: int
    records: list[MessageRecord]
    ids: list[str]
    dlq: str | None
    half: bool = False


class SendService:
    def __init__(self, *, config: BrokerConfig, store: MessageStore, topics: TopicConfigManager,
                 permission: BrokerPermission, schedule: ScheduleMessageService,
                 ids: MessageIdGenerator, clock_ms, producers: IdempotenceService,
                 transactions: TransactionService,
                 sync_replication: SyncReplication | None = None) -> None:
        self._config = config
        self._producers = producers
        self._transactions = transactions
        # Sync replication: a send is refused before it is stored while no replica is in sync, and answered
        # once a replica has it (broker/cluster/replication.py); set again when a replica is promoted.
        self.sync_replication = sync_replication
        self._store = store
        self._topics = topics
        self._permission = permission
        self._schedule = schedule
        self._ids = ids
        self._clock_ms = clock_ms
        self._next_queue: dict[str, int] = {}
        self._durable_waits = 0  # sends waiting for the disk or a replica (wait_durable)
        self._settled: asyncio.Event | None = None  # set when that falls to 0 while a stop waits (settled)

    def _resolve_topic(self, name: str) -> tuple[TopicConfig, bool]:
        """The topic to send to, and whether it is still to be created (where the broker allows it): nothing
        is created here, so a send refused by a later check leaves no topic behind."""
        if is_broker_topic(name):
            # Only the broker writes there (RocketMQ's TopicValidator): the schedule and transaction services
            # re-put whatever REAL_TOPIC a message names, past that topic's own checks and permissions.
            kind, instead = (("schedule", "set a delay level") if name == SCHEDULE_TOPIC
                             else ("transaction", "send a transactional message"))
            raise PermissionDeniedError(f"sending to the broker's {kind} topic {name!r} is forbidden; {instead} "
                                        f"instead")
        topic = self._topics.get(name)
        if topic is not None:
            return topic, False
        if is_retry_topic(name):
            # A consumer's fallback send to its retry topic creates it, as RocketMQ does.
            return self._topics.plan(name, self._config.retry_queue_nums, system=True), True
        if self._config.auto_create_topic and not is_system_topic(name):
            return self._topics.plan(name, self._config.default_topic_queue_nums), True
        self._topics.require(name)  # InvalidArgumentError for a bad name, else TopicNotFoundError
        raise TopicNotFoundError(f"topic {name!r} does not exist on this broker")

    def _create(self, topic: TopicConfig) -> TopicConfig:
        return self._topics.create(topic.name, topic.queue_nums, system=topic.system)

    async def send(self, topic_name: str, queue_id: int | None, messages: Sequence[OutgoingMessage], *,
                   queue_key: str = "") -> list[Sent]:
        """Store the messages in one queue: `queue_id`, else the queue of `queue_key` (the same key, the
        same queue, for as long as the topic's write queues stay: RocketMQ 5's message group), else the
        next queue round robin."""
        if not messages:
            raise InvalidArgumentError("a send needs at least one message (empty batch)")
        now = self._clock_ms()
        levels = len(self._config.delay_levels_ms)
        messages = [delay_from_property(m, now, levels) for m in messages]
        topic, new = self._resolve_topic(topic_name)  # created once the whole request passed its checks
        queue_id, records, ids = self._checked(topic, queue_id, messages, queue_key, now)
        delay_level, deliver_at = messages[0].delay_level, messages[0].deliver_at_ms
        if not self._transactions.is_half(records[0].properties):
            return await self._store_records(topic, new, queue_id, records, ids, delay_level, deliver_at, now)
        if len(records) > 1 or delay_level or deliver_at or is_retry_topic(topic.name):
            raise InvalidArgumentError("a transactional message goes alone, without a delay, to a user topic")
        records = [self._transactions.half_record(records[0])]
        again = self._transactions.stored_half(records[0])
        if again is None:
            return await self._store_records(topic, new, queue_id, records, ids, 0, 0, now, half=True)
        # A retry of a half send whose answer was lost: answered with the half it holds, once that is as
        # durable as its own answer would have been (its first send may still wait for an fsync).
        await self._durable(again.commit_log_offset + again.store_size)
        real_queue = int(again.properties.get(PropertyKey.REAL_QID, queue_id))  # where the first went
        return [Sent(ids[0], real_queue, PutResult(again.queue_offset, again.commit_log_offset,
                                                   again.store_timestamp, again.store_size))]

    async def send_groups(self, topic_name: str, groups: Sequence[tuple[str, Sequence[OutgoingMessage]]]) -> GroupsSent:
        """Store several message groups' messages, each group in its own queue (send's `queue_key`), all or
        nothing as far as any check can tell: every group passes every check (topic, permissions, each
        message, the batch rules, in-sync replicas) before the first is stored, and then all are appended
        in one step of the event loop, nothing in between. Only a write the store itself fails can stop
        the appends part way: the groups stored by then are answered, with the error that stopped the
        rest (none stored: the error is raised). Waits until the stored ones are durable."""
        if not groups or any(not messages for _, messages in groups):
            raise InvalidArgumentError("a send needs at least one message in each message group")
        now = self._clock_ms()
        levels = len(self._config.delay_levels_ms)
        groups = [(key, [delay_from_property(m, now, levels) for m in messages]) for key, messages in groups]
        topic, new = self._resolve_topic(topic_name)
        puts = []
        for key, messages in groups:
            queue_id, records, ids = self._checked(topic, None, messages, key, now)
            if any(self._transactions.is_half(r.properties) for r in records):
                raise InvalidArgumentError("a transactional message goes alone, not with other message groups")
            puts.append(self._routed(topic.name, queue_id, records, ids, messages[0].delay_level,
                                     messages[0].deliver_at_ms, now))
        self._check_in_sync()
        sent: list[list[Sent]] = []
        error = None
        for put in puts:  # no await in this loop: nothing else runs between the appends
            try:
                results = self._append_now(topic, new and not sent, put)
            except BrokerError as e:
                if not sent:
                    raise
                error = e
                break
            sent.append([Sent(msg_id, put.queue_id, r) for msg_id, r in zip(put.ids, results, strict=True)])
        await self._durable(max(s.put.commit_log_offset + s.put.store_size for group in sent for s in group))
        return GroupsSent(sent, error)

    def _checked(self, topic: TopicConfig, queue_id: int | None, messages: Sequence[OutgoingMessage],
                 queue_key: str, now: int) -> tuple[int, list[MessageRecord], list[str]]:
        """The queue and the records of one send, every check passed; nothing stored or created."""
        self._permission.check_writable()
        if not topic.writable:
            raise PermissionDeniedError(f"topic {topic.name!r} is not writable")
        if queue_id is None:
            queue_id = zlib.crc32(queue_key.encode()) % topic.write_queue_nums if queue_key else self._pick_queue(topic)
        elif not 0 <= queue_id < topic.write_queue_nums:
            raise InvalidArgumentError(
                f"queue id {queue_id} is out of range for topic {topic.name!r} "
                f"(write queues 0..{topic.write_queue_nums - 1})")
        if len(messages) > 1 and any(m.delay_level or m.deliver_at_ms for m in messages):
            raise InvalidArgumentError("delayed messages (delay level or delivery time) cannot be sent in a batch")
        records, ids = [], []
        for index, message in enumerate(messages):
            record, msg_id = self._record(topic.name, queue_id, message, now, index if len(messages) > 1 else None)
            records.append(record)
            ids.append(msg_id)
        return queue_id, records, ids

    async def _store_records(self, topic: TopicConfig, new: bool, queue_id: int, records: list[MessageRecord],
                             ids: list[str], delay_level: int, deliver_at: int, now: int, *,
                             half: bool = False) -> list[Sent]:
        """The checked records of one send, stored (retry and DLQ routing, delays, a half's registration)."""
        put = self._routed(topic.name, queue_id, records, ids, delay_level, deliver_at, now, half=half)
        self._check_in_sync()
        results = self._append_now(topic, new, put)
        await self._durable(results[-1].commit_log_offset + results[-1].store_size)
        return [Sent(msg_id, queue_id, r) for msg_id, r in zip(ids, results, strict=True)]

    def _routed(self, topic_name: str, queue_id: int, records: list[MessageRecord], ids: list[str],
                delay_level: int, deliver_at: int, now: int, *, half: bool = False) -> _Put:
        """Where checked records go: a retry topic's to the DLQ past their reconsume limit, a delayed one to
        the schedule topic."""
        dlq = None
        if is_retry_topic(topic_name):
            records, dlq = self._retry_or_dlq(topic_name, records)
            if dlq is not None:
                delay_level = deliver_at = 0
        if delay_level > 0:
            records = [self._schedule.to_schedule_record(records[0], delay_level, now)]
        elif deliver_at > 0:
            records = [self._schedule.schedule_at(records[0], deliver_at, now)]
        return _Put(queue_id, records, ids, dlq, half)

    def _append_now(self, topic: TopicConfig, new: bool, put: _Put) -> list[PutResult]:
        """Append routed records (no wait for durability), creating the topics they need first."""
        if new:  # every check passed: only now the topics the send goes to come into being
            self._create(topic)
        if put.dlq is not None:
            self._topics.ensure_system_topic(put.dlq, 1)
        results = self._store.put_messages_now(put.records)
        if put.half:
            # Open from the moment it is in the log, before any wait: a retry that comes while this send
            # waits for its fsync (or after its caller went away, a reset) finds it and is not stored again,
            # which a check would later commit as a second copy (fault run: kill, seed 8017).
            self._transactions.added(results[0].queue_offset, put.records[0], results[0].store_timestamp)
        return results

    async def _durable(self, end: int) -> None:
        await self._store.wait_durable(end)
        if self.sync_replication is not None:
            await self.sync_replication.wait_replicated(end)

    def append_records(self, topic_name: str, queue_id: int, data: bytes, count: int,
                       sequence: BatchSequence | None = None) -> RecordsPut:
        """Store a producer's record batch (tidemark.common.records) in one queue, as its bytes came.

        The fast path: no per-message objects. Delayed, retry and DLQ messages
        go through send() (the broker rewrites them); system topics are refused here.
        With a `sequence` (an idempotent producer's batch) a batch already stored is
        not stored again: the answer is `duplicate`, with the original first offset
        when the broker still remembers it (-1 otherwise).
        """
        if is_system_topic(topic_name):
            raise InvalidArgumentError(
                f"record batches go to user topics; {topic_name!r} is a system topic (use SendMessage)")
        topic, new = self._resolve_topic(topic_name)
        self._permission.check_writable()
        if not topic.writable:
            raise PermissionDeniedError(f"topic {topic.name!r} is not writable")
        if not 0 <= queue_id < topic.write_queue_nums:
            raise InvalidArgumentError(
                f"queue id {queue_id} is out of range for topic {topic.name!r} "
                f"(write queues 0..{topic.write_queue_nums - 1})")
        if sequence is not None:
            decision = self._producers.check(sequence, topic.name, queue_id, count,
                                             functools.partial(first_msg_id, data))  # (read if a duplicate)
            if decision.verdict is Verdict.DUPLICATE:
                # Stored before (its first answer may have been an unknown outcome): answered, never refused.
                return RecordsPut(decision.first_offset, [], 0, self._store.commit_log_max_offset, duplicate=True)
        self._check_in_sync()
        # (a delay level, a delivery time or a transaction's half: SendMessage's, steering.py)
        vet = functools.partial(check_no_steering, data, count, now_ms=self._clock_ms())
        if new:  # an auto-created topic comes into being only for a batch that passed every check
            vet(self._store.check_batch(topic.name, data, count))
            topic = self._create(topic)
        if sequence is None:
            return self._store.append_records(topic.name, queue_id, data, count, vet=vet)
        return self._producers.append(
            sequence, topic.name, queue_id, count,
            lambda journal: self._store.append_records(topic.name, queue_id, data, count, vet=vet,
                                                       before_write=journal))

    def _check_in_sync(self) -> None:
        """Sync replication stores or refuses a send, never both: refused here, before anything is stored."""
        if self.sync_replication is not None:
            self.sync_replication.check_in_sync()

    @property
    def acknowledges_at_once(self) -> bool:
        """Whether a stored batch may be answered before anything more (no fsync, no replica to wait for)."""
        return self._config.flush is not FlushDiskType.SYNC and self.sync_replication is None

    async def wait_durable(self, put: RecordsPut) -> None:
        """Until the batch is as safe as the config promises: fsynced (sync flush), on a replica (sync
        replication; ReplicationTimeoutError, an unknown outcome, when none acknowledges in time)."""
        self._durable_waits += 1
        try:
            await self._store.wait_durable(put.end)
            if self.sync_replication is not None:
                await self.sync_replication.wait_replicated(put.end)
        finally:
            self._durable_waits -= 1
            if not self._durable_waits and self._settled is not None:
                self._settled.set()

    async def settled(self) -> None:
        """Until no send waits for its durability (a stop answers those first); the caller bounds it."""
        self._settled = asyncio.Event()
        try:
            while self._durable_waits:
                self._settled.clear()
                await self._settled.wait()
        finally:
            self._settled = None

    def _retry_or_dlq(self, retry: str, records: list[MessageRecord]) -> tuple[list[MessageRecord], str | None]:
        """A consumer's direct send to its retry topic (the send-back fallback), as RocketMQ's
        handleRetryAndDLQ: reconsume times come from RECONSUME_TIME; past MAX_RECONSUME_TIMES the
        message goes to the group's DLQ instead (then it is not delayed, and the DLQ's name is returned:
        the caller creates it once the whole send passed its checks)."""
        out, dead = [], None
        for record in records:
            props = record.properties
            try:
                reconsume = int(props.get(PropertyKey.RECONSUME_TIME, record.reconsume_times))
                limit = int(props.get(PropertyKey.MAX_RECONSUME_TIMES, self._config.max_reconsume_times))
            except ValueError:
                raise InvalidArgumentError("RECONSUME_TIME and MAX_RECONSUME_TIMES must be integers") from None
            record = replace(record, reconsume_times=reconsume)
            if reconsume > limit:
                dead = dlq_topic(retry[len(RETRY_GROUP_TOPIC_PREFIX):])
                record = replace(record, topic=dead, queue_id=0)
            out.append(record)
        return out, dead

    def _check_deliver_at(self, where: str, m: OutgoingMessage, now: int) -> None:
        deliver_at = m.deliver_at_ms
        if not deliver_at:
            return
        if isinstance(deliver_at, bool) or not isinstance(deliver_at, int) or deliver_at < 0:
            raise DeliveryTimeError(f"{where}: delivery time {deliver_at!r} must be epoch milliseconds >= 0")
        if m.delay_level:
            raise InvalidArgumentError(
                f"{where}: a delay level and a delivery time exclude each other (got level {m.delay_level} "
                f"and delivery time {deliver_at})")
        if deliver_at - now > MAX_DELIVERY_DELAY_MS:
            raise DeliveryTimeError(
                f"{where}: delivery time {deliver_at} is too far ahead: {deliver_at - now} ms from now, "
                f"at most {MAX_DELIVERY_DELAY_MS} ms allowed")
        if deliver_at > now and not any(ms > 0 for ms in self._config.delay_levels_ms):
            raise DeliveryTimeError(f"{where}: delivery times need a delay level longer than 0 ms")

    def _pick_queue(self, topic: TopicConfig) -> int:
        n = self._next_queue.get(topic.name, 0)
        self._next_queue[topic.name] = n + 1
        return n % topic.write_queue_nums

    def _record(self, topic: str, queue_id: int, m: OutgoingMessage, now: int,
                index: int | None) -> tuple[MessageRecord, str]:
        where = f"message {index} of the batch" if index is not None else "message"
        if not isinstance(m.body, bytes | bytearray):
            raise InvalidArgumentError(f"{where}: body must be bytes")
        if not 0 <= m.delay_level <= len(self._config.delay_levels_ms):
            raise InvalidArgumentError(
                f"{where}: delay level {m.delay_level} is out of range 0..{len(self._config.delay_levels_ms)}")
        self._check_deliver_at(where, m, now)
        properties = dict(m.properties)
        for key, value in properties.items():
            if not key or any(c in key or c in value for c in _RESERVED_CHARS):
                raise InvalidArgumentError(f"{where}: property {key!r} is empty or contains control characters \\x01/\\x02")
        for name, value in (("tags", m.tags), ("keys", m.keys)):
            if any(c in value for c in _RESERVED_CHARS):
                raise InvalidArgumentError(f"{where}: {name} contain control characters \\x01/\\x02")
        if "||" in m.tags:
            raise InvalidArgumentError(f"{where}: tag {m.tags!r} must not contain '||'")
        if m.tags:
            properties[PropertyKey.TAGS] = m.tags
        if m.keys:
            properties[PropertyKey.KEYS] = m.keys
        msg_id = properties.get(PropertyKey.UNIQ_KEY) or self._ids.next()
        properties[PropertyKey.UNIQ_KEY] = msg_id
        size = len(m.body) + sum(len(k) + len(v) + 2 for k, v in properties.items())
        if size > self._config.max_message_size:
            raise InvalidArgumentError(
                f"{where} is {size} bytes (body + properties); max_message_size is {self._config.max_message_size}")
        record = MessageRecord(
            topic=topic,
            queue_id=queue_id,
            body=bytes(m.body),
            properties=properties,
            tags_code=tag_hash(m.tags),
            flag=m.flag,
            born_timestamp=m.born_timestamp or now,
            born_host=m.born_host,
        )
        return record, msg_id
