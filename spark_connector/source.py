"""The "tidemark" Python data source: batch and streaming reads, batch and streaming writes.

Planning (reader construction, partitions, offsets, commit) runs in Python
workers on the driver; read() and write() run in tasks on executors. Every
object here pickles as options, offsets and plain values: read() and write()
open the network clients they need and close them before returning, and a
stream's planning keeps one Admin for the query (planner.PlanningClient), which
is not pickled.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidemark.client.message import MessageQueue
from tidemark.spark_connector import planner
from tidemark.spark_connector.admission import TriggerGate
from tidemark.spark_connector.arrow import SCHEMA
from tidemark.spark_connector.fetch import FetchSettings, fetch_ranges
from tidemark.spark_connector.offsets import OffsetRange
from tidemark.spark_connector.options import (
    OptionError,
    ReadOptions,
    check_read_options,
    parse_read_options,
    parse_write_options,
)
from tidemark.spark_connector.sink import TidemarkStreamWriter, TidemarkWriter, check_write_schema
from tidemark.spark_connector.user_errors import option_errors_in_one_line


@dataclass(frozen=True)
class QueueRangePartition(InputPartition):
    """Messages [start, end) of one queue: one Spark task."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int

    @classmethod
    def of(cls, r: OffsetRange) -> QueueRangePartition:
        return cls(r.mq.topic, r.mq.broker_name, r.mq.queue_id, r.start, r.end)

    @property
    def range(self) -> OffsetRange:
        return OffsetRange(MessageQueue(self.topic, self.broker, self.queue_id), self.start, self.end)


@dataclass(frozen=True)
class QueueRangesPartition(InputPartition):
    """Several ranges read one after another by one Spark task (a micro-batch's ranges packed into one
    wave of the task slots: planner.stream_tasks)."""

    ranges: tuple[QueueRangePartition, ...]


# Set by register() to the application's default parallelism when it registers the source (a user may
# set it instead, as spark.executorEnv.TIDEMARK_SPARK_TASK_SLOTS, before registering).
TASK_SLOTS_ENV = "TIDEMARK_SPARK_TASK_SLOTS"


def task_slots() -> int | None:
    """How many tasks the application runs at once, as register() saw it; None when unknown."""
    try:
        slots = int(os.environ.get(TASK_SLOTS_ENV, ""))
    except ValueError:
        return None
    return slots if slots >= 1 else None


def _partition(ranges: tuple[OffsetRange, ...]) -> InputPartition:
    parts = tuple(QueueRangePartition.of(r) for r in ranges)
    return parts[0] if len(parts) == 1 else QueueRangesPartition(parts)


def _check_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise OptionError(f"the tidemark source has a fixed schema; do not set one with .schema(). "
                          f"Expected {SCHEMA.simpleString()}, got {schema.simpleString()}")


