"""Executor side: the messages [start, end) of one queue as Arrow record batches.

A RecordReader is created here, inside a Python worker; nothing of it is
pickled. It streams stored records from the broker without a group; frames
are gathered into batches of about BATCH_ROWS rows (at most about
BATCH_BYTES) and converted to Arrow in bulk (arrow.records_to_batch) while
the reader's loop thread receives the next frames (the broker keeps a window
of frames ahead of the task). A task of several ranges has the next range
opened once the broker has sent the current one's last records (the reader's
`then`), so its first window fills while the task converts the current one.

Spark tasks keep one reader per Python worker process (`keep_reader`, as
Spark's Kafka source keeps a consumer pool per executor): a worker runs one
task after another, and each task's reader cost a connection, a discovery
call and a fetch stream, 4 to 60 ms, which a 50,000-row micro-batch task
felt. The kept reader is the worker's only one: a task with other brokers,
credentials or TLS settings shuts it down and keeps its own instead, a task
that fails shuts it down, and so does a task that leaves a read open. Before
each task the reader asks where each broker it has a stream to is served now
(and follows the cluster's moves meanwhile): a master replaced, failed over or
back is read at its current address. An idle reused worker keeps its loop
thread, connection and fetch stream until Spark reaps the worker (idle
workers are reaped after a minute) or the SparkContext stops; not when the
query that used them ends. PySpark's workers end with os._exit or SIGKILL,
which close their sockets. TLS files and secret files are read when the
connection is made: a rotation is picked up by the next new connection (a new
worker, or a reader opened again after a failure). Offsets are
checked per batch: a gap (retention deleted messages while the task ran) or a
queue that no longer reaches `end` (re-created) is data loss, handled per
failOnDataLoss. Tags are filtered here, not by the broker: a broker-side
filter would skip offsets, which the gap check could not tell from data loss.
While no broker answers (a restart of any length), the task waits for one;
pollTimeoutMs bounds only a broker that answers but cannot deliver.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tidemark.client import Admin
from tidemark.client.consumer.record_reader import QueueEndedError, RecordChunk, RecordReader
from tidemark.client.errors import RequestTimeoutError, TidemarkError, UnavailableError
from tidemark.client.message import MessageQueue
from tidemark.common.logs import get_logger
from tidemark.common.protocol import parse_tag_expression
from tidemark.spark_connector.arrow import records_to_batch
from tidemark.spark_connector.offsets import DataLossError, OffsetRange, check_start, describe_loss
from tidemark.spark_connector.options import Security, describe_servers

log = get_logger("tidemark.spark")

BATCH_ROWS = 8192
# A batch's records must stay under 2 GiB (arrow._slices); far less keeps a task's memory small.
BATCH_BYTES = 64 * 1024 * 1024
POLL_STEP_S = 1.0
BROKER_WAIT_MAX_S = 10.0


@dataclass(frozen=True, slots=True)
class FetchSettings:
    brokers: str
    fail_on_data_loss: bool
    poll_timeout_s: float
    tag_expression: str = "*"
    security: Security = Security()
    namesrv: tuple[str, ...] = ()  # when set, the brokers are found through these name servers

    def client_kwargs(self) -> dict[str, Any]:
        # namesrv always goes along (even empty): the driver's choice, not the executor's $TIDEMARK_NAMESRV.
        return {"brokers": self.brokers, "namesrv": self.namesrv, **self.security.client_kwargs()}

    @property
    def servers(self) -> str:
        return describe_servers(tuple(self.brokers.split(",")), self.namesrv)


def fetch_range(settings: FetchSettings, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Record batches of rng in offset order (filtered by tag expression); every offset once."""
    return fetch_ranges(settings, (rng,))


def fetch_ranges(settings: FetchSettings, ranges: Sequence[OffsetRange], *,
                 keep_reader: bool = False) -> Iterator[pa.RecordBatch]:
    """fetch_range of each range in turn, through one reader (one connection for the task), each next
    range opened while the current one drains. keep_reader: take the process's kept reader and keep it
    for the next call (Spark tasks; see the module doc); otherwise the reader is shut down at the end."""
    ranges = [r for r in ranges if r.size > 0]
    if not ranges:
        return
    tags = parse_tag_expression(settings.tag_expression)
    wanted = None if tags.matches_all else pa.array(sorted(tags.tags), pa.string())
    opened = _KEPT.use(settings, ranges[0]) if keep_reader else _open_reader(settings, ranges[0])
    with opened as reader:
        try:
            for rng, then in zip(ranges, [*ranges[1:], None], strict=True):
                for batch in _read_range(reader, settings, rng, then):
                    if wanted is not None:
                        batch = batch.filter(pc.fill_null(pc.is_in(batch.column("tags"), value_set=wanted), False))
                    if batch.num_rows:
                        yield batch
        finally:
            reader.discard_ahead()  # a range opened ahead that a stopped task will not read


