"""Writes: df.write / df.writeStream .format("tidemark") produce every row as a message.

Columns: body (binary or string, required), keys, tags (string), properties
(map<string,string>), queue_id (int: send to that queue) and broker (string:
the broker of queue_id, needed only when the topic lives on several brokers).
Other columns are ignored, so a DataFrame read from one topic can be written to
another. Rows are sent in batches (one queue per batch, queues round-robin from
the task's partition number, so the tasks running together write to different
queues); a failed send fails the task with the broker's message. Without
properties and queue_id columns a record batch is encoded whole, column by
column (spark_connector/encode.py: no Python object per row), and up to
IN_FLIGHT batches are on their way at once (an idempotent producer keeps each
queue's in order, up to five per queue).

Exactly once (option idempotent, on by default): each task writes through an
idempotent producer whose key names what it writes: the query and partition
for a micro-batch (with the batch id as the producer epoch), the write job and
partition for df.write. A task that runs again after a failure, or a
micro-batch replayed from the checkpoint after a crash, sends the same rows in
the same batches to the same queues with the same sequences, so the broker
answers what it already holds as duplicates and stores only the rest. That
needs the task's rows to come in the same order each time (true for a
tidemark source, whose micro-batches are fixed offset ranges, and for any
plan without a shuffle of non-deterministic order) and the topic's queues not
to change in between. With idempotent=false a retried task stores its rows
again (at-least-once).
"""

from __future__ import annotations

import collections
import concurrent.futures
import gc
import random
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from tidemark.client import Message, MessageQueue, MessageQueueSelector, Producer
from tidemark.client.errors import InvalidArgumentError, TidemarkError
from tidemark.common.protocol import MessageIdGenerator, PropertyKey
from tidemark.common.records import RecordBatchBuilder, encode_properties
from tidemark.spark_connector.encode import RecordEncoder, record_view
from tidemark.spark_connector.options import OptionError, WriteOptions

# Rows a request: the broker pays a fixed cost per request (gRPC's intake and answer, the check's and
# append's numpy calls), so 2,048 rows of 200 bytes (about 540 KB) cost it 5 to 33 % less CPU a row than
# 512 in the same rounds; 4,096 gained no more (docs/benchmarks.md, issue 33, fifth pass). At most 1 MiB a
# request, which the broker serves from its heap (broker/memory.py).
MAX_BATCH_MESSAGES = 2048
MAX_BATCH_BYTES = 1024 * 1024
# Batches of a task on their way at once (over the topic's queues; the producer allows 5 per queue):
# at most IN_FLIGHT * MAX_BATCH_BYTES (16 MiB) of a task's records unanswered.
IN_FLIGHT = 16

_COLUMN_TYPES: dict[str, tuple[tuple[type[DataType], ...], str]] = {
    "body": ((BinaryType, StringType), "binary or string"),
    "keys": ((StringType,), "string"),
    "tags": ((StringType,), "string"),
    "queue_id": ((IntegerType, LongType, ShortType, ByteType), "an integer type"),
    "broker": ((StringType,), "string"),
}


