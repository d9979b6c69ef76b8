"""Streaming reads: admission control, exactly-once across batches and restarts, group commits."""

from __future__ import annotations

import json

import pytest
from pyspark.errors import PySparkException
from spark_testlib import BatchLog, wait_for

pytestmark = pytest.mark.spark


def _start(kit, spark, topic, checkpoint, sink, *, trigger, **options):
    df = kit.reader(spark, topic, stream=True, **options).load()
    return (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
            .trigger(**trigger).start())


def test_rate_limited_batches_exactly_once_across_restart(spark, kit, tmp_path):
    topic, mqs = kit.topic(4)
    sent = kit.produce(topic, mqs, [400, 300, 200, 100])
    group = f"{topic}-g"
    opts = {"group": group, "startingOffsets": "earliest", "maxOffsetsPerTrigger": "100"}
    log = BatchLog()
    ckpt = tmp_path / "ckpt"

    # Run 1: stop after a few micro-batches, in the middle of the backlog.
    q = _start(kit, spark, topic, ckpt, log, trigger={"processingTime": "0 seconds"}, **opts)
    wait_for(q, lambda q: len([p for p in q.recentProgress if p["numInputRows"] > 0]) >= 3)
    q.stop()
    first_run_batches = {b for b, _ in log.deliveries}
    assert 0 < len(first_run_batches) < 10

    # Run 2: restart from the checkpoint and drain what is there (Trigger.AvailableNow).
    q = _start(kit, spark, topic, ckpt, log, trigger={"availableNow": True}, **opts)
    q.awaitTermination(120)
    assert q.exception() is None

    # A batch re-run after the restart (its end not yet committed to the checkpoint) is identical.
    for batch_id, rows in log.deliveries:
        assert sorted(rows) == sorted(log.by_batch()[batch_id])
    assert all(len(rows) <= 100 for _, rows in log.deliveries)
    # Backlog 400/300/200/100: the first batch takes 40/30/20/10.
    first = [r[0] for r in log.by_batch()[0]]
    assert [first.count(q) for q in range(4)] == [40, 30, 20, 10]
    # Every message exactly once over all batches, no gap, no repeat.
    rows = log.rows()
    assert len(rows) == len(set(rows)) == 1000
    assert sorted((r[0], r[1], r[2]) for r in rows) == sorted((s.queue_id, s.queue_offset, s.body) for s in sent)
    assert sorted(log.by_batch()) == list(range(10))
    # The group's committed offsets are the last batch's end.
    end = q.lastProgress["sources"][0]["endOffset"]
    assert kit.committed(group, mqs) == {int(k): v for k, v in json.loads(end)[topic]["broker-a"].items()}
    assert kit.committed(group, mqs) == {0: 400, 1: 300, 2: 200, 3: 100}


def test_committed_start_new_queues_and_available_now(spark, kit, tmp_path):
    topic, mqs = kit.topic(2)
    kit.produce(topic, mqs, [50, 50])
    group = f"{topic}-g"
    with kit.admin() as admin:
        admin.commit(group, {mqs[0]: 20})  # queue 1 has no committed offset: earliest
    log = BatchLog()
    ckpt = tmp_path / "ckpt"
    opts = {"group": group, "startingOffsets": "committed"}
    q = _start(kit, spark, topic, ckpt, log, trigger={"availableNow": True}, **opts)
    q.awaitTermination(120)
    assert q.exception() is None
    assert sorted((r[0], r[1]) for r in log.rows()) == \
        sorted([(0, o) for o in range(20, 50)] + [(1, o) for o in range(50)])

    # The topic grows to 4 queues; the new ones are read from their earliest offset.
    with kit.admin() as admin:
        admin.update_topic(topic, read_queue_nums=4, write_queue_nums=4)
        mqs = admin.fetch_message_queues(topic)
    assert len(mqs) == 4
    kit.produce(topic, mqs, [5, 0, 7, 9])
    seen = len(log.deliveries)
    q = _start(kit, spark, topic, ckpt, log, trigger={"availableNow": True}, **opts)
    q.awaitTermination(120)
    assert q.exception() is None
    new_rows = [r for _, rows in log.deliveries[seen:] for r in rows]
    assert sorted((r[0], r[1]) for r in new_rows) == \
        sorted([(0, o) for o in range(50, 55)] + [(2, o) for o in range(7)] + [(3, o) for o in range(9)])
    assert kit.committed(group, mqs) == {0: 55, 1: 50, 2: 7, 3: 9}


def test_commit_offsets_false_leaves_group_alone(spark, kit, tmp_path):
    topic, mqs = kit.topic(1)
    kit.produce(topic, mqs, [10])
    log = BatchLog()
    q = _start(kit, spark, topic, tmp_path / "ckpt", log, trigger={"availableNow": True}, group=f"{topic}-g",
               startingOffsets="earliest", commitOffsets="false")
    q.awaitTermination(120)
    assert len(log.rows()) == 10
    assert kit.committed(f"{topic}-g", mqs) == {0: -1}


def test_latest_start_reads_only_new_messages(spark, kit, tmp_path):
    topic, mqs = kit.topic(2)
    kit.produce(topic, mqs, [10, 10])
    log = BatchLog()
    q = _start(kit, spark, topic, tmp_path / "ckpt", log, trigger={"processingTime": "0 seconds"})
    wait_for(q, lambda q: q.lastProgress is not None)  # initial offsets (latest) are fixed by now
    kit.produce(topic, mqs, [3, 4])
    wait_for(q, lambda q: len(log.rows()) >= 7)
    q.stop()
    assert sorted((r[0], r[1]) for r in log.rows()) == [(0, 10), (0, 11), (0, 12), (1, 10), (1, 11), (1, 12), (1, 13)]


@pytest.mark.parametrize(("options", "expected"), [
    ({"maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be >= 1"),
    ({"endingOffsets": "latest"}, "'endingOffsets' applies to batch queries only"),
    ({"topic": "no-such-topic"}, "topic 'no-such-topic' does not exist"),
])
def test_bad_stream_options_fail_with_clear_message(spark, kit, tmp_path, options, expected):
    topic, _ = kit.topic(1)
    chosen = options.pop("topic", topic)
    with pytest.raises(PySparkException) as e:
        q = _start(kit, spark, chosen, tmp_path / "ckpt", BatchLog(), trigger={"availableNow": True}, **options)
        q.awaitTermination(60)
    assert expected in str(e.value)