def read_partition(options: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """Executor side: the partition's messages as Arrow record batches (about fetch.BATCH_ROWS rows each)."""
    if isinstance(partition, QueueRangePartition):
        ranges = [partition.range]
    elif isinstance(partition, QueueRangesPartition):
        ranges = [p.range for p in partition.ranges]
    else:
        return  # Spark's placeholder partition when a batch read has no range
    _freeze_worker_heap()
    settings = FetchSettings(brokers=options.brokers_csv, namesrv=options.namesrv,
                             fail_on_data_loss=options.fail_on_data_loss, poll_timeout_s=options.poll_timeout_s,
                             tag_expression=options.tag_expression, security=options.security)
    yield from fetch_ranges(settings, ranges, keep_reader=True)


_heap_frozen = False


def _freeze_worker_heap() -> None:
    """Once per Python worker: keep what the process holds now (modules of pyarrow, numpy, grpc,
    protobuf, this client; about 60,000 objects) out of the garbage collector's passes.

    PySpark's worker daemon runs gc.collect() after every task (pyspark/daemon.py), a full pass over
    every object of the process: about 40 ms of CPU a task on the bench machine, most of a 25,000-row
    micro-batch task's own CPU. What tasks create afterwards is collected as before; what is frozen
    now stays until the worker exits, as modules do anyway. (A flag, not gc.get_freeze_count(), says
    whether it was done: that count walks the frozen objects, 3 ms and more a task.)"""
    global _heap_frozen
    if not _heap_frozen:
        gc.freeze()
        _heap_frozen = True


class TidemarkBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    @option_errors_in_one_line()
    def partitions(self) -> list[InputPartition]:
        return [QueueRangePartition.of(r) for r in planner.plan_batch(self.options)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)


class TidemarkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over queue offsets; offsets are {"topic": {"broker": {"queueId": offset}}}."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._client = planner.PlanningClient(options)
        self._target: dict | None = None  # Trigger.AvailableNow: offsets not to go past
        self._latest: dict | None = None  # for reportLatestOffset
        self._committed: dict | None = None  # last offsets committed to the group
        min_rows = options.min_offsets_per_trigger
        self._gate = None if min_rows is None else TriggerGate(min_rows, options.max_trigger_delay_s)

    @option_errors_in_one_line()
    def initialOffset(self) -> dict:
        return planner.initial_offsets(self._client)

    def getDefaultReadLimit(self) -> ReadLimit:
        # Not ReadAllAvailable when minOffsetsPerTrigger is set: that limit means Trigger.Once, which
        # reads everything at once (Kafka's rule); the gate itself lives here, not in the limit.
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return super().getDefaultReadLimit()

    @option_errors_in_one_line()
    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        # Spark asks for the next batch only once the batch ending at `start` is done, but calls
        # commit(end) for a batch only when it plans the one after it: the last batch of a run
        # (Trigger.AvailableNow, or a stream that went idle) would never reach the group.
        self._commit(start)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        # Trigger.AvailableNow and Trigger.Once read what is there without waiting for more.
        gate = None if self._target is not None or isinstance(limit, ReadAllAvailable) else self._gate
        end, self._latest = planner.next_offsets(self._client, start, max_rows=max_rows, target=self._target,
                                                 gate=gate)
        return end

    def reportLatestOffset(self) -> dict | None:
        return self._latest

    @option_errors_in_one_line()
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = planner.latest_offsets(self._client)

    @option_errors_in_one_line()
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [_partition(t) for t in planner.stream_tasks(self.options, start, end, task_slots())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self.options, partition)

    def commit(self, end: dict) -> None:
        self._commit(end)

    def stop(self) -> None:
        self._client.close()

    def _commit(self, end: dict) -> None:
        if end != self._committed and planner.commit_offsets(self._client, end):
            self._committed = end


class RejectedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """What streamReader() returns for options a stream cannot take (an ending* option): Spark's first
    call fails with the OptionError. Raised from streamReader() itself, the error would be followed by
    an UnboundLocalError: PySpark 4.3's stream runner calls stop() in a `finally` on the reader it never
    got. The same bases as TidemarkStreamReader, so Spark plans the same stream whichever it gets."""

    def __init__(self, error: OptionError) -> None:
        self.error = error

    @option_errors_in_one_line()
    def _fail(self) -> NoReturn:
        raise self.error

    def initialOffset(self) -> dict:
        self._fail()

    def getDefaultReadLimit(self) -> ReadLimit:
        self._fail()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self._fail()

    def prepareForTriggerAvailableNow(self) -> None:
        self._fail()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        self._fail()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        self._fail()

    def commit(self, end: dict) -> None:
        self._fail()


class TidemarkDataSource(DataSource):
    """spark.read / readStream / write / writeStream .format("tidemark"); see spark_connector.

    Every method Spark calls to plan checks the options it needs and fails with an OptionError that
    PySpark reports as its one-line message (user_errors): load() for what holds for any read, the
    query's planning for what depends on batch versus streaming, save() and a stream's start for writes.
    """

    @classmethod
    def name(cls) -> str:
        return "tidemark"

    @option_errors_in_one_line()
    def schema(self) -> StructType:
        # Spark asks for the schema at spark.read/readStream...load() (not for writes, which bring the
        # DataFrame's): checking the options here makes a bad one fail load(), not a task or the
        # stream's thread. Whether the read is batch or streaming is known only later, in reader().
        check_read_options(self.options)
        return SCHEMA

    @option_errors_in_one_line()
    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return TidemarkBatchReader(parse_read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            _check_schema(schema)
            return TidemarkStreamReader(parse_read_options(self.options, streaming=True))
        except OptionError as e:
            return RejectedStreamReader(e)

    @option_errors_in_one_line()
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise OptionError("the tidemark sink only appends messages; use mode('append')")
        check_write_schema(schema)
        return TidemarkWriter(parse_write_options(self.options))

    @option_errors_in_one_line()
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Complete output mode re-sends every result row each micro-batch, as Kafka's sink does.
        check_write_schema(schema)
        return TidemarkStreamWriter(parse_write_options(self.options))
