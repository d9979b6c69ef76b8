"""PopService: pop consumption on the broker (RocketMQ 5's receive, ack, change of invisible time).

The ledger (ledger.py) says what is in flight; this service joins it to the
store and the offset table:

- **receive** visits the group's pop retry topic, then the topic's readable
  queues round robin, reads from each queue's cursor through the filter (tags,
  or SQL92 on the stored properties), records what it hands out (journalled
  before the answer) and parks on the long-polling service while nothing is there;
- **ack** and **change of invisible time** check the receipt handle (forged:
  bad MAC; stale: no longer the entry's current delivery) and update the ledger;
- the **watermark** (the smallest unfinished offset of a queue) is committed
  to the offset table as it moves, so `group progress`, lag and resets work for
  pop groups as for any other; an admin reset (a new reset generation) starts
  the queue's pop state over at the new offset;
- the **revive scan** copies each expired delivery to the group's pop retry
  topic `%RETRY%<group>_<topic>` with its attempt count (RocketMQ 5's name), or
  to `%DLQ%<group>` once the group's max attempts are used up, then marks it
  done: a crash between the two redelivers once (at-least-once), never loses;
- **auto-renew** (the push consumer's receive) extends the deliveries of
  clients that are still alive, up to the ledger's limit.

A new group starts at each queue's first offset, so messages sent before its
first receive are delivered (CONSUME_FROM_FIRST_OFFSET). No grpc here.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Container
from dataclasses import dataclass
from pathlib import Path

from tidemark.broker.cluster.permission import BrokerPermission
from tidemark.broker.config import BrokerConfig
from tidemark.broker.delivery.waiters import QueueWaiters
from tidemark.broker.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    InvisibleTimeError,
    PermissionDeniedError,
    StoreError,
)
from tidemark.broker.ingest.send_back import redelivery_copy
from tidemark.broker.membership.groups import SubscriptionGroupManager, check_group
from tidemark.broker.offsets import ConsumerOffsetManager
from tidemark.broker.pop.handles import (
    HandleFields,
    InvalidReceiptHandleError,
    QueueKey,
    ReceiptHandleCodec,
    StaleReceiptHandleError,
    load_or_create_secret,
)
from tidemark.broker.pop.inflight import QueueInflight, summarize
from tidemark.broker.pop.journal import STATE_FILE_NAME as STATE_FILE
from tidemark.broker.pop.journal import PopStore
from tidemark.broker.pop.ledger import Pending, PopLedger
from tidemark.broker.store import GetStatus, MessageStore, StoredMessage
from tidemark.broker.topics import TopicConfigManager
from tidemark.common.fsutil import atomic_write
from tidemark.common.logs import get_logger
from tidemark.common.protocol import (
    RETRY_GROUP_TOPIC_PREFIX,
    ExpressionType,
    MessageFilter,
    PropertyKey,
    dlq_topic,
)

log = get_logger("tidemark.broker.pop")

MIN_INVISIBLE_MS = 10_000
MAX_INVISIBLE_MS = 12 * 3600 * 1000
MAX_BATCH = 32
# Entries a receive examines per queue while looking for matching tags, and for matching properties (SQL92:
# each one decoded and evaluated).
MAX_SCAN = 2000
MAX_SCAN_PROPERTIES = 1000
# Revived deliveries per scan: a backlog is worked off over several scans, the loop stays responsive.
REVIVE_BATCH = 1000
# A FIFO receive whose first window held back messages of busy groups reads on in windows up to this size,
# and up to FIFO_MAX_SCAN entries past the cursor (each one read whole, for its message group: a few ms of
# the event loop); held messages are read once, so a receive that waits scans on from where the last stopped.
FIFO_WINDOW = 256
FIFO_MAX_SCAN = 512
# RocketMQ's property for a message's message group (RocketMQ 5's FIFO; the rmq5 adapter stores it).
MESSAGE_GROUP_PROPERTY = "__SHARDINGKEY"
# Answers kept for a repeated receive (the client retries with the same attempt id after a lost answer).
ATTEMPT_CACHE = 1024


def pop_retry_topic(group: str, topic: str) -> str:
    """Where a pop group's expired deliveries of `topic` wait for their next attempt."""
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}_{topic}"


