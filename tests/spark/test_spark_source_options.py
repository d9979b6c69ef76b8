"""Kafka-parity source options against a real broker: subscribePattern, assign, by-timestamp positions,
minOffsetsPerTrigger, lag from progress, option errors raised by load(); and register() without
$PYSPARK_PYTHON in local mode."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from pyspark.errors import PySparkException
from spark_testlib import BatchLog, wait_for

from tidemark import spark_connector
from tidemark.spark_connector import offsets_behind_latest

pytestmark = pytest.mark.spark


def _source(spark, kit, *, stream: bool = False, **options: str):
    r = (spark.readStream if stream else spark.read).format("tidemark").option("brokers", kit.address)
    for key, value in options.items():
        r = r.option(key, value)
    return r


def _prefix() -> str:
    return f"kp-{uuid.uuid4().hex[:8]}"


def _create(kit, name: str, queues: int):
    with kit.admin() as admin:
        admin.create_topic(name, queues)
        return admin.fetch_message_queues(name)


def _cells(rows) -> list[tuple[str, int, int]]:
    return sorted((r.topic, r.queue_id, r.queue_offset) for r in rows)


@pytest.mark.parametrize(("stream", "options", "expected"), [
    (False, {"topic": "T", "startingOffsetz": "earliest"}, "unknown tidemark read option 'startingoffsetz'"),
    (False, {"topic": "T", "subscribePattern": "T.*"}, "set only one of tidemark options 'topic', 'subscribePattern'"),
    (False, {"assign": '{"T": [0'}, "tidemark option 'assign' is not valid JSON"),
    (True, {"topic": "T", "minOffsetsPerTrigger": "1k"}, "tidemark option 'minOffsetsPerTrigger' must be an integer"),
])
def test_option_errors_fail_load_with_the_message(spark, kit, stream, options, expected):
    # No broker is asked: the options alone are wrong, and load() says so before any query runs.
    with pytest.raises(PySparkException) as e:
        _source(spark, kit, stream=stream, **options).load()
    assert expected in str(e.value)


def test_subscribe_pattern_and_assign_batch(spark, kit):
    prefix = _prefix()
    a, b, c = f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"
    queues = {t: _create(kit, t, 2) for t in (a, b, c, f"x{prefix}-a")}
    for topic, mqs in queues.items():
        kit.produce(topic, mqs, [4, 3])

    # Pattern: whole names only (x...-a is not read); a flat startingOffsets entry is Kafka's form.
    rows = _source(spark, kit, subscribePattern=f"{prefix}-[ab]",
                   startingOffsets=json.dumps({a: {"0": 2}})).load().collect()
    assert _cells(rows) == sorted([(a, 0, 2), (a, 0, 3), (a, 1, 0), (a, 1, 1), (a, 1, 2)]
                                  + [(b, q, o) for q, n in ((0, 4), (1, 3)) for o in range(n)])

    # Assign: a queue id on every broker, or one broker's queue; endingOffsets in the flat form too.
    assign = {a: [1], c: {"broker-a": [0]}}
    rows = _source(spark, kit, assign=json.dumps(assign), endingOffsets=json.dumps({c: {"0": 2}})).load().collect()
    assert _cells(rows) == [(a, 1, 0), (a, 1, 1), (a, 1, 2), (c, 0, 0), (c, 0, 1)]

    # An assigned queue that does not exist fails planning, naming it.
    with pytest.raises(PySparkException) as e:
        _source(spark, kit, assign=json.dumps({a: [0, 5]})).load().collect()
    assert f"'assign' names {a}/*/5, which do not exist" in str(e.value)


def _store_ms(kit, mq, offset: int) -> int:
    with kit.admin() as admin:
        return admin.view_message(mq, offset).store_timestamp


def _after(ms: int) -> None:
    """Return once the clock has passed `ms`, so what is produced next is stored later."""
    while time.time() * 1000 <= ms:
        time.sleep(0.002)


def test_offsets_by_timestamp_batch(spark, kit):
    topic, mqs = kit.topic(2)
    kit.produce(topic, mqs, [5, 5])  # A: offsets 0..4
    cut1 = max(_store_ms(kit, mq, 4) for mq in mqs) + 1
    _after(cut1)
    kit.produce(topic, mqs, [4, 4])  # B: 5..8
    cut2 = max(_store_ms(kit, mq, 8) for mq in mqs) + 1
    _after(cut2)
    kit.produce(topic, mqs, [3, 3])  # C: 9..11

    rows = kit.read(spark, topic, startingTimestamp=str(cut1), endingTimestamp=str(cut2)).collect()
    assert _cells(rows) == [(topic, q, o) for q in (0, 1) for o in range(5, 9)]

    # Per queue (flat and per-broker forms); left out: start at earliest, end at latest.
    rows = kit.read(spark, topic, startingOffsetsByTimestamp=json.dumps({topic: {"0": cut2}}),
                    endingOffsetsByTimestamp=json.dumps({topic: {"broker-a": {"1": cut1}}})).collect()
    assert _cells(rows) == [(topic, 0, o) for o in range(9, 12)] + [(topic, 1, o) for o in range(5)]

    # A time after every message: each queue starts at its max offset (Kafka's "latest" strategy).
    future = int(time.time() * 1000) + 3_600_000
    assert kit.read(spark, topic, startingTimestamp=str(future)).count() == 0


def _start(df, sink, checkpoint, **trigger):
    return df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)).trigger(**trigger).start()


def test_stream_pattern_picks_up_new_topics_and_progress_gives_lag(spark, kit, tmp_path):
    prefix = _prefix()
    first = f"{prefix}-1"
    kit.produce(first, _create(kit, first, 1), [30])
    log = BatchLog()
    df = _source(spark, kit, stream=True, subscribePattern=f"{prefix}-.*", startingOffsets="earliest",
                 maxOffsetsPerTrigger="10").load()
    q = _start(df, log, tmp_path / "ckpt", processingTime="0 seconds")
    try:
        wait_for(q, lambda q: len(log.rows()) >= 30)
        # Batch 0 read offsets [0, 10) while the queue held 30: 20 behind on its only queue.
        batch0 = next(p for p in q.recentProgress if p["batchId"] == 0)
        assert offsets_behind_latest(batch0["sources"][0]) == {
            "minOffsetsBehindLatest": 20, "maxOffsetsBehindLatest": 20, "avgOffsetsBehindLatest": 20.0}

        second = f"{prefix}-2"  # created after the query started: found at a later micro-batch
        kit.produce(second, _create(kit, second, 2), [3, 2])
        wait_for(q, lambda q: len(log.rows()) >= 35)
    finally:
        q.stop()
    bodies = sorted(body.decode() for _, _, body in log.rows())
    assert bodies == sorted([f"{first}/0/{i}" for i in range(30)] + [f"{second}/0/{i}" for i in range(3)]
                            + [f"{second}/1/{i}" for i in range(2)])
    assert all(len(rows) <= 10 for _, rows in log.deliveries)


def _rows_per_batch(q) -> list[int]:
    return [p["numInputRows"] for p in sorted(q.recentProgress, key=lambda p: p["batchId"]) if p["numInputRows"]]


def test_min_offsets_per_trigger_holds_batches_back(spark, kit, tmp_path):
    # The delay is out of reach here, so what is read when is decided by the message count alone
    # (TriggerGate's unit tests cover the delay).
    topic, mqs = kit.topic(2)
    kit.produce(topic, mqs, [20, 10])
    log = BatchLog()
    interval = "spark.sql.streaming.noDataProgressEventInterval"
    previous = spark.conf.get(interval, None)
    spark.conf.set(interval, "300ms")  # progress events while a batch is held back
    try:
        df = kit.reader(spark, topic, stream=True, startingOffsets="earliest", minOffsetsPerTrigger="25",
                        maxTriggerDelay="1h").load()
        q = _start(df, log, tmp_path / "ckpt", processingTime="200 milliseconds")
    finally:
        if previous is None:
            spark.conf.unset(interval)
        else:
            spark.conf.set(interval, previous)
    try:
        wait_for(q, lambda q: len(log.rows()) >= 30)  # the first batch of a run is never held back
        kit.produce(topic, mqs, [10, 0])  # 10 < 25: held back

        def total(p, key: str) -> int:
            offsets = p["sources"][0][key]
            return sum(json.loads(offsets)[topic]["broker-a"].values()) if offsets else -1

        def held_back(q) -> bool:
            p = q.lastProgress
            return p is not None and (total(p, "latestOffset"), total(p, "endOffset")) == (40, 30)
        wait_for(q, held_back)
        assert offsets_behind_latest(q.lastProgress["sources"][0]) == {
            "minOffsetsBehindLatest": 0, "maxOffsetsBehindLatest": 10, "avgOffsetsBehindLatest": 5.0}
        kit.produce(topic, mqs, [10, 5])  # 25 waiting now: read at the next trigger
        wait_for(q, lambda q: len(log.rows()) >= 55)
        # The sink sees a batch's rows before the query records its progress: wait for that too.
        wait_for(q, lambda q: sum(_rows_per_batch(q)) >= 55)
    finally:
        q.stop()
    assert len(log.rows()) == len(set(log.rows())) == 55
    assert _rows_per_batch(q) == [30, 25]


def test_register_runs_tidemark_workers_with_this_python_in_local_mode(spark, kit, monkeypatch):
    topic, mqs = kit.topic(1)
    kit.produce(topic, mqs, [3])
    context = spark.sparkContext
    # What a script run without $PYSPARK_PYTHON gets: workers started with an interpreter that lacks
    # tidemark (here one that does not exist at all, so using it fails for sure).
    monkeypatch.delenv("PYSPARK_PYTHON")
    monkeypatch.setattr(context, "pythonExec", "python3-without-tidemark")
    try:
        spark_connector.register(spark)
        assert context.pythonExec == "python3-without-tidemark"  # the session's own choice is untouched
        assert kit.read(spark, topic).count() == 3  # planning and tasks ran in a tidemark interpreter
    finally:
        monkeypatch.undo()
        spark_connector.register(spark)
