"""ScheduleMessageService: delay levels as a schedule topic with one queue per level.

A delayed message is stored on SCHEDULE_TOPIC_XXXX, queue level-1, with its
real topic and queue in properties and its due time (ms) as the consume-queue
tags code. One owned task walks each level's queue in order and re-puts due
messages on their real topic with their original properties and msg id. The
progress per level is kept in config/delayOffset.json (RocketMQ's shape),
written when it changed and at shutdown, so a restart neither repeats nor skips
deliveries; after a kill -9 deliveries since the last write are repeated
(at-least-once), never lost.

Delivery at a timestamp (RocketMQ 5's delivery time) rides on the same
queues in hops: the message keeps the requested time (ms) in DELIVER_TIMESTAMP
and no DELAY property, and goes into the level with the largest delay not past
that time (the shortest level when every level is longer). When that level
delivers it before the requested time, it goes into the level planned the same
way for the time left; otherwise to its real topic. Each level still has one
constant delay, so due times stay in order per queue; a hop is never early and
the last one is at most the shortest level (1 s) late.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from tidemark.broker.disk.metadata_file import load_json
from tidemark.broker.store import GetStatus, MessageRecord, MessageStore, StoredMessage
from tidemark.common.fsutil import atomic_write
from tidemark.common.logs import get_logger
from tidemark.common.protocol import SCHEDULE_TOPIC, PropertyKey, tag_hash

log = get_logger("tidemark.broker.ingest.delays")

_BATCH = 64
_IDLE_WAIT_S = 1.0
# After a failed write (store refusing writes), wait this long before trying the level again.
_RETRY_AFTER_ERROR_S = 1.0


def deliver_timestamp(store_timestamp: int, level: int, levels_ms: tuple[int, ...]) -> int:
    """When a message stored at store_timestamp with a delay level is due (levels are 1-based)."""
    return store_timestamp + levels_ms[level - 1]


def hop_level(remaining_ms: int, levels_ms: Sequence[int]) -> int:
    """The level (1-based) of the next hop toward a delivery time remaining_ms away: the one with the
    largest delay <= remaining_ms, or the shortest level when every level is longer (or the time has
    come). Levels of 0 ms are never used (they would not move the clock). ValueError without a level > 0."""
    best = shortest = 0
    for level, delay in enumerate(levels_ms, start=1):
        if delay <= 0:
            continue
        if not shortest or delay < levels_ms[shortest - 1]:
            shortest = level
        if delay <= remaining_ms and (not best or delay > levels_ms[best - 1]):
            best = level
    if not shortest:
        raise ValueError("no delay level longer than 0 ms to schedule a delivery time with")
    return best or shortest


def is_timed(properties: dict[str, str]) -> bool:
    """A schedule-topic message waiting for a delivery time (not for one delay level)."""
    return PropertyKey.DELAY not in properties and PropertyKey.DELIVER_TIMESTAMP in properties


def real_record(message: StoredMessage) -> MessageRecord:
    """The message as it goes back on its real topic and queue. A message sent for a delivery time keeps
    DELIVER_TIMESTAMP (consumers see when it was due); a delay-level message loses it with DELAY."""
    props = dict(message.properties)
    timed = is_timed(props)
    topic = props.pop(PropertyKey.REAL_TOPIC)
    queue_id = int(props.pop(PropertyKey.REAL_QID))
    props.pop(PropertyKey.DELAY, None)
    if not timed:
        props.pop(PropertyKey.DELIVER_TIMESTAMP, None)
    return message.rewritten(topic=topic, queue_id=queue_id, properties=props,
                             tags_code=tag_hash(props.get(PropertyKey.TAGS, "")))


class ScheduleMessageService:
    def __init__(self, *, store: MessageStore, config_dir: Path, levels_ms: tuple[int, ...],
                 clock_ms: Callable[[], int], can_deliver: Callable[[], bool] = lambda: True) -> None:
        self._store = store
        self._path = Path(config_dir) / "delayOffset.json"
        self._levels = levels_ms
        self._clock_ms = clock_ms
        self._can_deliver = can_deliver
        self._offsets: dict[int, int] = {}
        self._dirty = False
        self._persisting = asyncio.Lock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        # One delivery pass at a time (the task, or a caller of deliver_due()): a message is put once.
        self._pass = asyncio.Lock()
        self._hop_dues: list[int] = []
        self.delivered = 0
        self.hops = 0  # re-puts of messages sent for a delivery time into a next level

    @property
    def levels_ms(self) -> tuple[int, ...]:
        return self._levels

    def load(self) -> None:
        doc = load_json(self._path, log) or {}
        for level, offset in doc.get("offsetTable", {}).items():
            try:
                self._offsets[int(level)] = int(offset)
            except (TypeError, ValueError):
                log.warning("skipping malformed delay offset", event="delay_offset_skip", level=level)

    def to_schedule_record(self, record: MessageRecord, level: int, now: int) -> MessageRecord:
        """Re-address a message with a delay level to the schedule topic."""
        props = dict(record.properties)
        props[PropertyKey.REAL_TOPIC] = record.topic
        props[PropertyKey.REAL_QID] = str(record.queue_id)
        props[PropertyKey.DELAY] = str(level)
        due = deliver_timestamp(now, level, self._levels)
        props[PropertyKey.DELIVER_TIMESTAMP] = str(due)
        self._wake.set()
        return replace(record, topic=SCHEDULE_TOPIC, queue_id=level - 1, properties=props, tags_code=due)

    def schedule_at(self, record: MessageRecord, deliver_at_ms: int, now: int) -> MessageRecord:
        """Address a message to be delivered at deliver_at_ms (epoch ms): to the schedule topic, in the
        level planned by hop_level(); already due (<= now): to its own topic at once. Either way it
        carries DELIVER_TIMESTAMP = deliver_at_ms. The caller checks the upper bound."""
        props = dict(record.properties)
        props.pop(PropertyKey.DELAY, None)  # the marker of delay-level messages (is_timed)
        props[PropertyKey.DELIVER_TIMESTAMP] = str(deliver_at_ms)
        if deliver_at_ms <= now:
            return replace(record, properties=props)
        props[PropertyKey.REAL_TOPIC] = record.topic
        props[PropertyKey.REAL_QID] = str(record.queue_id)
        level = hop_level(deliver_at_ms - now, self._levels)
        self._wake.set()
        return replace(record, topic=SCHEDULE_TOPIC, queue_id=level - 1, properties=props,
                       tags_code=now + self._levels[level - 1])

    def _next_hop(self, message: StoredMessage, now: int) -> MessageRecord:
        """Where a due schedule-topic message goes: its real topic, or the next level of its hops."""
        if not is_timed(message.properties):
            return real_record(message)
        deliver_at = int(message.properties[PropertyKey.DELIVER_TIMESTAMP])
        if now >= deliver_at:
            return real_record(message)
        try:
            level = hop_level(deliver_at - now, self._levels)
        except ValueError:
            # Only with a delay table of 0 ms levels (changed since the send): deliver rather than lose it.
            log.warning("no delay level to wait with, delivering early", event="schedule_early",
                        offset=message.queue_offset, deliver_at=deliver_at)
            return real_record(message)
        return message.rewritten(topic=SCHEDULE_TOPIC, queue_id=level - 1, properties=dict(message.properties),
                                 tags_code=now + self._levels[level - 1])

    def progress(self) -> dict[int, int]:
        return dict(self._offsets)

    def mirror(self, progress: dict[int, int]) -> None:
        """A replica's copy of its master's delivery progress (forward only), so a promoted replica does
        not deliver again what its master delivered. Levels this broker does not have are ignored."""
        for level, offset in progress.items():
            if 1 <= level <= len(self._levels) and offset > self._offsets.get(level, 0):
                self._offsets[level] = offset
                self._dirty = True

    def pending(self) -> int:
        """Messages waiting in the schedule topic (all levels)."""
        return sum(max(0, self._store.max_offset(SCHEDULE_TOPIC, level - 1) - self._offset(level))
                   for level in range(1, len(self._levels) + 1))

    def _offset(self, level: int) -> int:
        queue_id = level - 1
        return max(self._offsets.get(level, 0), self._store.min_offset(SCHEDULE_TOPIC, queue_id))

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="schedule-delivery")

    async def shutdown(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.persist()

    async def persist(self) -> None:
        """Write delayOffset.json when progress moved: snapshot on the loop, write and fsync in a thread.
        One write at a time, and a caller cancelled mid-write (the delivery task at shutdown) still waits
        for its thread: two writes share the file's temporary name."""
        async with self._persisting:
            if not self._dirty:
                return
            doc = {"offsetTable": {str(level): offset for level, offset in sorted(self._offsets.items())}}
            self._dirty = False
            write = asyncio.ensure_future(asyncio.to_thread(
                atomic_write, self._path, json.dumps(doc, indent=4).encode("utf-8"), keep_backup=True))
            try:
                await asyncio.shield(write)
            except BaseException:
                self._dirty = True
                if not write.done():
                    await asyncio.gather(write, return_exceptions=True)
                raise

    async def deliver_due(self) -> int | None:
        """One delivery pass over every level (what the task does each time it wakes): put what is due
        now, persist the progress; return the due time of the next message, if any."""
        async with self._pass:
            # Hops written in this pass may land in levels it already walked: they count too.
            self._hop_dues = []
            next_due: int | None = None
            if self._can_deliver():
                for level in range(1, len(self._levels) + 1):
                    due = await self._deliver_level(level)
                    if due is not None and (next_due is None or due < next_due):
                        next_due = due
            if self._hop_dues:
                next_due = min(self._hop_dues if next_due is None else [next_due, *self._hop_dues])
            await self.persist()
            return next_due

    async def _run(self) -> None:
        while True:
            next_due: int | None = None
            try:
                next_due = await self.deliver_due()
            except asyncio.CancelledError:
                raise
            except Exception:
                # Store refusing writes, delayOffset.json not writable...: keep the schedule alive and
                # try again; nothing was skipped, the progress only moves after a successful put.
                log.exception("schedule delivery failed, retrying", event="schedule_error")
                next_due = self._clock_ms() + int(_RETRY_AFTER_ERROR_S * 1000)
            wait = _IDLE_WAIT_S if next_due is None else max(0.0, (next_due - self._clock_ms()) / 1000)
            try:
                async with asyncio.timeout(min(wait, _IDLE_WAIT_S)):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()

    async def _deliver_level(self, level: int) -> int | None:
        """Deliver every due message of a level; return the due time of the next one, if any."""
        queue_id = level - 1
        while True:
            offset = self._offset(level)
            result = self._store.get_messages(SCHEDULE_TOPIC, queue_id, offset, _BATCH)
            if result.status is not GetStatus.FOUND:
                return None
            now = self._clock_ms()
            for message in result.messages:
                if message.tags_code > now:
                    return message.tags_code
                try:
                    record = self._next_hop(message, now)
                except (KeyError, ValueError) as e:
                    # Malformed (no real topic/queue): skipped, not retried forever.
                    log.error("scheduled message dropped",
                              event="schedule_drop", level=level, offset=message.queue_offset, error=e)
                else:
                    # A StoreError propagates: the level stops here and the message is delivered later.
                    await self._store.put_messages([record])
                    if record.topic == SCHEDULE_TOPIC:
                        self.hops += 1
                        self._hop_dues.append(record.tags_code)
                    else:
                        self.delivered += 1
                self._offsets[level] = message.queue_offset + 1
                self._dirty = True
