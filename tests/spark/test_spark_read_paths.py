"""The read paths agree: a stream's micro-batches return exactly the rows of a batch read of the same
ranges, and a task reads a range many flow-control windows long to its end. A task's next range is
opened while the current one drains, and a Spark worker keeps one reader from task to task."""

from __future__ import annotations

import pytest
from workload import wait_until

from tidemark.client.consumer import record_reader
from tidemark.client.consumer.record_reader import RecordReader
from tidemark.spark_connector.arrow import records_to_batch
from tidemark.spark_connector.fetch import BATCH_ROWS, FetchSettings, KeptReader, fetch_range
from tidemark.spark_connector.offsets import OffsetRange

pytestmark = pytest.mark.spark


def _full_row(row) -> tuple:
    """Every column of a row, the queue and offset first (they sort rows), the map as sorted pairs."""
    d = row.asDict()
    d["body"] = bytes(d["body"])
    d["properties"] = tuple(sorted((d["properties"] or {}).items()))
    return (d.pop("queue_id"), d.pop("queue_offset"), *(d[name] for name in sorted(d)))


class RowLog:
    """foreachBatch sink keeping every column of every row, and how many micro-batches brought rows."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.batches = 0

    def __call__(self, df, batch_id: int) -> None:
        rows = [_full_row(r) for r in df.collect()]
        self.rows.extend(rows)
        self.batches += bool(rows)


def test_micro_batches_return_the_rows_of_a_batch_read(spark, kit, tmp_path):
    topic, mqs = kit.topic(3)
    # One queue longer than a fetch batch (a batch read converts it in several Arrow batches, the
    # stream in other cuts), one with large bodies, one nearly empty; properties on every other row.
    kit.produce(topic, mqs, [BATCH_ROWS + 1500, 0, 3])
    kit.produce(topic, mqs[1:2], [40], body_size=60_000)
    kit.produce(topic, mqs[1:2], [400])
    batch = sorted(_full_row(r) for r in kit.read(spark, topic).collect())
    assert len(batch) == BATCH_ROWS + 1500 + 3 + 440

    log = RowLog()
    q = (kit.reader(spark, topic, stream=True, startingOffsets="earliest", maxOffsetsPerTrigger="2000").load()
         .writeStream.foreachBatch(log).option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None
    assert log.batches >= 5  # the stream really read in micro-batches
    assert sorted(log.rows) == batch


def test_a_range_many_windows_long_is_read_to_its_end(kit, monkeypatch):
    """The reader gives the broker its credit back in steps, not per chunk: with a window a twelfth
    of the range, a read that failed to give credit back would stall at the first window's end (and
    fail here with a poll timeout)."""
    monkeypatch.setattr(record_reader, "WINDOW_BYTES", 256 * 1024)
    monkeypatch.setattr(record_reader, "CREDIT_STEP_BYTES", 64 * 1024)
    topic, mqs = kit.topic(1)
    kit.produce(topic, mqs, [3000], body_size=1024)
    settings = FetchSettings(brokers=kit.address, fail_on_data_loss=True, poll_timeout_s=10.0)
    offsets = [o for b in fetch_range(settings, OffsetRange(mqs[0], 0, 3000))
               for o in b.column("queue_offset").to_pylist()]
    assert offsets == list(range(3000))


def _offsets(reader: RecordReader, mq, start: int, end: int, then=None) -> list[int]:
    return [o for c in reader.read(mq, start, end, poll_timeout_s=10.0, then=then) if c is not None
            for o in records_to_batch(c.data, c.count, topic=mq.topic, broker=mq.broker_name)
            .column("queue_offset").to_pylist()]


def test_the_next_range_is_opened_ahead_and_taken_over_by_its_read(kit):
    topic, mqs = kit.topic(2)
    kit.produce(topic, mqs, [50, 40])
    with RecordReader(brokers=kit.address) as reader:
        assert _offsets(reader, mqs[0], 0, 50, then=(mqs[1], 0, 40)) == list(range(50))
        # Opened once the broker sent the first range's last records (on the reader's loop).
        wait_until(lambda: reader._ahead is not None, 10, "the next range opened ahead")
        handles = reader._next_handle
        assert _offsets(reader, mqs[1], 0, 40) == list(range(40))
        assert reader._next_handle == handles  # taken over, not opened again

        # A range opened ahead that is not the one read next is closed, and the read opens its own.
        assert _offsets(reader, mqs[0], 10, 20, then=(mqs[1], 0, 40)) == list(range(10, 20))
        wait_until(lambda: reader._ahead is not None, 10, "the next range opened ahead")
        assert _offsets(reader, mqs[1], 5, 40) == list(range(5, 40))
        assert reader._next_handle == handles + 3
        wait_until(lambda: not reader._reads and reader._ahead is None, 10, "every handle closed")


def test_a_worker_keeps_one_reader_for_the_same_brokers_and_credentials(kit):
    topic, mqs = kit.topic(1)
    kit.produce(topic, mqs, [20])
    rng = OffsetRange(mqs[0], 0, 20)
    kept = KeptReader()
    settings = FetchSettings(brokers=kit.address, fail_on_data_loss=True, poll_timeout_s=10.0)
    with kept.use(settings, rng) as first:
        pass
    # Another task's read settings (not the client's) take the kept reader.
    with kept.use(FetchSettings(brokers=kit.address, fail_on_data_loss=False, poll_timeout_s=5.0), rng) as again:
        assert again is first and first.running
    # Another source's brokers: the kept reader is shut down and the new one kept.
    other = FetchSettings(brokers=kit.address.replace("127.0.0.1", "localhost"), fail_on_data_loss=True,
                          poll_timeout_s=10.0)
    with kept.use(other, rng) as second:
        assert second is not first and not first.running
    # A task that fails shuts its reader down and keeps none.
    with pytest.raises(RuntimeError), kept.use(other, rng) as failing:
        assert failing is second
        raise RuntimeError("the task failed")
    assert not second.running and kept._slot is None
    kept.close()
