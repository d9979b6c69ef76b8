"""Batch reads through spark.read.format("tidemark") against a real broker."""

from __future__ import annotations

import datetime as dt
import json
import time
from zoneinfo import ZoneInfo

import pytest
from pyspark.errors import PySparkException
from spark_testlib import Sent, row_key

from tidemark.spark_connector import SCHEMA

pytestmark = pytest.mark.spark


def test_schema_is_exact(spark, kit):
    topic, _ = kit.topic(1)
    assert kit.read(spark, topic).schema == SCHEMA
    assert kit.read(spark, topic).schema.simpleString() == (
        "struct<topic:string,broker:string,queue_id:int,queue_offset:bigint,msg_id:string,keys:string,tags:string,"
        "body:binary,properties:map<string,string>,born_timestamp:timestamp,store_timestamp:timestamp,"
        "reconsume_times:int>")


def test_batch_read_equals_what_was_produced(spark, kit):
    topic, mqs = kit.topic(4)
    before = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(seconds=5)
    sent = kit.produce(topic, mqs, [120, 75, 40, 1])
    df = kit.read(spark, topic)
    rows = df.collect()
    assert len(rows) == len(sent) == 236
    assert sorted(map(row_key, rows), key=_order) == sorted(sent, key=_order)
    assert {(r.topic, r.broker, r.reconsume_times) for r in rows} == {(topic, "broker-a", 0)}
    # Timestamps are instants (collected as naive UTC here: the machine runs in UTC or Spark converts).
    after = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(seconds=5)
    assert all(before <= r.born_timestamp <= r.store_timestamp <= after for r in rows), rows[0]
    # Every queue is one partition without minPartitions.
    assert df.rdd.getNumPartitions() == 4


def test_timestamps_are_instants_in_any_session_time_zone(spark, kit):
    topic, mqs = kit.topic(1)
    kit.produce(topic, mqs, [3])
    with kit.admin() as admin:
        stored = [admin.view_message(mqs[0], o) for o in range(3)]
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        rows = (kit.read(spark, topic).selectExpr("queue_offset", "unix_millis(born_timestamp) as born",
                                                  "unix_millis(store_timestamp) as store",
                                                  "date_format(store_timestamp, 'yyyy-MM-dd HH:mm:ss.SSS') as local")
                .orderBy("queue_offset").collect())
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
    assert [(r.born, r.store) for r in rows] == [(m.born_timestamp, m.store_timestamp) for m in stored]
    la = ZoneInfo("America/Los_Angeles")
    assert [r.local for r in rows] == [
        dt.datetime.fromtimestamp(m.store_timestamp / 1000, la).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] for m in stored]


def _order(s: Sent):
    return s.queue_id, s.queue_offset


def test_starting_and_ending_offsets_json(spark, kit):
    topic, mqs = kit.topic(4)
    sent = kit.produce(topic, mqs, [50, 50, 50, 50])
    starting = {topic: {"broker-a": {"0": 10, "1": -1, "2": -2}}}  # queue 3 left out: earliest
    ending = {topic: {"broker-a": {"0": 20, "2": 5, "3": -1}}}  # queue 1 left out: latest
    rows = kit.read(spark, topic, startingOffsets=json.dumps(starting), endingOffsets=json.dumps(ending)).collect()
    got = sorted((r.queue_id, r.queue_offset) for r in rows)
    want = sorted([(0, o) for o in range(10, 20)] + [(2, o) for o in range(0, 5)] + [(3, o) for o in range(50)])
    assert got == want
    assert {row_key(r) for r in rows} <= set(sent)


def test_starting_timestamp(spark, kit):
    topic, mqs = kit.topic(2)
    kit.produce(topic, mqs, [30, 30])
    cut = max(r.store_timestamp for r in kit.read(spark, topic).collect())
    cut_ms = int(cut.replace(tzinfo=dt.UTC).timestamp() * 1000) + 1
    while time.time() * 1000 <= cut_ms:  # the next messages must be stored after the cut
        time.sleep(0.005)
    later = kit.produce(topic, mqs, [7, 3])
    rows = kit.read(spark, topic, startingTimestamp=str(cut_ms)).collect()
    assert sorted(map(row_key, rows), key=_order) == sorted(later, key=_order)
    assert sorted((r.queue_id, r.queue_offset) for r in rows) == \
        [(0, o) for o in range(30, 37)] + [(1, o) for o in range(30, 33)]


def test_min_partitions_splits_queues_with_identical_rows(spark, kit):
    topic, mqs = kit.topic(4)
    kit.produce(topic, mqs, [300, 200, 20, 0])
    plain = kit.read(spark, topic)
    split = kit.read(spark, topic, minPartitions="10")
    assert plain.rdd.getNumPartitions() == 3  # the empty queue has no partition
    assert split.rdd.getNumPartitions() > 4
    plain_rows, split_rows = plain.collect(), split.collect()
    assert len(split_rows) == 520
    assert sorted(map(row_key, split_rows), key=_order) == sorted(map(row_key, plain_rows), key=_order)


def test_tag_expression_filters_rows(spark, kit):
    topic, mqs = kit.topic(2)
    sent = kit.produce(topic, mqs, [30, 30])
    rows = kit.read(spark, topic, tagExpression="tag0 || tag2").collect()
    assert sorted(map(row_key, rows), key=_order) == sorted((s for s in sent if s.tags in ("tag0", "tag2")), key=_order)


def test_empty_topic_reads_no_rows(spark, kit):
    topic, _ = kit.topic(2)
    assert kit.read(spark, topic).count() == 0


def test_two_brokers(spark, broker_factory):
    from spark_testlib import Kit

    a, b = broker_factory("broker-a"), broker_factory("broker-b")
    both = Kit(f"{a.address},{b.address}")
    topic, mqs = both.topic(2)
    assert {mq.broker_name for mq in mqs} == {"broker-a", "broker-b"}
    both.produce(topic, mqs, [5, 6, 7, 8])
    rows = both.read(spark, topic).collect()
    counts = {}
    for r in rows:
        counts[(r.broker, r.queue_id)] = counts.get((r.broker, r.queue_id), 0) + 1
    assert counts == {("broker-a", 0): 5, ("broker-a", 1): 6, ("broker-b", 0): 7, ("broker-b", 1): 8}


@pytest.mark.parametrize(("options", "expected"), [
    ({"topic": "no-such-topic"}, "topic 'no-such-topic' does not exist"),
    ({"startingOffsets": '{"T": {"broker-a": {"0": 1}'}, "'startingOffsets' is not valid JSON"),
    ({"failOnDataLoss": "maybe"}, "'failOnDataLoss' must be true or false"),
    ({"minPartitions": "many"}, "'minPartitions' must be an integer"),
    ({"startingOffsetz": "earliest"}, "unknown tidemark read option 'startingoffsetz'"),
    ({"endingOffsets": '{"T": {"broker-a": {"9": 1}}}'}, "names MessageQueue [topic=T, brokerName=broker-a, queueId=9]"),
])
def test_bad_options_fail_with_clear_message(spark, kit, options, expected):
    topic, _ = kit.topic(1)
    topic_options = {k: v.replace('"T"', json.dumps(topic)) for k, v in options.items()}
    expected = expected.replace("topic=T", f"topic={topic}")
    chosen = topic_options.pop("topic", topic)
    with pytest.raises(PySparkException) as e:
        kit.read(spark, chosen, **topic_options).collect()
    assert expected in str(e.value)
