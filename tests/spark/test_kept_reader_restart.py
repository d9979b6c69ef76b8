"""A Spark worker's kept reader after its broker restarted: the task that read ahead when the broker went
away, and the next task on the same reader, read every row once, and the reader is kept with nothing open."""

from __future__ import annotations

import pytest
from brokerproc import BrokerProcess
from workload import wait_until

from tidemark.client import Admin, Message, Producer
from tidemark.spark_connector.fetch import FetchSettings, KeptReader, fetch_ranges
from tidemark.spark_connector.offsets import OffsetRange

pytestmark = pytest.mark.spark


def _offsets(settings: FetchSettings, ranges: list[OffsetRange]) -> dict[int, list[int]]:
    got: dict[int, list[int]] = {}
    for batch in fetch_ranges(settings, ranges, keep_reader=True):
        for q, o in zip(batch.column("queue_id").to_pylist(), batch.column("queue_offset").to_pylist(), strict=True):
            got.setdefault(q, []).append(o)
    return got


def test_a_kept_reader_reads_every_row_once_across_a_broker_restart(tmp_path, monkeypatch):
    from tidemark.spark_connector import fetch

    kept = KeptReader()
    monkeypatch.setattr(fetch, "_KEPT", kept)
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        with Admin(brokers=broker.address) as admin:
            admin.create_topic("KeptRestart", 2)
            mqs = sorted(admin.fetch_message_queues("KeptRestart"), key=lambda mq: mq.queue_id)
        with Producer(brokers=broker.address) as producer:
            for mq, n in zip(mqs, (300, 200), strict=True):
                producer.send_batch([Message("KeptRestart", b"x" * 100) for _ in range(n)], queue=mq)
        settings = FetchSettings(brokers=broker.address, fail_on_data_loss=True, poll_timeout_s=30.0)
        ranges = [OffsetRange(mqs[0], 0, 300), OffsetRange(mqs[1], 0, 200)]
        task = fetch_ranges(settings, ranges, keep_reader=True)
        first = next(task)  # the first range's records all came: the second is opened ahead
        broker.kill()  # no graceful stop: the stream breaks as in a crash
        broker.start()
        rest = [first, *task]
        assert sum(b.num_rows for b in rest) == 500
        reader = kept._slot[1]
        wait_until(reader.idle, 10, "the kept reader holds no open read")
        got = _offsets(settings, [ranges[1], ranges[0]])
        assert got == {mqs[0].queue_id: list(range(300)), mqs[1].queue_id: list(range(200))}
        assert kept._slot[1] is reader
    finally:
        kept.close()
        broker.kill()