@dataclass(frozen=True, slots=True)
class ReceiveRequest:
    group: str
    topic: str
    filter: MessageFilter  # tags, or SQL92 on the stored properties
    batch: int
    invisible_ms: int
    client_id: str
    auto_renew: bool = False
    poll_ms: int = 0
    attempt_id: str = ""


@dataclass(frozen=True, slots=True)
class Received:
    """A delivered message with its receipt handle; `attempt` counts deliveries, 1 the first."""

    message: StoredMessage
    handle: str
    attempt: int
    invisible_ms: int


class PopService:
    def __init__(self, *, config: BrokerConfig, store: MessageStore, topics: TopicConfigManager,
                 groups: SubscriptionGroupManager, offsets: ConsumerOffsetManager, hold: QueueWaiters,
                 permission: BrokerPermission, clock_ms: Callable[[], int], pop_id_floor: int,
                 holds_locks: Callable[[str], bool] = lambda group: False,
                 on_state: Callable[[str | None], None] = lambda reason: None,
                 on_moved: Callable[[str, bool], None] = lambda group, to_dlq: None) -> None:
        self._config = config
        self._store = store
        self._topics = topics
        self._groups = groups
        self._offsets = offsets
        self._hold = hold
        self._permission = permission
        self._clock_ms = clock_ms
        self._holds_locks = holds_locks
        # Persistence trouble (why the pop state cannot be written, None once it can) and each revived
        # delivery (its group, whether it went to the DLQ): for health and metrics.
        self._on_state = on_state
        self._on_moved = on_moved
        self._journal_error: str | None = None
        self._snapshot_error: str | None = None
        self._state = PopStore(Path(config.config_dir), pop_id_floor=pop_id_floor)
        self.ledger: PopLedger | None = None
        self._codec: ReceiptHandleCodec | None = None
        self._secret = b""
        self._generations: dict[QueueKey, int] = {}
        self._next_queue: collections.Counter[tuple[str, str]] = collections.Counter()
        self._attempts: collections.OrderedDict[tuple[str, str], list[Received]] = collections.OrderedDict()
        self.revived = 0
        self.dead_lettered = 0
        self._more_to_scan = False  # the last _take stopped at a scan limit with entries left (see receive)

    # ---- lifecycle -------------------------------------------------------------------------------

    def load(self) -> None:
        """Read the pop state (snapshot + journal) and the receipt-handle secret."""
        self.ledger = self._state.load()
        self.ledger.sink = self._journal
        self._secret = load_or_create_secret(Path(self._config.config_dir) / "popSecret")
        self._codec = ReceiptHandleCodec(self._secret)
        report = self._state.report
        log.info("pop state loaded", event="pop_state_loaded", source=report.source.value,
                 queues=sum(1 for _ in self.ledger.keys()), problems=len(report.problems))
        for problem in report.problems:
            log.warning("pop state: %s", problem, event="pop_state_problem")

    def _journal(self, events) -> None:
        """The ledger's sink: the events reach the journal before anything changes, or the request is
        refused (StoreError) with nothing changed, and health says why until a write works again."""
        try:
            self._state.append(events)
        except OSError as e:
            self._set_error(journal=f"the pop journal cannot be written: {e.strerror or e}")
            raise StoreError(f"pop state cannot be written ({e.strerror or e}); nothing was changed") from None
        if self._journal_error is not None:
            self._set_error(journal=None)

    def _set_error(self, **errors: str | None) -> None:
        for name, error in errors.items():
            setattr(self, f"_{name}_error", error)
        reason = self._journal_error or self._snapshot_error
        if reason:
            log.error("pop state not written: %s", reason, event="pop_state_failing")
        self._on_state(reason)

    # ---- replication --------------------------------------------------------------------------------

    def replica_state(self) -> tuple[dict, bytes]:
        """What a replica mirrors: the ledger's snapshot and the receipt-handle secret (so the handles the
        master gave out stay valid after a promotion)."""
        return self.ledger.snapshot(), self._secret

    def mirror(self, snapshot: dict, secret: bytes) -> None:
        """A replica's copy of its master's pop state, replaced whole (PopStateError when it is not one);
        written to popState.json by the next persist."""
        ledger = PopLedger.from_snapshot(snapshot, self._state.settings, pop_id_floor=self.ledger.last_pop_id)
        if len(secret) >= 16 and secret != self._secret:
            atomic_write(Path(self._config.config_dir) / "popSecret", secret, mode=0o600)
            self._secret, self._codec = secret, ReceiptHandleCodec(secret)
        ledger.sink = self._journal
        self.ledger = ledger
        self._state.mark_dirty()

    async def persist_if_dirty(self) -> None:
        if self.ledger is None or not self._state.dirty(self.ledger):
            return
        pending = self._state.begin_snapshot(self.ledger)
        try:
            await asyncio.to_thread(self._state.write_snapshot, pending)
        except OSError as e:
            self._set_error(snapshot=f"{STATE_FILE} cannot be written: {e.strerror or e}")
            return  # still dirty: the next tick tries again
        if self._snapshot_error is not None:
            self._set_error(snapshot=None)

    async def shutdown(self) -> None:
        try:
            await self.persist_if_dirty()
        finally:
            self._state.close()

    # ---- receive -------------------------------------------------------------------------------------

    async def receive(self, r: ReceiveRequest) -> list[Received]:
        """Up to r.batch messages, waiting up to r.poll_ms for the first."""
        check_group(r.group)
        if not MIN_INVISIBLE_MS <= r.invisible_ms <= MAX_INVISIBLE_MS:
            raise InvisibleTimeError(f"invisible time {r.invisible_ms} ms is outside "
                                     f"{MIN_INVISIBLE_MS}..{MAX_INVISIBLE_MS} ms")
        if not 1 <= r.batch <= MAX_BATCH:
            raise InvalidArgumentError(f"batch size {r.batch} is outside 1..{MAX_BATCH}")
        topic = self._topics.require(r.topic)
        group = self._groups.find_or_default(r.group)  # its consumers' settings created it; a receive only reads
        if not group.consume_enable:
            raise PermissionDeniedError(f"group {r.group!r} may not consume (its consume_enable is false)")
        if not (topic.readable and self._permission.readable):
            raise PermissionDeniedError(f"topic {r.topic!r} is not readable on this broker")
        if self._holds_locks(r.group):
            raise FailedPreconditionError(
                f"group {r.group!r} is consumed by queue owners (Tidemark clients holding queue locks); "
                f"pop consumers need a group of their own")
        if r.attempt_id:
            again = self._attempts.get((r.client_id, r.attempt_id))
            if again is not None and all(self._current(self._codec.decode(x.handle)) for x in again):
                return again
        deadline = self._clock_ms() + r.poll_ms
        while True:
            self._more_to_scan = False
            received = self._take(r, topic.read_queue_nums, group.consume_orderly)
            remaining = deadline - self._clock_ms()
            if received or remaining <= 0:
                break
            if self._more_to_scan:
                # A scan window of filtered entries only, and more stored after it: go on scanning (after
                # letting the loop breathe) rather than wait for a new message.
                await asyncio.sleep(0)
                continue
            # The retry topic too, even before it exists: its first message (a revived delivery) wakes us.
            retry = self._topics.get(pop_retry_topic(r.group, r.topic))
            retry_queues = retry.read_queue_nums if retry is not None else group.retry_queue_nums
            keys = [(r.topic, q) for q in range(topic.read_queue_nums)]
            keys += [(pop_retry_topic(r.group, r.topic), q) for q in range(retry_queues)]
            if not await self._hold.wait_any(keys, remaining / 1000):
                break  # the poll time is over (or the broker is stopping)
        if r.attempt_id and received:
            self._attempts[(r.client_id, r.attempt_id)] = received
            while len(self._attempts) > ATTEMPT_CACHE:
                self._attempts.popitem(last=False)
        return received

    def _take(self, r: ReceiveRequest, read_queues: int, orderly: bool) -> list[Received]:
        now = self._clock_ms()
        sources = []
        retry = self._topics.get(pop_retry_topic(r.group, r.topic))
        if retry is not None:
            sources += [(retry.name, q) for q in range(retry.read_queue_nums)]
        start = self._next_queue[(r.group, r.topic)]
        self._next_queue[(r.group, r.topic)] += 1
        sources += [(r.topic, (start + i) % read_queues) for i in range(read_queues)]
        out: list[Received] = []
        for topic, queue_id in sources:
            want = r.batch - len(out)
            if want <= 0:
                break
            out += self._take_queue(QueueKey(r.group, topic, queue_id), r, want, now, orderly)
        return out

    def _take_queue(self, key: QueueKey, r: ReceiveRequest, want: int, now: int, orderly: bool) -> list[Received]:
        ledger = self.ledger
        self._sync_reset(key)
        if orderly:
            return self._take_fifo(key, r, want, now)
        # Pending entries left by a FIFO pop (the group was orderly until now) go first, in offset order:
        # they are below the cursor and hold the committed offset back until they are delivered.
        messages, taken = self._in_store(key, ledger.first_pending(key, want))
        cursor = next_cursor = ledger.cursor(key)
        fresh = min(want - len(taken), ledger.room(key))
        if fresh > 0:
            got = self._read(key, r, cursor, fresh)
            if got.status is GetStatus.OFFSET_OVERFLOW_BADLY:
                ledger.reset(key, got.max_offset)  # the queue is shorter than the cursor (recreated topic)
                return []
            if got.status not in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE):
                if not got.messages and cursor < got.next_begin_offset < got.max_offset:  # (moved: no spinning)
                    self._more_to_scan = True
                for m in got.messages:
                    messages[m.queue_offset] = m
                    taken.append((m.queue_offset, m.reconsume_times + 1))
                next_cursor = got.next_begin_offset
        if not taken and next_cursor == cursor:
            return []
        result = ledger.pop(key, taken, next_cursor, now_ms=now, invisible_ms=r.invisible_ms,
                            client_id=r.client_id, auto_renew=r.auto_renew)
        self._commit(key, result.watermark)
        return [Received(messages[h.offset], self._codec.encode(h), h.attempt, r.invisible_ms)
                for h in result.handles]

    def _in_store(self, key: QueueKey, pending: list[Pending]) -> tuple[dict[int, StoredMessage], list[tuple[int, int]]]:
        """The stored messages of pending entries about to be handed out, and their (offset, attempt); an
        entry whose message is gone with its commit log segment is done (nothing left to deliver)."""
        messages: dict[int, StoredMessage] = {}
        taken = []
        for p in pending:
            m = self._store.message_at(key.topic, key.queue_id, p.offset)
            if m is None:
                self._commit(key, self.ledger.revived(key, p.offset, p.pop_id))
                continue
            messages[p.offset] = m
            taken.append((p.offset, p.attempt))
        return messages, taken

    def _read(self, key: QueueKey, r: ReceiveRequest, offset: int, count: int):
        f = r.filter
        sql = f.expression_type == ExpressionType.SQL92  # its properties decide, read before decoding
        return self._store.get_messages(key.topic, key.queue_id, offset, count,
                                        matcher=None if f.code_filter is None else f.matches_code,
                                        exact_matcher=None if f.code_filter is None else (
                                            lambda m: f.matches_properties(m.properties)),
                                        properties_filter=f.matches_properties if sql else None,
                                        max_scan=MAX_SCAN_PROPERTIES if sql else MAX_SCAN)

    def _take_fifo(self, key: QueueKey, r: ReceiveRequest, want: int, now: int) -> list[Received]:
        """FIFO per message group (fifo.py): the ready redeliveries and held messages first, then new ones
        of the groups with nothing unfinished; read on from the cursor while messages of busy groups keep
        the pop short of `want`."""
        ledger = self.ledger
        messages, taken = self._in_store(key, ledger.fifo_ready(key, want))
        redeliver = [offset for offset, _ in taken]
        cursor = scan_end = ledger.cursor(key)
        fresh: list[tuple[int, int, str]] = []
        window, end = want - len(redeliver), None
        while window > 0 and ledger.room(key) > 0 and scan_end - cursor < FIFO_MAX_SCAN:
            got = self._read(key, r, scan_end, window)
            if got.status is GetStatus.OFFSET_OVERFLOW_BADLY and scan_end == cursor:
                ledger.reset(key, got.max_offset)  # the queue is shorter than the cursor (recreated topic)
                return []
            if got.status in (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE,
                              GetStatus.OFFSET_OVERFLOW_BADLY) or got.next_begin_offset <= scan_end:
                break
            for m in got.messages:
                fresh.append((m.queue_offset, m.reconsume_times + 1, m.properties.get(MESSAGE_GROUP_PROPERTY, "")))
                messages[m.queue_offset] = m
            scan_end, end = got.next_begin_offset, got.max_offset
            plan = ledger.plan_fifo(key, redeliver, fresh, scan_end, limit=want)
            if len(plan.handed) >= want or plan.full or scan_end >= end:
                break
            window = min(2 * window, FIFO_WINDOW)  # messages of busy groups held the pop short: read on
        if not redeliver and scan_end == cursor:
            return []
        result = ledger.pop_fifo(key, redeliver, fresh, scan_end, limit=want, now_ms=now,
                                 invisible_ms=r.invisible_ms, client_id=r.client_id, auto_renew=r.auto_renew)
        self._commit(key, result.watermark)
        if not result.handles and end is not None and cursor < result.next_cursor < end:
            self._more_to_scan = True  # filtered or held entries only, the cursor moved: scan on
        return [Received(messages[h.offset], self._codec.encode(h), h.attempt, r.invisible_ms)
                for h in result.handles]

    def _sync_reset(self, key: QueueKey) -> None:
        """Start the queue's pop state at the committed offset (the first offset for a new group), or
        over again after an admin reset (its reset generation changed)."""
        generation = self._offsets.reset_generation(key.group, key.topic, key.queue_id)
        committed = self._offsets.query(key.group, key.topic, key.queue_id)
        start = committed if committed >= 0 else self._store.min_offset(key.topic, key.queue_id)
        if self.ledger.ensure_queue(key, start):
            self._generations[key] = generation
        elif self._generations.setdefault(key, generation) != generation:
            self._generations[key] = generation
            self.ledger.reset(key, start)
            log.info("pop queue reset", event="pop_reset", group=key.group, topic=key.topic,
                     queue_id=key.queue_id, offset=start)

    # ---- ack, change, dead letter --------------------------------------------------------------------

    def handle(self, group: str, topic: str, text: str) -> HandleFields:
        """The receipt handle of a request about `group` and `topic`: forged or for something else,
        InvalidReceiptHandleError."""
        h = self._codec.decode(text)
        if h.group != group or h.topic not in (topic, pop_retry_topic(group, topic)):
            raise InvalidReceiptHandleError(
                f"the receipt handle is for group {h.group!r} and topic {h.topic!r}, not {group!r} and {topic!r}")
        return h

    def ack(self, group: str, topic: str, text: str) -> None:
        h = self.handle(group, topic, text)
        self._commit(h.key, self.ledger.ack(h))
        self._group_may_go(h)

    def _group_may_go(self, h: HandleFields) -> None:
        """FIFO: a finished delivery may free its message group's next messages: wake the receives
        waiting on the queue."""
        if self._groups.find_or_default(h.group).consume_orderly:
            self._hold.notify(h.topic, h.queue_id)

    def change_invisible(self, group: str, topic: str, text: str, invisible_ms: int) -> str:
        """Hide the message for invisible_ms from now; the new receipt handle (the old one is stale)."""
        if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
            raise InvisibleTimeError(f"invisible time {invisible_ms} ms is outside 0..{MAX_INVISIBLE_MS} ms")
        h = self.handle(group, topic, text)
        return self._codec.encode(self.ledger.change_invisible(h, now_ms=self._clock_ms(), invisible_ms=invisible_ms))

    async def dead_letter(self, group: str, topic: str, text: str) -> None:
        """The client gives up on the message (ForwardMessageToDeadLetterQueue): to the DLQ, done."""
        h = self.handle(group, topic, text)
        if not self._current(h):
            raise StaleReceiptHandleError(h.key, h.offset, "the delivery is over (acked, changed or expired)")
        await self._revive(h, to_dlq=True)

    def _current(self, h: HandleFields) -> bool:
        entry = self.ledger.inflight(h.key).get(h.offset) if h.key in self.ledger else None
        return entry is not None and entry.pop_id == h.pop_id

    def _commit(self, key: QueueKey, watermark: int | None) -> None:
        if watermark is not None:
            self._offsets.advance(key.group, key.topic, key.queue_id, watermark)

    # ---- timers --------------------------------------------------------------------------------------

    async def revive_expired(self) -> None:
        """Copy every delivery whose invisible time is over to its next attempt (or the DLQ)."""
        if self.ledger is None or not self._permission.writable:
            return
        try:
            await self._revive_batch()
        except StoreError:
            return  # the store or the pop journal cannot be written: health says so; the next scan retries

    async def _revive_batch(self) -> None:
        for e in self.ledger.expired(self._clock_ms(), REVIVE_BATCH):
            config = self._groups.ensure(e.key.group)
            if config.consume_orderly and e.entry.attempt < config.retry_max_times + 1:
                # FIFO: the same message again, in its place, before anything after it.
                self.ledger.redeliver_in_place(e.key, e.offset, e.entry.pop_id)
                self._hold.notify(e.key.topic, e.key.queue_id)
                continue
            await self._revive(e.handle)

    async def _revive(self, h: HandleFields, *, to_dlq: bool = False) -> None:
        message = self._store.message_at(h.topic, h.queue_id, h.offset)
        if message is not None:
            config = self._groups.ensure(h.group)
            if to_dlq or h.attempt >= config.retry_max_times + 1:
                target, to_dlq = self._topics.ensure_system_topic(dlq_topic(h.group), 1), True
            else:
                original = message.properties.get(PropertyKey.RETRY_TOPIC, message.topic)
                target = self._topics.ensure_system_topic(pop_retry_topic(h.group, original),
                                                          config.retry_queue_nums)
            queue_id = h.offset % target.write_queue_nums
            await self._store.put_messages([redelivery_copy(
                message, topic=target.name, queue_id=queue_id, reconsume_times=h.attempt,
                max_reconsume_times=config.retry_max_times)])
            self._on_moved(h.group, to_dlq)
            if to_dlq:
                self.dead_lettered += 1
                log.warning("message moved to DLQ", event="dlq", group=h.group, msg_id=message.msg_id,
                            attempts=h.attempt)
            else:
                self.revived += 1
        try:
            self._commit(h.key, self.ledger.revived(h.key, h.offset, h.pop_id))
        except StaleReceiptHandleError:
            pass  # acked while the copy was written: the copy is one extra delivery, nothing is lost
        self._group_may_go(h)

    def renew(self, alive: Container[str]) -> None:
        """Extend the auto-renewed deliveries of clients still alive."""
        if self.ledger is not None:
            try:
                self.ledger.renewals(self._clock_ms(), alive)
            except StoreError:
                pass  # not renewed this time (health says why); they are due again at the next sweep

    # ---- admin ---------------------------------------------------------------------------------------

    def inflight(self, group: str) -> list[QueueInflight]:
        """What the group has in flight on each queue it popped from (its pop retry topics' too), now."""
        return summarize(self.ledger, [k for k in self.ledger.keys() if k.group == group], self._clock_ms(),
                         self._store.readable_max_offset)

    def inflight_by_group(self) -> dict[str, list[QueueInflight]]:
        """`inflight` of every group with pop state, by group (sorted), in one pass over the ledger."""
        keys: dict[str, list[QueueKey]] = {}
        for key in self.ledger.keys():
            keys.setdefault(key.group, []).append(key)
        now = self._clock_ms()
        return {group: summarize(self.ledger, keys[group], now, self._store.readable_max_offset)
                for group in sorted(keys)}

    def has_group(self, group: str) -> bool:
        """Whether the group has pop state (it was consumed by pop)."""
        return any(k.group == group for k in self.ledger.keys())

    def forget_group(self, group: str) -> None:
        for key in [k for k in self.ledger.keys() if k.group == group]:
            self.ledger.drop(key)

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self.ledger.keys() if k.topic == topic]:
            self.ledger.drop(key)