def check_write_schema(schema: StructType) -> None:
    """Fail at planning when body is missing or a known column has the wrong type."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "body" not in fields:
        raise OptionError(f"the DataFrame written to tidemark needs a 'body' column (binary or string); "
                          f"it has {', '.join(fields) or 'no columns'}")
    for name, (types, label) in _COLUMN_TYPES.items():
        if name in fields and not isinstance(fields[name], types):
            raise OptionError(f"column {name!r} written to tidemark must be {label}, not {fields[name].simpleString()}")
    props = fields.get("properties")
    if props is not None and not (isinstance(props, MapType) and isinstance(props.keyType, StringType)
                                  and isinstance(props.valueType, StringType)):
        raise OptionError(f"column 'properties' written to tidemark must be map<string,string>, "
                          f"not {props.simpleString()}")


class _RoundRobin(MessageQueueSelector):
    """Spreads batches over the topic's writable queues, from the queue of the task's partition number, so
    tasks running together write to different queues (random outside a Spark task). A replayed task sends
    the same batches to the same queues."""

    def __init__(self, start: int | None = None) -> None:
        self._next = random.randrange(1 << 30) if start is None else start - 1

    def select(self, mqs: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
        self._next += 1
        return mqs[self._next % len(mqs)]


class _Fixed(MessageQueueSelector):
    """The queue a row's queue_id (and broker) names."""

    def select(self, mqs: Sequence[MessageQueue], message: Message, arg: Any) -> MessageQueue:
        broker, queue_id = arg
        matches = [q for q in mqs if q.queue_id == queue_id and (broker is None or q.broker_name == broker)]
        if len(matches) == 1:
            return matches[0]
        topic = mqs[0].topic if mqs else message.topic
        if not matches:
            raise InvalidArgumentError(f"topic {topic!r} has no writable queue {queue_id}"
                                       + (f" on broker {broker!r}" if broker else ""))
        raise InvalidArgumentError(f"queue_id {queue_id} of topic {topic!r} exists on brokers "
                                   f"{', '.join(q.broker_name for q in matches)}; add a 'broker' column")


@dataclass
class TidemarkCommitMessage(WriterCommitMessage):
    messages: int


def _column(batch: pa.RecordBatch, name: str) -> list | None:
    index = batch.schema.get_field_index(name)
    return batch.column(index).to_pylist() if index >= 0 else None


def _rows(batch: pa.RecordBatch, topic: str, first_row: int) -> Iterator[tuple[Any, Message, int]]:
    """(target queue or None, message, row number) for every row of a record batch."""
    n = batch.num_rows
    bodies = _column(batch, "body")
    keys = _column(batch, "keys") or [None] * n
    tags = _column(batch, "tags") or [None] * n
    props = _column(batch, "properties") or [None] * n
    queue_ids = _column(batch, "queue_id") or [None] * n
    brokers = _column(batch, "broker") or [None] * n
    for i in range(n):
        body = bodies[i]  # type: ignore[index]
        if body is None:
            raise InvalidArgumentError(f"tidemark sink: row {first_row + i} has a null body")
        properties = dict(props[i]) if props[i] else {}
        if None in properties.values():
            raise InvalidArgumentError(f"tidemark sink: row {first_row + i} has a null value in properties "
                             f"{sorted(k for k, v in properties.items() if v is None)}")
        message = Message(topic=topic, body=body, tags=tags[i] or "", keys=keys[i] or "", properties=properties)
        target = None if queue_ids[i] is None else (brokers[i], int(queue_ids[i]))
        yield target, message, first_row + i


_PAIR = 2  # a property's separators: `key\x01value\x02`
_TAGS_PAIR = len(PropertyKey.TAGS) + _PAIR
_KEYS_PAIR = len(PropertyKey.KEYS) + _PAIR
_UNIQ_SIZE = len(MessageIdGenerator().next())  # a generated id, ASCII hex, one length


