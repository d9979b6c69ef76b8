"""MessageStore: the facade the broker talks to (RocketMQ's DefaultMessageStore).

Layout under `data_dir`: `commitlog/` (CommitLog), `consumequeue/` (ConsumeQueueTable),
`checkpoint` and `abort` (checkpoint.py).

Threading: every public method runs on the event-loop thread. fsync work runs
on the store's own single flush thread, which also serialises flush jobs, so
the final flush at shutdown always runs after any job a cancelled flush left
behind.

Lifecycle (StoreState): CREATED -load()-> LOADED -start()-> RUNNING -shutdown()-> SHUT_DOWN.
Reads work when LOADED or RUNNING; puts only when RUNNING and the write guard
says WRITABLE. An I/O error on the write or flush path (a full disk) trips the
guard: the half-written batch is cut back, puts are refused with a StoreError
saying to retry later, and the guard's probe gives writes back by itself once
the disk has room and the pending flush went through (writability.py).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from tidemark.broker.errors import InvalidArgumentError, StoreError
from tidemark.broker.store import batches, codec, reads
from tidemark.broker.store.checkpoint import (
    ABORT_FILE_NAME,
    CHECKPOINT_FILE_NAME,
    AbortFile,
    StoreCheckpoint,
)
from tidemark.broker.store.commitlog import CommitLog
from tidemark.broker.store.consumequeue import ConsumeQueue, ConsumeQueueTable
from tidemark.broker.store.flush import DirtySet, FlushJob, FlushService
from tidemark.broker.store.model import (
    FlushMode,
    GetResult,
    GetStatus,
    MessageRecord,
    PutResult,
    RawRead,
    RecordsPut,
    RecoveryReport,
    StoreConfig,
    StoredMessage,
)
from tidemark.broker.store.recovery import recover
from tidemark.broker.store.writability import GuardSettings, WriteGuard, describe, free_bytes
from tidemark.common import records
from tidemark.common.logs import get_logger
from tidemark.common.protocol import InvalidNameError, check_topic_name

__all__ = [
    "FlushMode",
    "GetResult",
    "GetStatus",
    "MessageRecord",
    "MessageStore",
    "PutResult",
    "RawRead",
    "RecordsPut",
    "RecoveryReport",
    "StoreConfig",
    "StoredMessage",
]

log = get_logger("tidemark.broker.store")

_MAX_QUEUE_ID = 2**31 - 1

DispatchListener = Callable[[str, int], None]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class StoreState(enum.Enum):
    CREATED = "created"
    LOADED = "loaded"
    RUNNING = "running"
    SHUT_DOWN = "shut_down"


class MessageStore:
    """Commit log + consume queues + checkpoint, with recovery and flushing."""

    def __init__(self, config: StoreConfig, *, clock: Callable[[], int] = _now_ms,
                 guard: GuardSettings | None = None) -> None:
        self._config = config
        self._clock = clock
        self._commitlog = CommitLog(
            config.data_dir / "commitlog",
            segment_size=config.commitlog_segment_size,
            dirty=DirtySet(),
        )
        self._queues = ConsumeQueueTable(
            config.data_dir / "consumequeue",
            entries_per_file=config.consume_queue_entries_per_file,
            dirty=DirtySet(),
            max_open_files=config.max_open_consume_queue_files,
        )
        self._checkpoint = StoreCheckpoint(config.data_dir / CHECKPOINT_FILE_NAME)
        self._abort = AbortFile(config.data_dir / ABORT_FILE_NAME)
        self._listeners: list[DispatchListener] = []
        self._state = StoreState.CREATED
        guard = guard or GuardSettings()
        self.guard = WriteGuard(settings=guard, free_bytes=lambda: free_bytes(config.data_dir),
                                repair=self._repair)  # its state and listeners are public
        self._retry_s = guard.probe_interval_s
        self._flush_lock = asyncio.Lock()  # one flush job in flight: a failed one is restored before the next take
        self._pending_cut: tuple[int, ConsumeQueue] | None = None  # an undo that failed, for the probe
        self._executor: ThreadPoolExecutor | None = None
        self._flusher: FlushService | None = None
        # A replica's store: reads past a queue's end wait for replication instead of going back (reads.py).
        self.follower = False
        # The commit-log offset readers may read up to (None: everything stored). A master with replicas
        # sets it to what a replica acknowledged (broker/cluster/replication.py): a consumer never reads a record a
        # failover may lose (and then skip the message the promoted replica stores at the same offset).
        # Kafka's high watermark.
        self.read_limit: Callable[[], int | None] = lambda: None

    # -- lifecycle -----------------------------------------------------------------

    def load(self) -> RecoveryReport:
        """Open the files and recover: scan the commit log from the checkpoint, truncate a
        torn or corrupt tail, repair the consume queues, then make the repair durable."""
        if self._state is not StoreState.CREATED:
            raise StoreError(f"load() is called once, on a new store (state: {self._state.value})")
        began = time.monotonic()
        self._config.data_dir.mkdir(parents=True, exist_ok=True)
        clean = not self._abort.exists()
        if not clean:
            log.warning("the store was not shut down cleanly; recovering from the checkpoint",
                        event="store_unclean")
        scan, redispatched, dropped = recover(self._commitlog, self._queues, self._checkpoint)
        cl_job, end = self._commitlog.take_flush_job()
        self._make_durable(cl_job, self._queues.take_flush_job(), end, allow_backwards=True)
        self._abort.create()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-flush")
        self._state = StoreState.LOADED
        report = RecoveryReport(
            clean_shutdown=clean,
            scanned_from=scan.scanned_from,
            commit_log_end=scan.end,
            truncated_bytes=scan.truncated_bytes,
            redispatched=redispatched,
            consume_queue_entries_dropped=dropped,
            duration_s=time.monotonic() - began,
        )
        log.debug("store loaded: %s", report)
        return report

    async def start(self) -> None:
        """Start the owned flush task."""
        if self._state is StoreState.RUNNING:
            return
        if self._state is not StoreState.LOADED:
            raise StoreError(f"start() needs a loaded store (state: {self._state.value})")
        self._flusher = FlushService(
            mode=self._config.flush_mode,
            interval_s=self._config.flush_interval_ms / 1000,
            flushed_offset=self._commitlog.max_offset,
            flush_commit_log=self._flush_commit_log,
            flush_all=self._flush_all,
            on_failure=self._fail,
            retry_s=self._retry_s,
        )
        self._flusher.start()
        self.guard.start()
        self._state = StoreState.RUNNING

    async def shutdown(self) -> None:
        """Stop the flush task, flush everything, write a clean checkpoint, close files."""
        previous, self._state = self._state, StoreState.SHUT_DOWN
        if previous in (StoreState.CREATED, StoreState.SHUT_DOWN):
            return
        flusher = self._flusher
        try:
            if flusher is not None:
                await flusher.stop()
            await self.guard.stop()
            try:
                # Also after a failure: whatever can still be made durable is, and the abort
                # file stays unless everything was, so the next start recovers from a checkpoint.
                self._cut_pending()
                cl_job, end = self._commitlog.full_flush_job()
                await self._in_thread(self._make_durable, cl_job, self._queues.full_flush_job(), end)
            except Exception as exc:
                raise StoreError(f"cannot make the store durable at shutdown ({describe(exc)}); not "
                                 "marking it clean: the next start recovers from the checkpoint") from exc
            if flusher is not None:
                flusher.flushed(end)
            await self._in_thread(self._abort.remove)
        finally:
            if flusher is not None:
                flusher.fail_all(StoreError("the store is shut down"))
            self._commitlog.close()
            self._queues.close()
            if self._executor is not None:
                self._executor.shutdown(wait=False)

    def _fail(self, exc: BaseException) -> None:
        self.guard.trip(exc)

    async def _repair(self) -> None:
        """The write guard's probe: finish a failed undo, then flush whatever a failed flush left."""
        self._cut_pending()
        end = await self._flush_all()
        if self._flusher is not None:
            self._flusher.flushed(end)

    def _undo_append(self, start: int, queue: ConsumeQueue) -> None:
        """Cut a batch that was not stored whole out of the consume queue and the commit log."""
        queue.truncate_from_commit_log_offset(start)
        files = queue.files()
        if files:  # entries a failed pwrite left past the file's known end
            files[-1].truncate(files[-1].size)
        self._commitlog.cut_back(start)

    def _cut_pending(self) -> None:
        if self._pending_cut is not None:
            self._undo_append(*self._pending_cut)
            self._pending_cut = None

    # -- flushing ------------------------------------------------------------------

    async def _in_thread(self, fn: Callable[..., object], *args: object) -> object:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _make_durable(
        self, cl_job: FlushJob, cq_job: FlushJob, end: int, *, allow_backwards: bool = False
    ) -> None:
        """Flush thread (or load): both logs first, then the checkpoint that vouches for them."""
        cl_job.run()
        cq_job.run()
        self._checkpoint.write(end, allow_backwards=allow_backwards)

    async def _flush_commit_log(self) -> int:
        async with self._flush_lock:
            job, end = self._commitlog.take_flush_job()
            if job:
                try:
                    await self._in_thread(job.run)
                except BaseException:
                    self._commitlog.restore_flush_job(job)
                    raise
            return end

    async def _flush_all(self) -> int:
        async with self._flush_lock:
            return await self._flush_all_locked()

    async def _flush_all_locked(self) -> int:
        cl_job, end = self._commitlog.take_flush_job()
        cq_job = self._queues.take_flush_job()
        if not cl_job and not cq_job and self._checkpoint.offset == end:
            return end
        try:
            await self._in_thread(self._make_durable, cl_job, cq_job, end)
        except BaseException:
            self._commitlog.restore_flush_job(cl_job)
            self._queues.restore_flush_job(cq_job)
            raise
        return end

    # -- writing -------------------------------------------------------------------

    async def put_messages(self, records: Sequence[MessageRecord]) -> list[PutResult]:
        """Append a batch of the broker's own records for one (topic, queue id), consecutive offsets.

        ASYNC flush: returns once the bytes reached the OS. SYNC flush: returns
        once an fsync covering them finished (shared with concurrent puts).
        """
        results = self.put_messages_now(records)
        await self.wait_durable(results[-1].commit_log_offset + results[-1].store_size)
        return results

    def put_messages_now(self, records: Sequence[MessageRecord]) -> list[PutResult]:
        """put_messages without waiting for durability: appended when it returns, so two calls in one step
        of the event loop land next to each other (a transaction's op record and its message)."""
        self._check_writable()
        if not records:
            raise InvalidArgumentError("a put needs at least one message")
        topic, queue_id = records[0].topic, records[0].queue_id
        _check_queue(topic, queue_id)
        for record in records:
            if record.topic != topic or record.queue_id != queue_id:
                raise InvalidArgumentError(
                    f"a batch goes to one queue: got {record.topic!r}/{record.queue_id} "
                    f"after {topic!r}/{queue_id}"
                )
        base = self.max_offset(topic, queue_id)
        store_timestamp = self._clock()
        batch = codec.encode_batch(
            records,
            first_queue_offset=base,
            store_timestamp=store_timestamp,
            max_message_size=self._config.max_message_size,
            max_record_size=self._commitlog.max_record_size,
        )
        positions = self._append(topic, queue_id, base, batch, [r.tags_code for r in records])
        return [
            PutResult(base + i, pos, store_timestamp, size)
            for i, (pos, size) in enumerate(zip(positions, batch.sizes, strict=True))
        ]

    def check_batch(self, topic: str, data: bytes | bytearray, count: int) -> batches.Checked | records.CheckedBatch:
        """A producer's batch checked whole, as append_records checks it (InvalidArgumentError)."""
        try:
            return batches.check_batch(data, count, topic=topic, max_message_size=self._config.max_message_size,
                                       max_record_size=self._commitlog.max_record_size)
        except records.RecordError as exc:
            raise InvalidArgumentError(str(exc)) from None

    def append_records(self, topic: str, queue_id: int, data: bytes | bytearray, count: int, *,
                       vet: Callable[[batches.Checked | records.CheckedBatch], None] | None = None,
                       before_write: Callable[[int, str], None] | None = None) -> RecordsPut:
        """Append a producer's record batch (tidemark.common.records layout) as it came off the wire.

        The batch is checked whole first (InvalidArgumentError, nothing stored),
        then stamped in place (queue id, queue offsets, store time; the commit
        log adds physical offsets and CRCs) and written with one write. Returns
        at once; `wait_durable(put.end)` waits for the fsync in SYNC mode.
        `before_write(first queue offset, first msg id)` runs once the batch is
        checked, before it is written (the idempotent producer's journal); if it
        raises, nothing is stored. So with `vet(checked)`, which runs first (a
        rule of the broker's on what a batch may carry).
        """
        self._check_writable()
        _check_queue(topic, queue_id)
        checked = self.check_batch(topic, data, count)
        if vet is not None:
            vet(checked)
        base = self.max_offset(topic, queue_id)
        if before_write is not None:
            before_write(base, checked.msg_ids[0])
        store_timestamp = self._clock()
        batch = batches.stamp(bytearray(data), checked, queue_id, base, store_timestamp)
        positions = self._append(topic, queue_id, base, batch, checked.tags_codes)
        return RecordsPut(base, checked.msg_ids, store_timestamp, int(positions[-1] + checked.sizes[-1]))

    def _append(self, topic: str, queue_id: int, base: int, batch: codec.EncodedBatch,
                tags_codes: Sequence[int]) -> Sequence[int]:
        """Write an encoded batch to the commit log and its entries to the consume queue."""
        queue = self._queues.get_or_create(topic, queue_id)
        start = self._commitlog.max_offset
        try:
            positions = self._commitlog.append(batch)
            queue.append(base, codec.queue_entries(positions, batch.sizes, tags_codes))
        except (StoreError, OSError) as exc:
            try:
                self._undo_append(start, queue)
            except (StoreError, OSError):
                self._pending_cut = (start, queue)  # the probe finishes it before writes resume
            self._fail(exc)
            raise self.guard.refusal() from exc
        self._dispatched(topic, queue_id)
        return positions

    def _dispatched(self, topic: str, queue_id: int) -> None:
        for listener in self._listeners:
            try:
                listener(topic, queue_id)
            except Exception:
                log.exception("dispatch listener %r failed", listener)

    # -- replication (broker/cluster/replication.py) ------------------------------------------

    def replication_chunk(self, offset: int, max_bytes: int) -> bytes:
        """Master: whole commit-log records from `offset` as stored (CommitLog.replication_chunk)."""
        self._readable()
        return self._commitlog.replication_chunk(offset, max_bytes)

    def append_replicated(self, offset: int, data: bytes) -> list[tuple[str, int]]:
        """Replica: store a master's records at the same commit-log offsets and index them in the
        consume queues, as recovery does; StoreError (nothing stored) when a record is damaged.
        Returns the (topic, queue id) pairs written to."""
        if self._state is not StoreState.RUNNING:
            raise StoreError(f"the message store is not running (state: {self._state.value})")
        touched: dict[tuple[str, int], None] = {}

        def index(topic: str, queue_id: int, queue_offset: int, phys: int, size: int, tags: int) -> None:
            self._queues.get_or_create(topic, queue_id).ensure_entry(queue_offset, phys, size, tags)
            touched[(topic, queue_id)] = None

        self._commitlog.append_replicated(offset, data, index)
        for topic, queue_id in touched:
            self._dispatched(topic, queue_id)
        return list(touched)

    @property
    def commit_log(self) -> CommitLog:
        """The commit log, for what replication compares between two logs (broker/cluster/divergence.py)."""
        return self._commitlog

    async def truncate_to(self, end: int) -> int:
        """Replica: drop every record at or past `end` (a tail its master does not have); the bytes
        dropped. The checkpoint moves back with it (under the flush lock, so a flush taken before the cut
        cannot put it forward again): recovery after a crash then scans from a record boundary.
        TruncateBelowOldestError, nothing changed, for an `end` below the oldest record."""
        async with self._flush_lock:
            self._commitlog.check_cut_back(min(end, self._commitlog.max_offset))  # before anything changes
            dropped = max(0, self._commitlog.max_offset - end)
            if dropped:
                for queue in self._queues:
                    queue.truncate_from_commit_log_offset(end)
                self._commitlog.cut_back(end)
                if (self._checkpoint.offset or 0) > end:
                    await self._in_thread(functools.partial(self._checkpoint.write, end, allow_backwards=True))
                log.warning("commit log truncated to the master's end", event="replica_truncated", offset=end,
                            dropped_bytes=dropped)
            return dropped

    async def wait_durable(self, end_offset: int) -> None:
        """SYNC flush: wait until the commit log is fsynced up to end_offset (ASYNC: at once)."""
        if self._config.flush_mode is FlushMode.SYNC:
            await self._flusher.wait_flushed(end_offset)

    def _check_writable(self) -> None:
        if self._state is not StoreState.RUNNING:
            raise StoreError(f"the message store is not running (state: {self._state.value})")
        self.guard.check()

    def add_dispatch_listener(self, listener: DispatchListener) -> None:
        """listener(topic, queue_id), called on the loop thread after each put."""
        self._listeners.append(listener)

    # -- reading -------------------------------------------------------------------

    def _readable(self) -> None:
        if self._state not in (StoreState.LOADED, StoreState.RUNNING):
            raise StoreError(f"the message store is not open (state: {self._state.value})")

    def get_messages(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        *,
        matcher: Callable[[int], bool] | None = None,
        exact_matcher: Callable[[StoredMessage], bool] | None = None,
        properties_filter: Callable[[Mapping[str, str]], bool] | None = None,
        max_scan: int = 2000,
    ) -> GetResult:
        """Up to max_count matching messages from `offset`, examining at most max_scan entries (reads.py);
        a properties_filter (an SQL92 subscription) sees each record's properties before it is decoded."""
        self._readable()
        if offset < 0 or max_count < 1 or max_scan < 1:
            raise InvalidArgumentError(
                f"offset {offset} must be >= 0, max_count {max_count} and max_scan {max_scan} >= 1"
            )
        return reads.get_messages(self._queues.get(topic, queue_id), self._commitlog, offset, max_count,
                                  matcher=matcher, exact_matcher=exact_matcher, properties_filter=properties_filter,
                                  max_scan=max_scan, follower=self.follower, limit=self.read_limit())

    def read_records(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        *,
        max_count: int,
        max_bytes: int,
        tags_codes: frozenset[int] | None = None,
        properties_filter: Callable[[Mapping[str, str]], bool] | None = None,
        max_scan: int = 2000,
    ) -> RawRead:
        """Up to max_count records (and max_bytes, at least one record) from `offset`, as stored (reads.py);
        with a properties_filter (an SQL92 subscription) only the records whose properties it accepts."""
        self._readable()
        if offset < 0 or max_count < 1 or max_bytes < 1 or max_scan < 1:
            raise InvalidArgumentError(
                f"offset {offset} must be >= 0, max_count {max_count}, max_bytes {max_bytes} and "
                f"max_scan {max_scan} >= 1"
            )
        return reads.read_records(self._queues.get(topic, queue_id), self._commitlog, offset, max_count=max_count,
                                  max_bytes=max_bytes, tags_codes=tags_codes, properties_filter=properties_filter,
                                  max_scan=max_scan, follower=self.follower, limit=self.read_limit())

    def min_offset(self, topic: str, queue_id: int) -> int:
        queue = self._queues.get(topic, queue_id)
        return queue.min_offset if queue is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The next queue offset to be assigned."""
        queue = self._queues.get(topic, queue_id)
        return queue.max_offset if queue is not None else 0

    def readable_max_offset(self, topic: str, queue_id: int) -> int:
        """Where readers see the queue end: max_offset, or less under a `read_limit`."""
        return reads.readable_high(self._queues.get(topic, queue_id), self.read_limit())

    def remove_dispatch_listener(self, listener: DispatchListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _entry(self, topic: str, queue_id: int, offset: int) -> tuple[int, int, int] | None:
        self._readable()
        queue = self._queues.get(topic, queue_id)
        if queue is None or not queue.min_offset <= offset < queue.max_offset:
            return None
        return queue.entry_at(offset)

    def store_timestamp_at(self, topic: str, queue_id: int, offset: int) -> int | None:
        entry = self._entry(topic, queue_id, offset)
        return self._commitlog.read_store_timestamp(entry[0]) if entry is not None else None

    def message_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        entry = self._entry(topic, queue_id, offset)
        if entry is None or entry[0] < self._commitlog.min_offset:
            return None
        return self._commitlog.read_message(entry[0], entry[1])

    def search_offset_by_timestamp(self, topic: str, queue_id: int, timestamp: int) -> int:
        """First offset in [min, max) stored at or after `timestamp`; max when there is none."""
        self._readable()
        return reads.offset_at_time(self._queues.get(topic, queue_id), self._commitlog, timestamp)

    def read_message(self, commit_log_offset: int) -> StoredMessage | None:
        """The message whose record starts at this commit-log offset, if any."""
        self._readable()
        if not self._commitlog.min_offset <= commit_log_offset < self._commitlog.max_offset:
            return None
        return self._commitlog.read_message(commit_log_offset)

    # -- administration ------------------------------------------------------------

    async def delete_topic(self, topic: str) -> None:
        """Remove the topic's consume queues; a re-created topic starts at offset 0.

        A tombstone in the checkpoint keeps recovery from re-dispatching the
        old records still in the commit log. The queues leave the table at once
        (on the loop); the tombstone and the directory's removal are written in
        the flush thread, in order with the checkpoint writes, never on the loop.
        """
        self._readable()
        if (
            topic not in self._queues.topics()
            and not (self._config.data_dir / "consumequeue" / topic).exists()
        ):
            return
        at = self._commitlog.max_offset
        self._queues.detach_topic(topic)
        await self._in_thread(self._remove_topic_files, topic, at)
        log.info("deleted topic from the store", event="store_topic_deleted", topic=topic)

    def _remove_topic_files(self, topic: str, at: int) -> None:
        self._checkpoint.add_tombstone(topic, at)
        self._queues.remove_topic_dir(topic)

    def delete_expired_segments(self, *, force: bool = False) -> int:
        """Delete commit-log segments older than file_reserved_hours (all but the active
        one when forced) and move consume-queue min offsets past them."""
        self._readable()
        deleted = self._commitlog.delete_expired(
            now_s=time.time(), reserved_s=self._config.file_reserved_hours * 3600, force=force
        )
        if deleted:
            for queue in self._queues:
                queue.correct_min_offset(self._commitlog.min_offset)
        return deleted

    def topics(self) -> list[str]:
        return self._queues.topics()

    def queue_ids(self, topic: str) -> list[int]:
        return self._queues.queue_ids(topic)

    @property
    def commit_log_min_offset(self) -> int:
        return self._commitlog.min_offset

    @property
    def commit_log_max_offset(self) -> int:
        return self._commitlog.max_offset

    def store_size_bytes(self) -> int:
        return self._commitlog.size_bytes() + self._queues.size_bytes()


def _check_queue(topic: str, queue_id: int) -> None:
    try:
        check_topic_name(topic)
    except InvalidNameError as exc:
        raise InvalidArgumentError(str(exc)) from None
    if type(queue_id) is not int or not 0 <= queue_id <= _MAX_QUEUE_ID:
        raise InvalidArgumentError(
            f"queue id {queue_id!r} must be an integer between 0 and {_MAX_QUEUE_ID}"
        )