def _read_range(reader: RecordReader, settings: FetchSettings, rng: OffsetRange,
                then: OffsetRange | None = None) -> Iterator[pa.RecordBatch]:
    start = rng.start
    while start < rng.end:
        try:
            yield from _read(reader, settings, rng, start, then)
            return
        except QueueEndedError:
            low, high = _bounds(settings, rng.mq)
            restart = check_start(rng.mq, start, low, high, fail_on_data_loss=settings.fail_on_data_loss)
            if restart == start or restart >= rng.end or (restart == low and start > high):
                # Nothing of this range survives (or the queue was re-created: later batches read it).
                return
            start = restart


def _read(reader: RecordReader, settings: FetchSettings, rng: OffsetRange, start: int,
          then: OffsetRange | None = None) -> Iterator[pa.RecordBatch]:
    expected = start
    pending: list[RecordChunk] = []
    rows = size = 0
    deadline = time.monotonic() + settings.poll_timeout_s
    ahead = None if then is None else (then.mq, then.start, then.end)
    for chunk in reader.read(rng.mq, start, rng.end, poll_timeout_s=POLL_STEP_S, then=ahead):
        if chunk is None:
            if time.monotonic() >= deadline:
                if _stalled(settings, rng, expected) >= rng.end:
                    return
                deadline = time.monotonic() + settings.poll_timeout_s
            continue
        deadline = time.monotonic() + settings.poll_timeout_s
        if chunk.count:
            pending.append(chunk)
            rows += chunk.count
            size += len(chunk.data)
        if rows >= BATCH_ROWS or size >= BATCH_BYTES or (chunk.next_offset >= rng.end and pending):
            batch, expected = _convert(settings, rng, pending, rows, expected)
            pending, rows, size = [], 0, 0
            if batch.num_rows:
                yield batch
        if expected >= rng.end:
            return
    if pending:
        batch, _ = _convert(settings, rng, pending, rows, expected)
        if batch.num_rows:
            yield batch


def _convert(settings: FetchSettings, rng: OffsetRange, chunks: list[RecordChunk], rows: int,
             expected: int) -> tuple[pa.RecordBatch, int]:
    """Chunks as one batch trimmed to [expected, end), with the gap check; returns the next expected offset."""
    data = chunks[0].data if len(chunks) == 1 else b"".join(c.data for c in chunks)
    batch = records_to_batch(data, rows, topic=rng.mq.topic, broker=rng.mq.broker_name)
    offsets = batch.column("queue_offset").to_numpy()
    keep = (offsets >= expected) & (offsets < rng.end)
    kept = offsets[keep]
    if len(kept):
        # Consecutive offsets from `expected`; any hole is messages that disappeared under the read.
        holes = np.flatnonzero(np.diff(np.concatenate(([expected - 1], kept))) != 1)
        for i in holes:
            _gap(settings, rng.mq, int(expected if i == 0 else kept[i - 1] + 1), int(kept[i]))
        expected = int(kept[-1]) + 1
    if not keep.all():
        batch = batch.filter(pa.array(keep))
    return batch, expected


def _gap(settings: FetchSettings, mq: MessageQueue, expected: int, got: int) -> None:
    message = (f"{mq}: offsets {expected}..{got - 1} disappeared while the task was reading (retention "
               f"deleted them)")
    if settings.fail_on_data_loss:
        raise DataLossError(f"{message}. Set option failOnDataLoss=false to skip lost messages.")
    log.warning("tidemark data loss while reading", event="data_loss", detail=message)


@contextlib.contextmanager
def _open_reader(settings: FetchSettings, rng: OffsetRange) -> Iterator[RecordReader]:
    """A started RecordReader, shut down on exit."""
    reader = _start_reader(settings, rng)
    try:
        yield reader
    finally:
        reader.shutdown()