def _utf8_size(text: str) -> int:
    """A str's size in UTF-8, as the record holds it: its length when ASCII (str.isascii reads a flag the
    str keeps, no copy), else encoded (an emoji is 4 bytes, 1 character)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _record_fixed_size(topic: str, born_host: str) -> int:
    """The bytes every record of the topic holds whatever its row: the header, born host and topic, the
    parts' lengths and the UNIQ_KEY property, sized by the client's own encoder (one empty record)."""
    uniq = encode_properties({PropertyKey.UNIQ_KEY: MessageIdGenerator().next()})
    return RecordBatchBuilder(topic, born_host).append(b"", uniq)


def _row_size(message: Message) -> int:
    """A row's bytes in its record beyond the fixed part, in UTF-8 as encoded: the body and its tags, keys
    and properties (each a `key\x01value\x02` pair), so a batch of rows with large or non-ASCII properties
    stays within MAX_BATCH_BYTES as the producer encodes it. Counted as `encode_message` merges them: the
    tags and keys fields replace a TAGS or KEYS property, and a UNIQ_KEY property replaces the generated
    id the fixed part counts."""
    size = len(message.body)  # bytes: Message encodes a str body
    if not message.properties:
        if message.tags:
            size += _TAGS_PAIR + _utf8_size(message.tags)
        if message.keys:
            size += _KEYS_PAIR + _utf8_size(message.keys)
        return size
    merged = dict(message.properties)
    if message.tags:
        merged[PropertyKey.TAGS] = message.tags
    if message.keys:
        merged[PropertyKey.KEYS] = message.keys
    uniq = merged.pop(PropertyKey.UNIQ_KEY, "")
    if uniq:
        size += _utf8_size(uniq) - _UNIQ_SIZE
    return size + sum(_utf8_size(k) + _utf8_size(v) + _PAIR for k, v in merged.items())


class _Sender:
    """Groups rows into batches per target queue and sends them, up to IN_FLIGHT batches at once."""

    def __init__(self, producer: Producer, topic: str, start: int | None) -> None:
        self._producer = producer
        self._topic = topic
        self._round_robin = _RoundRobin(start)
        self._fixed = _Fixed()
        self._pending: dict[Any, tuple[list[Message], list[int], int]] = {}
        self._in_flight: collections.deque[tuple[concurrent.futures.Future, int, int]] = collections.deque()
        self._queues: list[MessageQueue] | None = None
        self._record_fixed = _record_fixed_size(topic, producer.settings.client_ip)
        self.sent = 0

    # -- whole record batches, encoded column by column ---------------------------------------------

    def send_encoded(self, encoder: RecordEncoder, batch: pa.RecordBatch, first_row: int) -> None:
        records, offsets = encoder.encode(batch, first_row)
        if self._queues is None:
            self._queues = self._producer.fetch_publish_message_queues(self._topic)
            if not self._queues:
                raise TidemarkError(f"tidemark sink: topic {self._topic!r} has no writable queue")
        n, start = batch.num_rows, 0
        while start < n:
            end = min(start + MAX_BATCH_MESSAGES, n)
            if offsets[end] - offsets[start] > MAX_BATCH_BYTES:  # at most 1 MiB, at least one row
                end = max(start + 1, int(offsets.searchsorted(offsets[start] + MAX_BATCH_BYTES, "right")) - 1)
            queue = self._round_robin.select(self._queues, None, None)  # type: ignore[arg-type]
            try:
                future = self._producer.send_encoded_async(self._topic, record_view(records, offsets, start, end),
                                                           end - start, queue=queue)
            except TidemarkError as e:
                raise self._failed(first_row + start, first_row + end - 1, e) from e
            self._in_flight.append((future, first_row + start, first_row + end - 1))
            while len(self._in_flight) >= IN_FLIGHT:
                self._finish_oldest()
            start = end

    def _finish_oldest(self) -> None:
        future, first, last = self._in_flight.popleft()
        try:
            future.result()
        except TidemarkError as e:
            raise self._failed(first, last, e) from e
        self.sent += last - first + 1

    # -- row by row (properties, queue_id) ----------------------------------------------------------

    def add(self, target: Any, message: Message, row: int) -> None:
        """Add a row to its target's batch. A batch that the row would take past MAX_BATCH_BYTES is sent
        first (a batch always has one row at least), as send_encoded cuts before the row that would
        overflow: appending first and sending at 1 MiB could add a whole row of up to max_message_size to
        1 MiB less a byte, more than a request may hold."""
        msgs, rows, size = self._pending.get(target) or ([], [], 0)
        record = self._record_fixed + _row_size(message)
        if msgs and size + record > MAX_BATCH_BYTES:
            self._flush(target)
            msgs, rows, size = [], [], 0
        msgs.append(message)
        rows.append(row)
        size += record
        self._pending[target] = (msgs, rows, size)
        if len(msgs) >= MAX_BATCH_MESSAGES or size >= MAX_BATCH_BYTES:
            self._flush(target)

    def flush_all(self) -> None:
        for target in list(self._pending):
            self._flush(target)
        while self._in_flight:
            self._finish_oldest()

    def _flush(self, target: Any) -> None:
        msgs, rows, _ = self._pending.pop(target)
        selector, arg = (self._round_robin, None) if target is None else (self._fixed, target)
        try:
            self._producer.send_batch(msgs, selector=selector, arg=arg)
        except TidemarkError as e:
            raise self._failed(rows[0], rows[-1], e) from e
        self.sent += len(msgs)

    def _failed(self, first: int, last: int, e: TidemarkError) -> TidemarkError:
        where = f"row {first}" if first == last else f"rows {first}..{last}"
        return TidemarkError(f"tidemark sink: sending {where} of this task to topic {self._topic!r} failed: "
                             f"{type(e).__name__}: {e}")


# Micro-batch ids become producer epochs shifted by this much: the producer may start new epochs of its
# own within a batch (after a send whose outcome it could not learn).
_EPOCHS_PER_BATCH_BITS = 16


def task_producer(options: WriteOptions, write_id: str | None) -> tuple[dict[str, Any], int | None]:
    """The producer settings of this task, keyed by what it writes so a replay is recognised, and its
    partition number (None outside a Spark task).

    `write_id` is a df.write job's (the same for every attempt of its tasks); None in a streaming query,
    whose query id and batch id Spark passes to tasks as local properties."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = None if context is None else context.partitionId()
    if not options.idempotent:
        return {"enable_idempotence": False}, partition
    if context is None:
        return {}, None  # not in a Spark task (a direct call): an idempotent producer of its own
    if write_id is not None:
        return {"producer_key": f"spark-write:{write_id}:{partition}"}, partition
    query, batch = context.getLocalProperty("sql.streaming.queryId"), context.getLocalProperty("streaming.sql.batchId")
    if not query or not (batch or "").isdigit():
        return {}, partition
    return ({"producer_key": f"spark:{query}:{partition}", "producer_epoch": int(batch) << _EPOCHS_PER_BATCH_BITS},
            partition)


