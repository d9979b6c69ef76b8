"""failOnDataLoss both ways: messages deleted by retention, and a topic deleted and re-created."""

from __future__ import annotations

import json
import shutil

import pytest
from pyspark.errors import PySparkException
from spark_testlib import BatchLog, Kit

pytestmark = pytest.mark.spark


@pytest.fixture
def tiny_segments(broker_factory) -> Kit:
    """A broker whose commit log rolls every 64 KiB, so old segments can be deleted."""
    return Kit(broker_factory("broker-a", args=("--commitlog-segment-size", "65536")).address)


def test_start_below_min_offset(spark, tiny_segments, tmp_path):
    kit = tiny_segments
    topic, mqs = kit.topic(1)
    kit.produce(topic, mqs, [1000], body_size=200)
    with kit.admin() as admin:
        assert admin.delete_expired_commitlog() > 0
        low, high = admin.offsets(mqs)[mqs[0]]
    assert 0 < low < high == 1000
    start = json.dumps({topic: {"broker-a": {"0": 0}}})

    with pytest.raises(PySparkException) as e:
        kit.read(spark, topic, startingOffsets=start).collect()
    message = str(e.value)
    assert f"MessageQueue [topic={topic}, brokerName=broker-a, queueId=0]" in message
    assert f"offset 0 is below the queue's min offset {low}" in message and "failOnDataLoss=false" in message

    rows = kit.read(spark, topic, startingOffsets=start, failOnDataLoss="false").collect()
    assert sorted(r.queue_offset for r in rows) == list(range(low, 1000))

    # Streaming: the same start offset fails the query or is clamped to the min offset.
    failing = (kit.reader(spark, topic, stream=True, startingOffsets=start).load().writeStream
               .foreachBatch(BatchLog()).option("checkpointLocation", str(tmp_path / "a"))
               .trigger(availableNow=True).start())
    with pytest.raises(PySparkException, match="below the queue's min offset"):
        failing.awaitTermination(120)
    log = BatchLog()
    q = (kit.reader(spark, topic, stream=True, startingOffsets=start, failOnDataLoss="false").load().writeStream
         .foreachBatch(log).option("checkpointLocation", str(tmp_path / "b")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    assert sorted(r[1] for r in log.rows()) == list(range(low, 1000))


def test_topic_recreated_under_a_running_stream(spark, kit, tmp_path):
    topic, mqs = kit.topic(2)
    kit.produce(topic, mqs, [30, 30])
    ckpt = tmp_path / "ckpt"

    def run(checkpoint, log, **options):
        return (kit.reader(spark, topic, stream=True, startingOffsets="earliest", **options).load().writeStream
                .foreachBatch(log).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())

    first = BatchLog()
    q = run(ckpt, first)
    q.awaitTermination(120)
    assert len(first.rows()) == 60

    with kit.admin() as admin:
        admin.delete_topic(topic)
        admin.create_topic(topic, 2)
    sent = kit.produce(topic, mqs, [5, 4])
    shutil.copytree(ckpt, tmp_path / "ckpt-copy")

    q = run(ckpt, BatchLog())
    with pytest.raises(PySparkException) as e:
        q.awaitTermination(120)
    assert "offset 30 is beyond the queue's max offset" in str(e.value)
    assert f"MessageQueue [topic={topic}, brokerName=broker-a, queueId=" in str(e.value)

    log = BatchLog()
    q = run(tmp_path / "ckpt-copy", log, failOnDataLoss="false")
    q.awaitTermination(120)
    assert q.exception() is None
    assert sorted((r[0], r[1], r[2]) for r in log.rows()) == sorted((s.queue_id, s.queue_offset, s.body) for s in sent)
