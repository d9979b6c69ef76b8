"""Options at Kafka-source parity (subscribePattern, assign, by-timestamp positions, minOffsetsPerTrigger,
maxTriggerDelay) and the pure pieces behind them: queue JSON, the trigger gate, lag from progress.

No SparkSession and no broker.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadMaxRows, ReadMinRows

from tidemark.client.message import MessageQueue
from tidemark.spark_connector import SCHEMA, OptionError, TidemarkDataSource, offsets_behind_latest
from tidemark.spark_connector.admission import TriggerGate
from tidemark.spark_connector.offsets import offsets_to_json, waiting_messages
from tidemark.spark_connector.options import (
    DEFAULT_MAX_TRIGGER_DELAY_S,
    ByTimestamp,
    OffsetKind,
    check_read_options,
    parse_read_options,
)
from tidemark.spark_connector.queues import QueueRef, Subscription, parse_assign, resolve, unmatched

SERVERS = {"brokers": "127.0.0.1:1"}


def read(streaming: bool = False, **options: str):
    return parse_read_options({**SERVERS, **options}, streaming=streaming)


def mq(topic: str, broker: str, queue_id: int) -> MessageQueue:
    return MessageQueue(topic, broker, queue_id)


TWO_BROKERS = [mq("A", b, q) for b in ("broker-a", "broker-b") for q in range(3)] + [mq("B", "broker-a", 0)]


# -- subscriptions ------------------------------------------------------------------------


def test_subscribe_pattern_matches_whole_topic_names():
    sub = read(subscribePattern="orders-.*").subscription
    assert sub.option == "subscribePattern" and sub.topic_names() == ()
    queues = [mq("orders-eu", "broker-a", 0), mq("orders-us", "broker-b", 1), mq("old-orders-eu", "broker-a", 0),
              mq("orders", "broker-a", 0)]
    assert sub.select(queues) == sorted(queues[:2])
    # Java's matches(): the pattern must cover the whole name, not a part of it.
    assert not read(subscribePattern="orders").subscription.covers_topic("orders-eu")


def test_assign_flat_and_per_broker_forms():
    refs = parse_assign({"A": [2, 0, 0], "B": {"broker-a": [0]}})
    assert refs == (QueueRef("A", None, 0), QueueRef("A", None, 2), QueueRef("B", "broker-a", 0))
    sub = Subscription(assign=refs)
    # A flat id names that queue on every broker; a broker entry only its own.
    assert sub.select(TWO_BROKERS) == sorted([mq("A", "broker-a", 0), mq("A", "broker-b", 0), mq("A", "broker-a", 2),
                                              mq("A", "broker-b", 2), mq("B", "broker-a", 0)])
    assert sub.topic_names() == ("A", "B")
    assert unmatched(parse_assign({"A": {"broker-c": [0]}, "B": [0, 7]}), TWO_BROKERS) == [
        QueueRef("A", "broker-c", 0), QueueRef("B", None, 7)]


def test_read_options_keep_the_subscription():
    o = read(True, assign='{"A": [1]}', startingOffsets='{"A": {"1": 4}}')
    assert o.topics == ("A",) and o.subscription.assign == (QueueRef("A", None, 1),)
    assert read(topic="x,y").subscription == Subscription(topics=("x", "y"))


# -- per-queue values -----------------------------------------------------------------------


def test_offsets_json_in_kafka_form_means_every_broker_and_broker_entries_win():
    o = read(topic="A", startingOffsets=json.dumps({"A": {"0": 5, "1": -1, "broker-b": {"0": 9}}}))
    assert o.starting == {QueueRef("A", None, 0): 5, QueueRef("A", None, 1): -1, QueueRef("A", "broker-b", 0): 9}
    assert resolve(o.starting, TWO_BROKERS) == {  # type: ignore[arg-type]
        mq("A", "broker-a", 0): 5, mq("A", "broker-b", 0): 9, mq("A", "broker-a", 1): -1, mq("A", "broker-b", 1): -1}


def test_by_timestamp_positions():
    o = read(topic="A", startingOffsetsByTimestamp='{"A": {"0": 1700000000000, "broker-b": {"1": 5}}}',
             endingTimestamp="1800000000000")
    assert o.starting == ByTimestamp(per_queue={QueueRef("A", None, 0): 1700000000000,
                                                QueueRef("A", "broker-b", 1): 5})
    assert o.ending == ByTimestamp(every_queue=1800000000000)
    s = read(True, topic="A", startingTimestamp="0")
    assert s.starting == ByTimestamp(every_queue=0) and s.ending is OffsetKind.LATEST
    assert read(topic="A", endingOffsetsByTimestamp='{"A": {"2": 7}}').ending == \
        ByTimestamp(per_queue={QueueRef("A", None, 2): 7})


def test_trigger_options():
    o = read(True, topic="A", minOffsetsPerTrigger="50", maxOffsetsPerTrigger="100", maxTriggerDelay="30s")
    assert (o.min_offsets_per_trigger, o.max_offsets_per_trigger, o.max_trigger_delay_s) == (50, 100, 30.0)
    assert read(True, topic="A", minOffsetsPerTrigger="5").max_trigger_delay_s == DEFAULT_MAX_TRIGGER_DELAY_S == 900
    for text, seconds in (("250", 0.25), ("250ms", 0.25), ("2 min", 120), ("1h", 3600), ("1d", 86400)):
        assert read(True, topic="A", minOffsetsPerTrigger="1", maxTriggerDelay=text).max_trigger_delay_s == seconds


@pytest.mark.parametrize(("options", "names"), [
    ({"topic": "A", "subscribePattern": "A.*"}, ["only one of", "'topic'", "'subscribePattern'"]),
    ({"assign": '{"A": [0]}', "subscribePattern": "A.*"}, ["only one of", "'assign'"]),
    ({}, ["'topic' is required", "subscribePattern", "assign"]),
    ({"subscribePattern": "orders-(eu"}, ["subscribePattern", "not a valid regular expression"]),
    ({"subscribePattern": " "}, ["subscribePattern", "empty"]),
    ({"assign": '{"A": [0'}, ["'assign' is not valid JSON"]),
    ({"assign": "[0, 1]"}, ["assign", "JSON object"]),
    ({"assign": '{"A": []}'}, ["assign", "non-empty list"]),
    ({"assign": '{"A": ["x"]}'}, ["assign", "'x'", "not an integer"]),
    ({"assign": '{"A": [-1]}'}, ["assign", ">= 0"]),
    ({"assign": '{"bad topic": [0]}'}, ["assign", "bad topic"]),
    ({"assign": '{"A": [0]}', "startingOffsets": '{"A": {"1": 3}}'}, ["startingOffsets", "A/*/1", "assign"]),
    ({"subscribePattern": "A.*", "startingOffsets": '{"B": {"0": 3}}'}, ["startingOffsets", "'B'", "A.*"]),
    ({"topic": "A", "startingOffsets": '{"A": {"0": -3}}'}, ["startingOffsets", "-2 earliest"]),
    ({"topic": "A", "endingOffsets": '{"A": {"0": -2}}'}, ["endingOffsets", "-2"]),
    ({"topic": "A", "startingTimestamp": "5", "startingOffsetsByTimestamp": '{"A": {"0": 1}}'},
     ["only one of", "'startingTimestamp' and 'startingOffsetsByTimestamp'"]),
    ({"topic": "A", "endingOffsets": "latest", "endingTimestamp": "5"}, ["only one of", "'endingOffsets'"]),
    ({"topic": "A", "startingOffsetsByTimestamp": '{"A": {"0": "noon"}}'}, ["startingOffsetsByTimestamp",
                                                                            "A/0", "ms since the epoch"]),
    ({"topic": "A", "startingOffsetsByTimestamp": '{"A": {"0": 1'}, ["startingOffsetsByTimestamp", "JSON"]),
    ({"topic": "A", "endingOffsetsByTimestamp": '{"C": {"0": 1}}'}, ["endingOffsetsByTimestamp", "'C'"]),
    ({"topic": "A", "endingTimestamp": "-1"}, ["endingTimestamp", ">= 0"]),
    ({"topic": "A", "startingTimestamp": "20", "endingTimestamp": "10"}, ["'endingTimestamp' (10) is before"]),
])
def test_bad_options_name_the_option(options, names):
    with pytest.raises(OptionError) as e:
        read(**options)
    for name in names:
        assert name in str(e.value)


@pytest.mark.parametrize(("options", "names"), [
    ({"minOffsetsPerTrigger": "0"}, ["minOffsetsPerTrigger", ">= 1"]),
    ({"minOffsetsPerTrigger": "lots"}, ["minOffsetsPerTrigger", "integer"]),
    ({"minOffsetsPerTrigger": "11", "maxOffsetsPerTrigger": "10"}, ["'minOffsetsPerTrigger' (11) is above"]),
    ({"maxTriggerDelay": "5s"}, ["'maxTriggerDelay' only applies with option 'minOffsetsPerTrigger'"]),
    ({"minOffsetsPerTrigger": "1", "maxTriggerDelay": "soon"}, ["maxTriggerDelay", "duration"]),
    ({"minOffsetsPerTrigger": "1", "maxTriggerDelay": "1.5s"}, ["maxTriggerDelay", "duration"]),
    ({"endingTimestamp": "5"}, ["'endingTimestamp' applies to batch queries only"]),
    ({"endingOffsetsByTimestamp": '{"A": {"0": 1}}'}, ["'endingOffsetsByTimestamp' applies to batch"]),
])
def test_bad_stream_options_name_the_option(options, names):
    with pytest.raises(OptionError) as e:
        read(True, topic="A", **options)
    for name in names:
        assert name in str(e.value)


def test_load_time_check_skips_only_what_depends_on_batch_or_stream():
    check_read_options({**SERVERS, "topic": "A", "endingTimestamp": "5", "minOffsetsPerTrigger": "3"})
    with pytest.raises(OptionError, match="unknown tidemark read option 'subscribe'"):
        check_read_options({**SERVERS, "subscribe": "A"})
    with pytest.raises(OptionError, match="only one of"):
        check_read_options({**SERVERS, "topic": "A", "assign": '{"A": [0]}'})
    with pytest.raises(OptionError, match="'maxOffsetsPerTrigger' must be >= 1"):
        check_read_options({**SERVERS, "topic": "A", "maxOffsetsPerTrigger": "0"})


# -- trigger gate -----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_gate_waits_for_min_rows_or_the_delay():
    clock = Clock()
    gate = TriggerGate(100, 60, clock=clock)
    assert not gate.admit(0)  # nothing to read is never a batch
    assert gate.admit(3)  # the first batch of a run is not held back (Kafka)
    clock.now += 10
    assert not gate.admit(99)
    assert gate.admit(100)  # enough messages
    clock.now += 59
    assert not gate.admit(1)
    clock.now += 1
    assert gate.admit(1)  # delay passed since the last batch
    clock.now += 3600  # a long idle stretch does not restart the clock ...
    assert not gate.admit(0)
    assert gate.admit(1)  # ... so the next lone message is read at once


def test_stream_reader_owns_a_gate_and_asks_spark_for_its_limit():
    ds = TidemarkDataSource({**SERVERS, "topic": "A", "minOffsetsPerTrigger": "7", "maxTriggerDelay": "4s"})
    reader = ds.streamReader(SCHEMA)
    assert (reader._gate.min_rows, reader._gate.max_delay_s) == (7, 4.0)
    # Not ReadAllAvailable: that one means Trigger.Once, which never waits.
    assert reader.getDefaultReadLimit() == ReadMinRows(7)
    capped = TidemarkDataSource({**SERVERS, "topic": "A", "minOffsetsPerTrigger": "7", "maxOffsetsPerTrigger": "9"})
    assert capped.streamReader(SCHEMA).getDefaultReadLimit() == ReadMaxRows(9)
    assert TidemarkDataSource({**SERVERS, "topic": "A"}).streamReader(SCHEMA)._gate is None


def test_waiting_messages_count_known_queues_only():
    a0, a1, new = mq("A", "b", 0), mq("A", "b", 1), mq("A", "b", 2)
    assert waiting_messages({a0: 5, a1: 9}, {a0: (0, 12), a1: (0, 9), new: (0, 50)}) == 7
    assert waiting_messages({a0: 20}, {a0: (0, 12)}) == 0  # re-created queue: data loss, not backlog


# -- lag from progress --------------------------------------------------------------------------


def test_offsets_behind_latest_from_progress():
    a, b, c = mq("A", "broker-a", 0), mq("A", "broker-a", 1), mq("A", "broker-b", 0)
    source = {"endOffset": json.dumps(offsets_to_json({a: 10, b: 4})),
              "latestOffset": json.dumps(offsets_to_json({a: 100, b: 4, c: 7}))}  # c: not in the stream yet
    assert offsets_behind_latest(source) == {"minOffsetsBehindLatest": 0, "maxOffsetsBehindLatest": 90,
                                             "avgOffsetsBehindLatest": 45.0}
    assert offsets_behind_latest({"endOffset": None, "latestOffset": None}) is None
    assert offsets_behind_latest({"endOffset": "{}", "latestOffset": source["latestOffset"]}) is None


@given(st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), min_size=1))
def test_offsets_behind_latest_bounds(queues):
    end = {mq("A", "broker-a", q): e for q, (e, _) in queues.items()}
    latest = {mq("A", "broker-a", q): e + d for q, (e, d) in queues.items()}
    got = offsets_behind_latest({"endOffset": offsets_to_json(end), "latestOffset": offsets_to_json(latest)})
    assert got is not None
    assert got["minOffsetsBehindLatest"] <= got["avgOffsetsBehindLatest"] <= got["maxOffsetsBehindLatest"]
    assert got["maxOffsetsBehindLatest"] == max(d for _, d in queues.values())