class KeptReader:
    """The one RecordReader a process keeps between Spark tasks (see the module doc), for the settings
    it was opened with. Thread-safe: a reader in use is out of the slot, so a second caller at the
    same time opens its own (the one returned last is kept, the other shut down)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._slot: tuple[FetchSettings, RecordReader] | None = None

    @contextlib.contextmanager
    def use(self, settings: FetchSettings, rng: OffsetRange) -> Iterator[RecordReader]:
        reader = self._take(settings) or _start_reader(settings, rng)
        try:
            yield reader
        except GeneratorExit:  # the task stopped reading early: its handles are closed, the reader is sound
            self._keep(settings, reader)
            raise
        except BaseException:
            reader.shutdown()
            raise
        self._keep(settings, reader)

    def close(self) -> None:
        """Shut the kept reader down (the next task opens one again)."""
        with self._lock:
            slot, self._slot = self._slot, None
        if slot is not None:
            slot[1].shutdown()

    def _take(self, settings: FetchSettings) -> RecordReader | None:
        with self._lock:
            slot, self._slot = self._slot, None
        if slot is None:
            return None
        kept_for, reader = slot
        if _same_client(kept_for, settings) and reader.running:
            try:
                reader.refresh()  # streams to an address that no longer serves their broker are dropped
            except TidemarkError as e:  # its loop did not answer in time: a new reader
                log.warning("the kept reader did not answer; opening another", event="kept_reader_dropped",
                            error=e)
            else:
                return reader
        reader.shutdown()  # other brokers or credentials: this worker now reads for another source
        return None

    def _keep(self, settings: FetchSettings, reader: RecordReader) -> None:
        # A read left open (a handle whose open completed after its caller gave up waiting) would hold
        # its window for the worker's life: such a reader is not kept.
        try:
            idle = reader.idle()
        except TidemarkError:
            idle = False
        if not idle:
            reader.shutdown()
            return
        with self._lock:
            slot, self._slot = self._slot, (settings, reader)
        if slot is not None:
            slot[1].shutdown()


def _same_client(a: FetchSettings, b: FetchSettings) -> bool:
    return a.client_kwargs() == b.client_kwargs()


_KEPT = KeptReader()


def _start_reader(settings: FetchSettings, rng: OffsetRange) -> RecordReader:
    """A started RecordReader. While no broker answers, the task waits for one (backing off up to
    BROKER_WAIT_MAX_S) rather than fail: a broker restart of any length costs time, not the query."""
    delay = POLL_STEP_S
    while True:
        try:
            reader = RecordReader(**settings.client_kwargs()).start()
            break
        except UnavailableError as e:
            if not e.retriable:  # a refused TLS handshake: waiting cannot help
                raise
            _waiting_for_broker(rng, e)
        time.sleep(delay)
        delay = min(delay * 2, BROKER_WAIT_MAX_S)
    return reader


def _waiting_for_broker(rng: OffsetRange, error: UnavailableError) -> None:
    log.warning("no broker answers; the read waits for one", event="fetch_broker_unreachable", queue=str(rng.mq),
                error=error)


def _stalled(settings: FetchSettings, rng: OffsetRange, expected: int) -> int:
    """No message for poll_timeout: decide between data loss and a broker that cannot deliver. While
    no broker answers, keep waiting (`expected`: nothing decided), as the reader keeps reopening."""
    try:
        low, high = _bounds(settings, rng.mq)
    except UnavailableError as e:
        if not e.retriable:
            raise
        _waiting_for_broker(rng, e)
        return expected
    if high < rng.end or expected < low:
        message = describe_loss(rng.mq, rng.end if high < rng.end else expected, low, high)
        if settings.fail_on_data_loss:
            raise DataLossError(f"{message} (reading [{rng.start}, {rng.end}) stopped at {expected}). "
                                f"Set option failOnDataLoss=false to skip lost messages.")
        log.warning("tidemark data loss while reading", event="data_loss", detail=message)
        return rng.end
    raise RequestTimeoutError(f"{rng.mq}: no message at offset {expected} within {settings.poll_timeout_s:.0f}s "
                       f"(reading [{rng.start}, {rng.end}); queue offsets [{low}, {high}]) from {settings.servers}; "
                       f"raise option pollTimeoutMs or check the broker")


def _bounds(settings: FetchSettings, mq: MessageQueue) -> tuple[int, int]:
    with Admin(**settings.client_kwargs()) as admin:
        return admin.offsets([mq])[mq]
