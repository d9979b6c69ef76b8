"""IdempotenceService: the producer table on a running broker (ids, checks, journal, snapshots, expiry).

SendService asks it what a sequenced batch is (`check`) and stores an
accepted one through `append`, which journals the batch once the store has
checked it and before it is written, and records it once it is stored. Load drops the batches the store does not hold (the
broker died between the journal and the commit log, or a power cut took the
commit log's tail). Snapshots are written every flush interval when the table
changed, off the event loop; producers idle past the expiry are forgotten on
the same timer.

A master's replicas hold the same table, so that a promoted replica answers a
retry of any batch it holds as a duplicate: `listeners` get every change
(ids given out and forgotten once journaled, batches once stored), which
broker/cluster/replication.py sends along with the records. A replica takes the
table whole when its stream opens (`follow_state`) and each change after
(`follow_events`), journaling them as its own; it forgets no producer by
itself (the master's Forgotten events do), and on promotion drops the
batches it does not hold (`promoted`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tidemark.broker.errors import StoreError
from tidemark.broker.producers.store import ProducerStateStore
from tidemark.broker.producers.table import (
    Appended,
    Decision,
    OutOfOrderSequenceError,
    ProducerEvent,
    ProducerState,
    ProducerTable,
    QueueSequence,
    SequenceGapError,
)
from tidemark.broker.store import MessageStore, RecordsPut
from tidemark.broker.topics import check_topic
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.producers")


@dataclass(frozen=True, slots=True)
class BatchSequence:
    """What an idempotent producer's batch carries. `gaps`: the producer keeps several batches of a queue
    in flight and recovers from a SequenceGapError by sending the missing batch first; a producer without
    it (one batch in flight: every client before the flag) is told of a gap as OutOfOrderSequenceError,
    which it answers with a new epoch, as it always has."""

    producer_id: int
    epoch: int
    base_seq: int
    gaps: bool = False


class IdempotenceService:
    def __init__(self, directory: Path, *, store: MessageStore, clock_ms: Callable[[], int], max_producers: int,
                 expiry_ms: int, id_floor: int = 0) -> None:
        self._state = ProducerStateStore(directory, max_producers=max_producers, expiry_ms=expiry_ms,
                                         id_floor=id_floor)
        self._store = store
        self._clock_ms = clock_ms
        self.table: ProducerTable | None = None
        self.error: str | None = None  # why the last snapshot failed (None: fine)
        # Called with every change once it holds (journaled; a batch: stored): a master's replicas.
        self.listeners: list[Callable[[Sequence[ProducerEvent]], None]] = []
        self.follower = False  # a replica: the master's events change the table, not the expiry timer
        self._limits = {"max_producers": max_producers, "expiry_ms": expiry_ms, "id_floor": id_floor}

    def load(self) -> None:
        """Read the table (after the store recovered) and drop batches the store does not hold."""
        table = self._state.load()
        dropped = table.drop_unstored(self._stored)
        report = self._state.report
        for problem in report.problems:
            log.warning("producer state: %s", problem, event="producer_state_damage")
        if dropped or report.events:
            log.info("producer state loaded", event="producer_state_loaded", source=report.source,
                     producers=len(table), replayed=report.events, unstored_batches_dropped=dropped)
        self._use(table)

    def _use(self, table: ProducerTable) -> None:
        journal = table.sink

        def sink(events: Sequence[ProducerEvent]) -> None:
            journal(events)
            # Ids given out or forgotten hold once journaled; a batch only once stored (`append`).
            if self.listeners and not (len(events) == 1 and type(events[0]) is Appended):
                self._publish([e for e in events if type(e) is not Appended])

        table.sink = sink
        self.table = table

    def _publish(self, events: Sequence[ProducerEvent]) -> None:
        if events:
            for listener in self.listeners:
                listener(events)

    # -- a replica's copy -------------------------------------------------------------------------

    def snapshot(self) -> dict:
        """The whole table (what a replica's stream starts with)."""
        return self.table.snapshot()

    def follow_state(self, doc: dict) -> None:
        """A replica: the master's table, whole (its stream opened), replaces this one."""
        table = ProducerTable.from_snapshot(doc, **self._limits)
        table.sink = self.table.sink
        table.version = self.table.version + 1  # written by the next snapshot
        self.table = table

    def follow_events(self, events: Sequence[ProducerEvent]) -> None:
        """A replica: the master's changes since, journaled here and applied in order. A journal that cannot
        take them is reported by the next snapshot (which holds them)."""
        try:
            self._state.append(events)
        except OSError as e:
            log.warning("the master's producer events are not journaled here: %s", e, event="producer_follow_failed")
        for event in events:
            self.table.apply(event)

    def promoted(self) -> None:
        """A replica became the master: batches its table knows but its store lacks (the master's events ran
        ahead of its records) are dropped, and it expires producers itself from now on."""
        self.follower = False
        dropped = self.table.drop_unstored(self._stored)
        if dropped:
            log.info("producer batches the promoted replica does not hold dropped", event="producer_state_promoted",
                     dropped=dropped)

    def _stored(self, topic: str, queue_id: int, first_offset: int, count: int, first_msg_id: str) -> bool:
        if first_offset + count > self._store.max_offset(topic, queue_id):
            return False
        if first_offset < self._store.min_offset(topic, queue_id):
            return True  # retention took it: it was stored
        message = self._store.message_at(topic, queue_id, first_offset)
        return message is not None and message.msg_id == first_msg_id

    def allocate(self, key: str, topic: str = "") -> int:
        """A producer id (the key's, for a non-empty key); `topic` is one the producer writes to (checked
        for access by the caller; here only for its name)."""
        if topic:
            check_topic(topic)
        try:
            return self.table.allocate(key, self._clock_ms())
        except OSError as e:
            raise StoreError(f"producer id not given out: the producer journal cannot be written "
                             f"({e.strerror or e})") from None

    def check(self, seq: BatchSequence, topic: str, queue_id: int, count: int,
              first_msg_id: str | Callable[[], str] = "") -> Decision:
        try:
            return self.table.check(seq.producer_id, seq.epoch, topic, queue_id, seq.base_seq, count, first_msg_id)
        except SequenceGapError as e:
            if seq.gaps:
                raise
            raise OutOfOrderSequenceError(str(e)) from None

    def append(self, seq: BatchSequence, topic: str, queue_id: int, count: int,
               write: Callable[[Callable[[int, str], None]], RecordsPut]) -> RecordsPut:
        """Store a batch `check` accepted: `write(journal)` appends it, calling `journal(first offset, first
        msg id)` once the store has checked it and before it writes; the table learns of the batch only
        once it is stored (a refused write leaves a journal entry that the next start drops)."""
        journaled: list[Appended] = []

        def journal(first_offset: int, first_msg_id: str) -> None:
            try:
                journaled.append(self.table.journal_append(seq.producer_id, seq.epoch, topic, queue_id, seq.base_seq,
                                                           count, first_offset, first_msg_id, self._clock_ms()))
            except OSError as e:
                raise StoreError(f"batch not stored: the producer journal cannot be written "
                                 f"({e.strerror or e})") from None
        put = write(journal)
        for event in journaled:
            self.table.apply(event)
        self._publish(journaled)
        return put

    def producers(self, topic: str = "") -> list[tuple[ProducerState, list[tuple[tuple[str, int], QueueSequence]]]]:
        """Each producer with its queue sequences, sorted (only those that wrote to `topic`, if given)."""
        if topic:
            check_topic(topic)
        found = []
        for producer in self.table.producers() if self.table is not None else ():
            queues = sorted((k, q) for k, q in producer.queues.items() if not topic or k[0] == topic)
            if queues or not topic:
                found.append((producer, queues))
        return found

    def forget_topic(self, topic: str) -> None:
        if self.table is not None:
            self.table.forget_topic(topic)

    async def maintain(self) -> None:
        """The timer: forget idle producers, then snapshot if the table changed."""
        if self.table is None:
            return
        try:
            if not self.follower:
                self.table.expire(self._clock_ms())
        except OSError:
            pass  # the journal is failing; the snapshot below reports it, the next tick tries again
        await self.persist_if_dirty()

    async def persist_if_dirty(self) -> None:
        if self.table is None or not self._state.dirty(self.table):
            return
        pending = self._state.begin_snapshot(self.table)
        try:
            await asyncio.to_thread(self._state.write_snapshot, pending)
        except OSError as e:
            if self.error is None:
                log.error("producer state cannot be written: %s", e, event="producer_state_persist_failed")
            self.error = f"{self._state.path.name} cannot be written: {e.strerror or e}"
            return
        if self.error is not None:
            log.info("producer state persisted again", event="producer_state_persist_recovered")
        self.error = None

    async def shutdown(self) -> None:
        try:
            await self.persist_if_dirty()
        finally:
            self._state.close()