def produce(options: WriteOptions, batches: Iterator[pa.RecordBatch], write_id: str | None = None) -> int:
    """Send every row of the record batches; returns how many messages were sent (duplicates of a
    replay included)."""
    settings, partition = task_producer(options, write_id)
    producer = Producer(**options.client_kwargs(), **settings).start()
    try:
        sender = _Sender(producer, options.topic, partition)
        encoder = RecordEncoder(options.topic, producer.settings.client_ip, producer.settings.max_message_size)
        row = 0
        for batch in batches:
            if RecordEncoder.handles(batch):
                sender.send_encoded(encoder, batch, row)
            else:
                for target, message, number in _rows(batch, options.topic, row):
                    sender.add(target, message, number)
            row += batch.num_rows
        sender.flush_all()
        return sender.sent
    finally:
        producer.shutdown()


_frozen = False


def spare_the_workers_gc() -> None:
    """Take what a Spark Python worker holds when its first write starts out of the cyclic GC's walks.

    Spark's Python worker runs a full gc.collect() after every task (pyspark/daemon.py, to keep a reused
    worker small), and a full collection walks every object the process tracks: pyspark's, pyarrow's,
    numpy's, gRPC's and this package's modules, about 65,000 once the sink is imported, 20 to 35 ms a
    walk on this machine (more under load). A write task of 125,000 rows paid that once: a quarter of
    the worker's CPU in a Spark write (docs/benchmarks.md, issue 33, sixth pass). gc.freeze() moves the
    objects tracked now to the permanent generation, which collections skip, once per worker process (a
    worker is reused for many tasks, and each later one finds them frozen already), so the walk after a
    task covers what tasks made since. Frozen objects are still freed by reference counting; only a
    cycle among them that turns into garbage later stays (they are mostly modules, which live as long as
    the worker)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()


class TidemarkWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options
        self.write_id = uuid.uuid4().hex  # made on the driver: every attempt of a task shares it

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TidemarkCommitMessage:
        spare_the_workers_gc()
        return TidemarkCommitMessage(produce(self.options, iterator, self.write_id))


class TidemarkStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TidemarkCommitMessage:
        spare_the_workers_gc()
        return TidemarkCommitMessage(produce(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing to do: messages are visible as soon as each send returns."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Sent messages cannot be taken back; a replay of the batch stores only what is missing."""
