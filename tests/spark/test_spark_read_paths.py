"""The read paths agree: a stream's micro-batches return exactly the rows of a batch read of the same
ranges, and a task reads a range many flow-control windows long to its end. A task's next range is
opened while the current one drains, and a Spark worker keeps one reader from task to task."""

from __future__ import annotations

import pytest
from workload import wait_until

from tidemark.client.consumer import record_reader
from tidemark.client.consumer.record_reader import RecordReader
from tidemark.client.remoting.streams import FetchStream
from tidemark.client.security import TlsSettings
from tidemark.common.auth import Credentials
from tidemark.spark_connector import fetch
from tidemark.spark_connector.arrow import records_to_batch
from tidemark.spark_connector.fetch import BATCH_ROWS, FetchSettings, KeptReader, fetch_range
from tidemark.spark_connector.offsets import OffsetRange
from tidemark.spark_connector.options import Security

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


def _serve_at(reader: RecordReader, broker: str, address: str, *, tell: bool) -> None:
    """The reader's cluster learns that `address` serves `broker` now: told (a move, as a takeover named
    by the name servers) or not (as a failed-over master found answering again by the next look)."""
    async def move() -> None:
        cluster = reader._cluster
        if tell:
            cluster._adopt(broker, address)
        else:
            conn = cluster.connection_at(address)
            conn.broker_name = broker
            cluster._by_name[broker] = conn

    reader._loop.run(move(), timeout=10)


def test_a_reader_follows_its_broker_to_another_address(kit):
    """A stream may stand silent on a replaced master: when the cluster says another address serves the
    broker, the reader drops the old stream and its reads go on there, from where they got."""
    topic, mqs = kit.topic(1)
    kit.produce(topic, mqs, [2500])
    mq = mqs[0]
    elsewhere = kit.address.replace("127.0.0.1", "localhost")  # the same broker at another address
    with RecordReader(brokers=kit.address) as reader:
        reads = reader.read(mq, 0, 5000, poll_timeout_s=10.0)
        first = next(c for c in reads if c is not None)
        assert reader._streams[mq.broker_name].address == kit.address
        _serve_at(reader, mq.broker_name, elsewhere, tell=True)
        # (stored after the move: only a stream at the new address can bring them, however much of the first
        # 2,500 the old one had sent already)
        kit.produce(topic, mqs, [2500])
        rest = [o for c in reads if c is not None
                for o in records_to_batch(c.data, c.count, topic=mq.topic, broker=mq.broker_name)
                .column("queue_offset").to_pylist()]
        assert rest == list(range(first.next_offset, 5000))
        assert reader._streams[mq.broker_name].address == elsewhere


def test_a_kept_reader_reads_where_its_broker_is_served_now(kit, monkeypatch):
    topic, mqs = kit.topic(2)
    kit.produce(topic, mqs, [30, 20])
    mq = mqs[0]
    kept = KeptReader()
    monkeypatch.setattr(fetch, "_KEPT", kept)
    settings = FetchSettings(brokers=kit.address, fail_on_data_loss=True, poll_timeout_s=10.0)
    ranges = [OffsetRange(mqs[0], 0, 30), OffsetRange(mqs[1], 0, 20)]
    try:
        # A task stopped early (its next range opened ahead): the reader is kept, with nothing open.
        task = fetch.fetch_ranges(settings, ranges, keep_reader=True)
        next(task)
        task.close()
        reader = kept._slot[1]
        assert reader.idle()
        # The broker is served at another address now, and nobody told the reader: the next task asks.
        _serve_at(reader, mq.broker_name, kit.address.replace("127.0.0.1", "localhost"), tell=False)
        assert sum(b.num_rows for b in fetch.fetch_ranges(settings, ranges, keep_reader=True)) == 50
        assert kept._slot[1] is reader and reader._streams[mq.broker_name].address != kit.address
    finally:
        kept.close()


def test_a_reader_left_with_an_open_read_is_not_kept(kit):
    """A handle whose open completed after its caller gave up waiting would hold its window for the
    worker's life: the task's reader is shut down instead of kept."""
    topic, mqs = kit.topic(1)
    kit.produce(topic, mqs, [30])
    kept = KeptReader()
    settings = FetchSettings(brokers=kit.address, fail_on_data_loss=True, poll_timeout_s=10.0)
    with kept.use(settings, OffsetRange(mqs[0], 0, 30)) as reader:
        reader._loop.run(reader._open(mqs[0], 0, 30, None), timeout=10)
    assert not reader.running and kept._slot is None


def test_a_kept_reader_is_not_reused_for_other_credentials_or_tls(kit):
    settings = FetchSettings(brokers=kit.address, fail_on_data_loss=True, poll_timeout_s=10.0)
    others = [Security(credentials=Credentials("reader", "secret")), Security(tls=TlsSettings(server_name="x"))]
    for security in others:
        kept = KeptReader()
        reader = RecordReader(brokers=kit.address).start()
        kept._keep(settings, reader)
        assert kept._take(FetchSettings(brokers=kit.address, fail_on_data_loss=True, poll_timeout_s=10.0,
                                        security=security)) is None
        assert not reader.running and kept._slot is None


def test_a_range_opened_ahead_holds_a_quarter_window_until_its_read_takes_it_over(kit, monkeypatch):
    """A task holds at most a window for its current range and a quarter of one for the next."""
    windows: list[int] = []
    credits: list[int] = []
    open_queue, credit = FetchStream.open_queue, FetchStream.credit

    def spy_open(self, handle, *args, **kwargs):
        windows.append(kwargs["credit_bytes"])
        return open_queue(self, handle, *args, **kwargs)

    def spy_credit(self, handle, messages, nbytes, *args, **kwargs):
        credits.append(nbytes)
        return credit(self, handle, messages, nbytes, *args, **kwargs)

    monkeypatch.setattr(FetchStream, "open_queue", spy_open)
    monkeypatch.setattr(FetchStream, "credit", spy_credit)
    topic, mqs = kit.topic(2)
    kit.produce(topic, mqs, [20, 30])
    with RecordReader(brokers=kit.address) as reader:
        assert _offsets(reader, mqs[0], 0, 20, then=(mqs[1], 0, 30)) == list(range(20))
        wait_until(lambda: reader._ahead is not None, 10, "the next range opened ahead")
        assert _offsets(reader, mqs[1], 0, 30) == list(range(30))
    full, quarter = record_reader.WINDOW_BYTES, record_reader.AHEAD_WINDOW_BYTES
    assert quarter == full // 4 and windows == [full, quarter]
    assert credits == [full - quarter]  # the rest of a window once its read took it over
