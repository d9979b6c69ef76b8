"""Fetcher: records from every broker a consumer reads, one Fetch stream per broker, credit per lease.

Each lease being read has a handle on its broker's stream. The broker pushes
records as they are stored, within the credit the fetcher grants: at first the
lease's room under pull_threshold_for_queue / pull_threshold_size_for_queue,
then back whatever the consumer finishes (`grant`). Credit is held back while
the consumer is suspended or the lease's cache spans more than
consume_concurrently_max_span offsets (one stuck message must not let the
cache grow without bound), and returned in steps of a quarter of the room, so
a credit frame (which also carries the queue's commit, RocketMQ's
piggybacked commitOffset) goes out every few hundred messages, not per batch.
A queue whose cache is empty (the consumer keeps up: most of the time below
full speed) still holds at least three quarters of its room as credit at the
broker; its credit and commit go out IDLE_CREDIT_S after the first batch
consumed, with everything consumed meanwhile, instead of one frame per
consumed batch (which cost the consumer a stream write and the broker a read,
a commit and an offset-journal write per message at 1,000-5,000 msg/s).

Records are turned into messages that decode lazily (MessageExt.from_record);
the exact tag check (the broker filters by hash code, codes may collide)
drops mismatches before the consumer sees them.

When a stream breaks (broker restart, network), every lease on it is opened
again on a new stream, from where it was, after a backoff; a broker that lost
its lock table answers that with a fence error, and the consumer re-locks.
A stream stays on the address that serves its broker name now (the master,
or its replica while the master is away): when the cluster says another one
does, the stream's leases reopen there, where their locks and commits are.
The cluster says so the moment it learns it (its `moves`), not at the
next reopen: a stream that broke or failed to open makes its broker name
suspect, the cluster asks the name servers at once, and an elected master
gets the stream's leases as soon as they name it, even from a stream that
stands silent on a paused master or while its leases wait out a backoff.

A queue this consumer is about to lock (a handover: the previous owner is
draining it) is opened ahead (`open_ahead`), before its lease exists: the
broker starts it the moment the lock is ours, from the group's committed
offset under that grant's fence, and its first records travel beside the
grant's answer instead of after it and a second open. When the lease starts,
it takes the handle over only if the broker started exactly where the lease
starts, under the lease's fence (the broker says where, before the records);
anything else (a start elsewhere: this client's kept progress; a queue with
no committed offset; a broker that does not know the request) closes the
handle, and the lease opens its queue as usual. Records that came ahead are
delivered when the lease takes over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from tidemark.client.consumer.lease import QueueLease
from tidemark.client.consumer.offset_store import OffsetStore
from tidemark.client.errors import TidemarkError
from tidemark.client.message import MessageExt, MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.remoting.streams import FetchStream, QueueEnd, QueueStart
from tidemark.client.selector import MessageSelector
from tidemark.client.types import Fence
from tidemark.common.backoff import Backoff
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import TaskSet

log = get_logger("tidemark.client.fetch")

RECONNECT = Backoff(first_s=0.1, max_s=3.0)
# How long an idle queue's returned credit (and the commit riding on it) waits for more before it goes out.
IDLE_CREDIT_S = 0.1


class FetchSink(Protocol):
    """Where a Fetcher delivers (the consumer core). Called on the event loop."""

    def on_messages(self, lease: QueueLease, msgs: list[MessageExt], next_offset: int) -> None:
        """Records of a lease, in offset order; next_offset is past everything read (or filtered)."""

    def on_ended(self, lease: QueueLease, end: QueueEnd) -> None:
        """The broker stopped serving the lease: restart it, lose the queue, or `retry` later."""


@dataclass(frozen=True, slots=True)
class FetchLimits:
    messages: int  # pull_threshold_for_queue
    bytes: int  # pull_threshold_size_for_queue
    max_span: int | None  # consume_concurrently_max_span (None: no span limit)
    batch_size: int  # pull_batch_size: a queue's records per frame, so queues take turns


@dataclass(eq=False, slots=True)
class _Reading:
    lease: QueueLease
    handle: int
    selector: MessageSelector
    next_offset: int
    owed_messages: int = 0
    owed_bytes: int = 0
    idle_flush: asyncio.TimerHandle | None = None  # an idle queue's credit, due soon


@dataclass(eq=False, slots=True)
class _Ahead:
    """A queue opened before its lease (open_ahead): where the broker started it, what it sent since."""

    mq: MessageQueue
    handle: int
    stream: FetchStream
    start: QueueStart | None = None
    frames: list[tuple[int, bytes, int, int]] = field(default_factory=list)  # count, data, next, max
    waiting: _Reading | None = None  # the lease started before the broker said where it started


class Fetcher:
    def __init__(self, *, cluster: BrokerCluster, group: str, subscription: Callable[[str], MessageSelector | str],
                 limits: FetchLimits, sink: FetchSink, offset_store: OffsetStore | None,
                 held: Callable[[], bool] = lambda: False) -> None:
        self._cluster = cluster
        self._group = group
        self._subscription = subscription
        self._limits = limits
        self._sink = sink
        # Piggybacked commits: the offset store's current value for the queue rides on credit frames.
        self._store = offset_store
        self._held = held
        self._readings: dict[QueueLease, _Reading] = {}
        self._by_handle: dict[int, _Reading] = {}
        self._streams: dict[str, FetchStream] = {}
        self._failures: dict[str, int] = {}
        # Per broker name, set when another address starts serving it: ends the backoffs waiting to reopen.
        self._wakes: dict[str, asyncio.Event] = {}
        self._stop_moves = cluster.moves.listen(self._master_moved)
        self._tasks = TaskSet("fetch_task_failed", "fetcher task failed", log)
        self._next_handle = 0
        self._closed = False
        self._ahead: dict[MessageQueue, _Ahead] = {}  # queues opened ahead whose lease has not started
        self._ahead_by_handle: dict[int, _Ahead] = {}
        self.taken_over = 0  # leases read on a handle opened ahead

    @property
    def opened_ahead(self) -> int:
        """Handles opened ahead that no lease took over yet and nothing closed (each open at the broker)."""
        return len(self._ahead_by_handle)

    # -- leases ------------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Open the stream to every broker known now, before any lease: a queue granted later (a
        handover's lock) is then read with one open frame on a stream already set up, not after a new
        call's round trip. A broker that cannot be reached now is left for the first lease to open."""
        try:
            brokers = await self._cluster.serving()
        except TidemarkError as e:
            log.debug("no fetch stream opened ahead", event="fetch_prepare_skipped", error=e)
            return
        for broker in brokers:
            if not self._closed:
                try:
                    await self._stream(broker)
                except TidemarkError as e:
                    log.debug("no fetch stream opened ahead", event="fetch_prepare_skipped", broker=broker,
                              error=e)

    async def start(self, lease: QueueLease, offset: int, *, ahead: bool = False) -> None:
        """Start reading a lease's queue at `offset`; `ahead`: on the handle opened ahead for it when the
        broker starts that handle there under the lease's fence (the lease starts at the committed offset
        its grant told: else the broker starts it elsewhere or not at all, and waiting for its word would
        only delay the open)."""
        reading = _Reading(lease, 0, MessageSelector.of(self._subscription(lease.mq.topic)), offset)
        self._readings[lease] = reading
        opened = self._ahead.pop(lease.mq, None)
        if opened is not None and not ahead:
            self._close_ahead(opened)
        elif opened is not None:
            if opened.start is None and self._streams.get(lease.mq.broker_name) is opened.stream:
                opened.waiting = reading  # the broker's start (or the handle's end) decides: _on_started
                return
            if self._take_over(opened, reading):
                return
        await self._open(reading)

    def open_ahead(self, topic: str, mqs: set[MessageQueue], client_id: str) -> None:
        """Open these queues of `topic` (this client asks for their locks) to start when their locks are ours;
        close those of the topic opened ahead before and no longer wanted. Only on streams already open."""
        for mq in [mq for mq in self._ahead if mq.topic == topic and mq not in mqs]:
            self._close_ahead(self._ahead.pop(mq))
        for mq in sorted(mqs - self._ahead.keys()):
            stream = self._streams.get(mq.broker_name)
            if self._closed or stream is None or not stream.usable:
                continue
            selector = MessageSelector.of(self._subscription(topic))
            self._next_handle += 1
            ahead = self._ahead[mq] = _Ahead(mq, self._next_handle, stream)
            self._ahead_by_handle[ahead.handle] = ahead
            limits = self._limits
            stream.open_queue(ahead.handle, self._group, mq, 0, subscription=selector.expression,
                              fence=Fence(client_id, None, None), credit_messages=limits.messages,
                              credit_bytes=limits.bytes, batch_size=limits.batch_size,
                              expression_type=selector.expression_type, after_lock=True)

    def stop(self, lease: QueueLease) -> None:
        """Stop reading a lease (what the broker already sent for it is dropped on arrival). A lease still
        waiting for the broker to start its handle opened ahead closes that handle: the broker may never
        start it (the lock went back before the grant reached the stream), and it would wait there, and
        here, for as long as the stream lasts."""
        reading = self._readings.pop(lease, None)
        if reading is not None:
            self._cancel_idle_flush(reading)
            self._drop_handle(reading)
            for ahead in [a for a in self._ahead_by_handle.values() if a.waiting is reading]:
                self._close_ahead(ahead)

    def _drop_handle(self, reading: _Reading) -> None:
        if self._by_handle.pop(reading.handle, None) is not None:
            stream = self._streams.get(reading.lease.mq.broker_name)
            if stream is not None and stream.usable:
                stream.close_queue(reading.handle)

    def retry(self, lease: QueueLease, delay_s: float) -> None:
        """Open a lease again after a delay, from where its reading stopped (after a transient refusal)."""
        reading = self._readings.get(lease)
        if reading is not None:
            self._tasks.spawn(self._reopen_later(reading, delay_s), f"fetch-retry:{lease.mq}")

    def grant(self, lease: QueueLease, messages: int, nbytes: int) -> None:
        """The consumer finished this much of a lease: room for the broker to send more."""
        reading = self._readings.get(lease)
        if reading is not None:
            reading.owed_messages += messages
            reading.owed_bytes += nbytes
            self._flush(reading, force=False)

    def resume(self) -> None:
        """After suspend: hand back every credit held meanwhile."""
        for reading in list(self._readings.values()):
            self._flush(reading, force=True)

    async def close(self) -> None:
        self._closed = True
        self._stop_moves()
        for reading in self._readings.values():
            self._cancel_idle_flush(reading)
        await self._tasks.close()
        streams, self._streams = list(self._streams.values()), {}
        await asyncio.gather(*(s.close() for s in streams), return_exceptions=True)
        self._readings.clear()
        self._by_handle.clear()
        self._ahead.clear()
        self._ahead_by_handle.clear()

    def _take_over(self, ahead: _Ahead, reading: _Reading) -> bool:
        """Read a lease on the handle opened ahead for its queue, when the broker started that handle where
        the lease starts, under its fence, on the stream still in use; else close the handle (False: the
        lease opens its queue as usual). Records that came ahead are delivered now."""
        self._ahead_by_handle.pop(ahead.handle, None)
        lease, start = reading.lease, ahead.start
        if self._readings.get(lease) is not reading or not lease.counts:
            self._close_ahead(ahead)
            return True  # stopped meanwhile: nothing to open
        if start is None or self._streams.get(lease.mq.broker_name) is not ahead.stream \
                or (start.offset, start.owner_epoch, start.reset_generation) != (
                    reading.next_offset, lease.owner_epoch, lease.reset_generation):
            self._close_ahead(ahead)
            return False
        reading.handle = ahead.handle
        self._by_handle[ahead.handle] = reading
        self.taken_over += 1
        for frame in ahead.frames:
            if self._by_handle.get(ahead.handle) is not reading:
                break  # (dropped by a frame that did not decode: reopened from where it stood)
            self._on_records(ahead.handle, *frame)
        return True

    def _close_ahead(self, ahead: _Ahead) -> None:
        self._ahead_by_handle.pop(ahead.handle, None)
        if self._ahead.get(ahead.mq) is ahead:
            del self._ahead[ahead.mq]
        if ahead.stream.usable:
            ahead.stream.close_queue(ahead.handle)

    def _drop_ahead(self, broker: str, *, reopen: bool) -> None:
        """A stream of `broker` broke or moved: its handles opened ahead are gone; a lease that waited on one
        opens its queue as usual (`reopen`: now; else the caller reopens every lease of the broker)."""
        for ahead in [a for a in self._ahead_by_handle.values() if a.mq.broker_name == broker]:
            del self._ahead_by_handle[ahead.handle]
            if self._ahead.get(ahead.mq) is ahead:
                del self._ahead[ahead.mq]
            if ahead.waiting is not None and reopen:
                self._tasks.spawn(self._reopen_later(ahead.waiting, 0.0), f"fetch-reopen:{ahead.mq}")

    # -- credit ------------------------------------------------------------------------------

    def _room(self, lease: QueueLease) -> tuple[int, int]:
        pq, limits = lease.pq, self._limits
        return max(0, limits.messages - pq.msg_count), max(0, limits.bytes - pq.msg_size)

    def _flush(self, reading: _Reading, *, force: bool, idle_wait: bool = True) -> None:
        if not (reading.owed_messages or reading.owed_bytes) or self._held():
            return
        limits, pq = self._limits, reading.lease.pq
        if limits.max_span is not None and pq.max_span() > limits.max_span:
            return  # released once the stuck message finishes and the span shrinks
        if not force and reading.owed_messages * 4 < limits.messages and reading.owed_bytes * 4 < limits.bytes:
            if pq.msg_count:
                return
            if idle_wait:  # idle: soon, with what is consumed meanwhile
                if reading.idle_flush is None:
                    reading.idle_flush = asyncio.get_running_loop().call_later(IDLE_CREDIT_S, self._flush_idle,
                                                                               reading)
                return
        self._cancel_idle_flush(reading)
        stream = self._streams.get(reading.lease.mq.broker_name)
        if stream is None or not stream.usable or reading.handle not in self._by_handle:
            return  # reopening grants the whole room again
        commit = self._store.commit_for(reading.lease.mq) if self._store is not None else None
        stream.credit(reading.handle, reading.owed_messages, reading.owed_bytes,
                      commit.offset if commit is not None else None)
        reading.owed_messages = reading.owed_bytes = 0

    def _flush_idle(self, reading: _Reading) -> None:
        reading.idle_flush = None
        if not self._closed and self._readings.get(reading.lease) is reading:
            self._flush(reading, force=True)

    @staticmethod
    def _cancel_idle_flush(reading: _Reading) -> None:
        if reading.idle_flush is not None:
            reading.idle_flush.cancel()
            reading.idle_flush = None

    # -- streams -----------------------------------------------------------------------------

    async def _open(self, reading: _Reading) -> None:
        if self._closed or self._readings.get(reading.lease) is not reading:
            return
        broker = reading.lease.mq.broker_name
        try:
            stream = await self._stream(broker)
        except TidemarkError as e:
            log.warning("cannot open fetch stream", event="fetch_stream_failed", broker=broker, error=e)
            if e.retriable:
                self._cluster.suspect(broker)  # its master may have been replaced: ask where it is now
            self._tasks.spawn(self._reopen_later(reading, self._backoff(broker)), f"fetch-reopen:{broker}")
            return
        if self._closed or self._readings.get(reading.lease) is not reading:
            return  # stopped while the stream was being opened
        if self._by_handle.get(reading.handle) is reading:
            return  # another reopen of this reading (a refusal's, a broken stream's) opened it meanwhile
        self._next_handle += 1
        reading.handle = self._next_handle
        reading.owed_messages = reading.owed_bytes = 0
        self._by_handle[reading.handle] = reading
        messages, nbytes = self._room(reading.lease)
        lease = reading.lease
        stream.open_queue(reading.handle, self._group, lease.mq, reading.next_offset,
                          subscription=reading.selector.expression, fence=lease.fence, credit_messages=messages,
                          credit_bytes=nbytes, batch_size=self._limits.batch_size,
                          expression_type=reading.selector.expression_type)

    async def _stream(self, broker: str) -> FetchStream:
        conn = await self._cluster.connection(broker)  # the master, or its replica while the master is away
        stream = self._streams.get(broker)
        if stream is not None and stream.usable:
            if stream.address == conn.address:
                return stream
            self._move(broker, stream)
        holder: list[FetchStream] = []
        stream = conn.open_fetch_stream(
            on_records=self._on_records, on_ended=self._on_ended, on_started=self._on_started,
            on_broken=lambda error: self._on_broken(broker, holder[0] if holder else None, error))
        holder.append(stream)
        self._streams[broker] = stream
        return stream

    def _move(self, broker: str, stream: FetchStream) -> None:
        """Another address serves `broker` now (a failover to its replica, a master back or elected): the
        queues still read from the old stream reopen at the new one, where their locks and commits are
        taken, and the old stream closes."""
        del self._streams[broker]
        self._drop_ahead(broker, reopen=True)
        readings = [r for r in self._readings.values()
                    if r.lease.mq.broker_name == broker and self._by_handle.get(r.handle) is r]
        for reading in readings:
            self._by_handle.pop(reading.handle, None)
            self._tasks.spawn(self._reopen_later(reading, 0.0), f"fetch-reopen:{reading.lease.mq}")
        self._tasks.spawn(stream.close(), f"fetch-close:{stream.address}")
        log.info("fetch stream moved", event="fetch_stream_moved", broker=broker, address=stream.address,
                 queues=len(readings))

    def _master_moved(self, broker: str, address: str) -> None:
        """The cluster learnt that `address` serves `broker` now (a master elected or promoted, a replica
        standing in): a stream elsewhere moves there at once (it may stand silent on a paused or fenced
        master, which no error would ever end), and leases waiting out a backoff reopen now."""
        if self._closed:
            return
        self._failures.pop(broker, None)
        stream = self._streams.get(broker)
        if stream is not None and stream.usable and stream.address != address:
            self._move(broker, stream)
        wake = self._wakes.pop(broker, None)
        if wake is not None:
            wake.set()

    def _backoff(self, broker: str) -> float:
        failures = self._failures.get(broker, 0)
        self._failures[broker] = failures + 1
        return RECONNECT.delay(failures)

    async def _reopen_later(self, reading: _Reading, delay_s: float) -> None:
        """Reopen a lease after delay_s, or as soon as another address serves its broker name."""
        if delay_s > 0:
            wake = self._wakes.setdefault(reading.lease.mq.broker_name, asyncio.Event())
            try:
                async with asyncio.timeout(delay_s):
                    await wake.wait()
            except TimeoutError:
                pass
        if reading.lease.counts and reading.handle not in self._by_handle:
            await self._open(reading)

    # -- stream callbacks --------------------------------------------------------------------

    def _on_started(self, handle: int, start: QueueStart) -> None:
        ahead = self._ahead_by_handle.get(handle)
        if ahead is None:
            return  # closed meanwhile
        ahead.start = start
        if ahead.waiting is not None and not self._take_over(ahead, ahead.waiting):
            self._tasks.spawn(self._open(ahead.waiting), f"fetch-open:{ahead.mq}")

    def _on_records(self, handle: int, count: int, data: bytes, next_offset: int, max_offset: int) -> None:
        reading = self._by_handle.get(handle)
        if reading is None:
            ahead = self._ahead_by_handle.get(handle)
            if ahead is not None:  # its lease has not started yet
                ahead.frames.append((count, data, next_offset, max_offset))
            return  # (else closed meanwhile)
        lease = reading.lease
        if not lease.counts:
            return
        mq = lease.mq
        owed = reading.owed_messages
        try:
            msgs = self._decode(reading, count, data)
        except Exception as e:
            # Records that do not decode: read them again from where this frame began, after a backoff
            # (never skip them: the position only moves past what the consumer got).
            log.error("fetched records do not decode, reading them again",
                      event="fetch_decode_failed", queue=mq, offset=reading.next_offset, error=repr(e))
            self._drop_handle(reading)
            self._tasks.spawn(self._reopen_later(reading, self._backoff(mq.broker_name)), f"fetch-reopen:{mq}")
            return
        if self._failures:
            self._failures.pop(mq.broker_name, None)
        self._sink.on_messages(lease, msgs, next_offset)
        reading.next_offset = next_offset  # once delivered: a reopen after a failure reads them again
        if reading.owed_messages != owed:  # credit used by records the exact tag check dropped: nobody else
            self._flush(reading, force=False, idle_wait=False)  # returns it, so an idle queue's goes at once

    def _decode(self, reading: _Reading, count: int, data: bytes) -> list[MessageExt]:
        if not count:
            return []
        mq = reading.lease.mq
        topic, broker = mq.topic, mq.broker_name
        from_record = MessageExt.from_record
        msgs: list[MessageExt] = []
        pos = 0
        for _ in range(count):
            msg = from_record(data, pos, topic=topic, broker_name=broker)
            msgs.append(msg)
            pos += msg.store_size
        if reading.selector.is_sql:
            return msgs  # the broker evaluated the condition on each message: exact
        tags = reading.selector.filter  # the broker compared hash codes: exact here
        if not tags.matches_all:
            kept = [m for m in msgs if m.tags in tags.tags]
            if len(kept) != len(msgs):
                # A hash collision on the broker: not for us, but it used credit.
                reading.owed_messages += len(msgs) - len(kept)
                reading.owed_bytes += sum(m.store_size for m in msgs) - sum(m.store_size for m in kept)
                msgs = kept
        return msgs

    def _on_ended(self, handle: int, end: QueueEnd) -> None:
        ahead = self._ahead_by_handle.pop(handle, None)
        if ahead is not None:  # not started ahead (no committed offset, an older broker): opened as usual
            if self._ahead.get(ahead.mq) is ahead:
                del self._ahead[ahead.mq]
            if ahead.waiting is not None:
                self._tasks.spawn(self._open(ahead.waiting), f"fetch-open:{ahead.mq}")
            return
        reading = self._by_handle.pop(handle, None)
        if reading is None or not reading.lease.counts:
            return
        if end.status != "ERROR":
            reading.next_offset = end.next_offset
        self._sink.on_ended(reading.lease, end)

    def _on_broken(self, broker: str, stream: FetchStream | None, error: TidemarkError) -> None:
        if self._closed or self._streams.get(broker) is not stream:
            return
        del self._streams[broker]
        self._drop_ahead(broker, reopen=False)
        readings = [r for r in self._readings.values() if r.lease.mq.broker_name == broker]
        for reading in readings:
            self._by_handle.pop(reading.handle, None)
            if reading.lease.lock is not None:
                reading.lease.lock.lapse()  # the broker may be failing over, its locks gone (lock_hold.py)
        if error.retriable:
            self._cluster.suspect(broker)  # its master may have been replaced: ask where it is now
        if not readings:
            return
        delay = self._backoff(broker)
        log.warning("fetch stream broken, reopening",
                    event="fetch_stream_broken", broker=broker, queues=len(readings), delay_s=delay, error=error)
        for reading in readings:
            self._tasks.spawn(self._reopen_later(reading, delay), f"fetch-reopen:{reading.lease.mq}")
