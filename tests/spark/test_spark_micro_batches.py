"""A micro-batch's ranges are packed into one wave of the task slots, and a packed task reads every range.

Pure rule (offsets.pack_ranges, planner.stream_tasks) without Spark or a broker; the read of a packed
partition against a real broker; a stream's planning keeps one Admin for the query.
"""

from __future__ import annotations

import gc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemark.client.message import MessageQueue
from tidemark.spark_connector import fetch
from tidemark.spark_connector.arrow import SCHEMA
from tidemark.spark_connector.offsets import OffsetRange, offsets_to_json, pack_ranges
from tidemark.spark_connector.options import parse_read_options
from tidemark.spark_connector.planner import stream_tasks
from tidemark.spark_connector.source import (
    TASK_SLOTS_ENV,
    QueueRangePartition,
    QueueRangesPartition,
    TidemarkDataSource,
    read_partition,
)


def mq(i: int) -> MessageQueue:
    return MessageQueue("t", "broker-a", i)


@given(st.lists(st.integers(0, 10_000), max_size=40), st.integers(1, 12))
def test_packing_covers_every_range_once_in_at_most_the_slots(sizes, tasks):
    ranges = [OffsetRange(mq(i), 100, 100 + n) for i, n in enumerate(sizes)]
    groups = pack_ranges(ranges, tasks)
    nonempty = [r for r in ranges if r.size]
    key = lambda r: (r.mq, r.start)  # noqa: E731
    assert sorted((r for g in groups for r in g), key=key) == sorted(nonempty, key=key)
    assert len(groups) == min(tasks, len(nonempty))
    if nonempty:
        # Largest first to the least loaded: no group exceeds its share by more than one range.
        total, largest = sum(r.size for r in nonempty), max(r.size for r in nonempty)
        assert max(sum(r.size for r in g) for g in groups) <= total / len(groups) + largest


def test_a_micro_batch_is_one_wave_of_the_slots_but_never_below_min_partitions():
    start = offsets_to_json({mq(i): 0 for i in range(4)})
    end = offsets_to_json({mq(i): 25_000 for i in range(4)})
    options = parse_read_options({"brokers": "127.0.0.1:1", "topic": "t"}, streaming=True)
    assert [len(t) for t in stream_tasks(options, start, end, 2)] == [2, 2]
    assert [len(t) for t in stream_tasks(options, start, end, None)] == [1, 1, 1, 1]
    assert [len(t) for t in stream_tasks(options, start, end, 8)] == [1, 1, 1, 1]
    split = parse_read_options({"brokers": "127.0.0.1:1", "topic": "t", "minPartitions": "8"}, streaming=True)
    assert len(stream_tasks(split, start, end, 2)) == 8


def test_the_stream_reader_packs_by_the_slots_register_recorded(monkeypatch):
    start = offsets_to_json({mq(i): 0 for i in range(3)})
    end = offsets_to_json({mq(i): 10 for i in range(3)})
    reader = TidemarkDataSource({"brokers": "127.0.0.1:1", "topic": "t"}).streamReader(SCHEMA)
    monkeypatch.setenv(TASK_SLOTS_ENV, "2")
    parts = reader.partitions(start, end)
    assert [type(p) for p in parts] == [QueueRangesPartition, QueueRangePartition]
    assert [r.queue_id for r in parts[0].ranges] == [0, 2] and parts[1].queue_id == 1
    monkeypatch.setenv(TASK_SLOTS_ENV, "not a number")
    assert len(reader.partitions(start, end)) == 3


@pytest.mark.spark
def test_a_packed_partition_reads_its_ranges_in_turn_and_planning_keeps_one_admin(kit):
    topic, mqs = kit.topic(3)
    sent = kit.produce(topic, mqs, [30, 20, 10])
    options = parse_read_options({"brokers": kit.address, "topic": topic}, streaming=True)
    part = QueueRangesPartition((QueueRangePartition(topic, "broker-a", 0, 5, 30),
                                 QueueRangePartition(topic, "broker-a", 2, 0, 10)))
    frozen = gc.get_freeze_count()
    try:
        rows = [(r["queue_id"], r["queue_offset"], r["body"]) for b in read_partition(options, part)
                for r in b.to_pylist()]
        kept = fetch._KEPT._slot[1]  # the worker's reader, kept for its next task
        assert [b.num_rows for b in read_partition(options, part)] == [25, 10]
        assert fetch._KEPT._slot[1] is kept and kept.running
    finally:
        fetch._KEPT.close()
        if not frozen:  # read_partition froze this process's heap, as it does a Spark worker's
            gc.unfreeze()
    assert rows == [(s.queue_id, s.queue_offset, s.body) for s in sent
                    if (s.queue_id, s.queue_offset >= 5) == (0, True) or s.queue_id == 2]

    reader = TidemarkDataSource({"brokers": kit.address, "topic": topic, "group": f"{topic}-g",
                                 "startingOffsets": "earliest"}).streamReader(SCHEMA)
    first = reader.initialOffset()
    end = reader.latestOffset(first, reader.getDefaultReadLimit())
    admin = reader._client._admin
    reader.commit(end)
    assert reader._client._admin is admin is not None  # the same Admin for every planning call
    reader.stop()
    assert reader._client._admin is None
    assert kit.committed(f"{topic}-g", mqs) == {0: 30, 1: 20, 2: 10}
