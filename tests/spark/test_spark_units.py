"""Pure parts of the Spark connector: options, offset JSON, rate limit, range splitting, data loss, Arrow.

No SparkSession and no broker: these run in milliseconds.
"""

from __future__ import annotations

import json
import pickle

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import IntegerType, MapType, StringType, StructField, StructType

from tidemark.broker.store.codec import encode_record
from tidemark.broker.store.model import MessageRecord
from tidemark.client.message import MessageExt, MessageQueue
from tidemark.spark_connector import (
    ARROW_SCHEMA,
    SCHEMA,
    DataLossError,
    OptionError,
    TidemarkDataSource,
)
from tidemark.spark_connector.arrow import records_to_batch
from tidemark.spark_connector.offsets import (
    OffsetFormatError,
    OffsetRange,
    check_start,
    next_batch_end,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
    split_ranges,
)
from tidemark.spark_connector.options import OffsetKind, parse_read_options, parse_write_options
from tidemark.spark_connector.planner import stream_ranges
from tidemark.spark_connector.queues import QueueRef
from tidemark.spark_connector.sink import check_write_schema
from tidemark.spark_connector.source import (
    QueueRangePartition,
    TidemarkBatchReader,
    TidemarkStreamReader,
)

BASE = {"brokers": "127.0.0.1:1", "topic": "t"}


def read(streaming: bool = False, **extra: str):
    return parse_read_options({**BASE, **extra}, streaming=streaming)


def mq(i: int, topic: str = "t", broker: str = "broker-a") -> MessageQueue:
    return MessageQueue(topic, broker, i)


# -- options -------------------------------------------------------------------------


def test_defaults_differ_for_batch_and_streaming():
    batch, stream = read(), read(streaming=True)
    assert batch.starting is OffsetKind.EARLIEST and stream.starting is OffsetKind.LATEST
    assert batch.ending is OffsetKind.LATEST
    assert batch.fail_on_data_loss and stream.commit_offsets
    assert batch.max_offsets_per_trigger is None and batch.min_partitions is None
    assert batch.tag_expression == "*"


def test_keys_are_case_insensitive_and_values_parsed():
    o = parse_read_options({"BROKERS": "h:1,h2:2", "Topic": "a, b,a", "GROUP": "g", "failondataloss": "FALSE",
                            "maxoffsetspertrigger": "100", "MinPartitions": "8", "tagexpression": "x || y",
                            "commitOffsets": "false"}, streaming=True)
    assert o.brokers == ("h:1", "h2:2") and o.topics == ("a", "b") and o.group == "g"
    assert not o.fail_on_data_loss and not o.commit_offsets
    assert o.max_offsets_per_trigger == 100 and o.min_partitions == 8


def test_json_offsets_parse_with_sentinels():
    o = read(startingOffsets='{"t": {"broker-a": {"0": 5, "1": -2, "2": -1}}}')
    assert o.starting == {QueueRef("t", "broker-a", 0): 5, QueueRef("t", "broker-a", 1): -2,
                          QueueRef("t", "broker-a", 2): -1}


@pytest.mark.parametrize(("extra", "streaming", "names"), [
    ({"startingOffsets": '{"t": {"broker-a": {"0": 5}'}, False, ["startingOffsets", "JSON"]),
    ({"startingOffsets": '{"t": {"broker-a": {"x": 5}}}'}, False, ["startingOffsets", "'x'"]),
    ({"startingOffsets": '{"t": {"broker-a": {"0": "5"}}}'}, False, ["startingOffsets", "integer"]),
    ({"startingOffsets": '{"other": {"broker-a": {"0": 5}}}'}, False, ["startingOffsets", "'other'"]),
    ({"startingOffsets": "newest"}, False, ["startingOffsets", "earliest | latest | committed"]),
    ({"startingOffsets": "committed"}, False, ["committed", "group"]),
    ({"endingOffsets": "committed"}, False, ["endingOffsets"]),
    ({"endingOffsets": '{"t": {"broker-a": {"0": -2}}}'}, False, ["endingOffsets", "-2"]),
    ({"endingOffsets": "latest"}, True, ["endingOffsets", "batch"]),
    ({"maxOffsetsPerTrigger": "0"}, True, ["maxOffsetsPerTrigger", ">= 1"]),
    ({"maxOffsetsPerTrigger": "ten"}, True, ["maxOffsetsPerTrigger", "integer"]),
    ({"maxOffsetsPerTrigger": "10"}, False, ["maxOffsetsPerTrigger", "streaming"]),
    ({"minPartitions": "-1"}, False, ["minPartitions"]),
    ({"failOnDataLoss": "yes"}, False, ["failOnDataLoss", "true or false"]),
    ({"commitOffsets": "1"}, True, ["commitOffsets", "true or false"]),
    ({"startingTimestamp": "yesterday"}, False, ["startingTimestamp", "integer"]),
    ({"startingTimestamp": "5", "startingOffsets": "earliest"}, False, ["startingTimestamp", "startingOffsets"]),
    ({"tagExpression": "a || "}, False, ["tagExpression"]),
    ({"group": "bad group!"}, False, ["group"]),
    ({"brokers": "nohost"}, False, ["brokers", "host:port"]),
    ({"topic": ""}, False, ["topic", "required"]),
    ({"topic": "bad topic"}, False, ["topic"]),
    ({"startingOffset": "earliest"}, False, ["unknown", "startingOffset"]),
])
def test_bad_read_options_name_the_option(extra, streaming, names):
    with pytest.raises(OptionError) as e:
        read(streaming, **extra)
    for name in names:
        assert name in str(e.value)


def test_write_options():
    assert parse_write_options({"TOPIC": "out", "brokers": "h:1", "checkpointLocation": "/x"}).topic == "out"
    with pytest.raises(OptionError, match="exactly one topic"):
        parse_write_options({"topic": "a,b"})
    with pytest.raises(OptionError, match="unknown tidemark write option 'group'"):
        parse_write_options({"topic": "a", "group": "g"})


SECRET = "spark-s3cret-never-shown"


def test_security_options_reach_the_clients_and_never_show_the_secret():
    from tidemark.client.security import TlsSettings
    from tidemark.common.auth import Credentials
    from tidemark.spark_connector.fetch import FetchSettings

    opts = {**BASE, "ACCESSKEY": "etl", "secretKey": SECRET, "tlsCaFile": "/certs/ca.pem",
            "tlsCertFile": "/certs/c.pem", "tlsKeyFile": "/certs/c.key"}
    read = parse_read_options(opts, streaming=True)
    write = parse_write_options({**opts, "topic": "out"})
    tls = TlsSettings(ca_file="/certs/ca.pem", cert_file="/certs/c.pem", key_file="/certs/c.key")
    for parsed in (read, write):
        assert parsed.client_kwargs()["credentials"] == Credentials("etl", SECRET)
        assert parsed.client_kwargs()["tls"] == tls
        assert SECRET not in repr(parsed) and "etl" in repr(parsed)
    fetch = FetchSettings(brokers="h:1", fail_on_data_loss=True, poll_timeout_s=1, security=read.security)
    assert fetch.client_kwargs()["credentials"].secret_key == SECRET and SECRET not in repr(fetch)
    assert parse_read_options({**BASE, "tls": "true"}, streaming=False).security.tls == TlsSettings()
    assert parse_read_options(BASE, streaming=False).client_kwargs() == {"brokers": "127.0.0.1:1", "namesrv": ()}


@pytest.mark.parametrize(("extra", "message"), [
    ({"accessKey": "etl"}, "'secretKey' is missing"),
    ({"secretKey": SECRET}, "'accessKey' is missing"),
    ({"tls": "false", "tlsCaFile": "/ca.pem"}, "tls=false contradicts"),
    ({"tls": "maybe"}, "'tls' must be true or false"),
    ({"tlsCertFile": "/c.pem"}, "'tlsCertFile' and 'tlsKeyFile' go together"),
])
def test_bad_security_options(extra, message):
    for parse in (lambda o: parse_read_options(o, streaming=False), parse_write_options):
        with pytest.raises(OptionError, match=message) as e:
            parse({**BASE, **extra})
        assert SECRET not in str(e.value)


def test_write_schema_checks():
    check_write_schema(StructType([StructField("body", StringType()), StructField("other", IntegerType())]))
    with pytest.raises(OptionError, match="needs a 'body' column"):
        check_write_schema(StructType([StructField("value", StringType())]))
    with pytest.raises(OptionError, match="'queue_id'.*integer"):
        check_write_schema(StructType([StructField("body", StringType()), StructField("queue_id", StringType())]))
    with pytest.raises(OptionError, match="'properties'.*map<string,string>"):
        check_write_schema(StructType([StructField("body", StringType()),
                                       StructField("properties", MapType(StringType(), IntegerType()))]))


# -- offsets JSON ----------------------------------------------------------------------

names = st.text(alphabet="abcXYZ019_-", min_size=1, max_size=8)
offset_maps = st.dictionaries(st.builds(MessageQueue, names, names, st.integers(0, 64)),
                              st.integers(0, 2**62), max_size=12)


@given(offset_maps)
def test_offsets_json_round_trip(offsets):
    doc = offsets_to_json(offsets)
    text = json.dumps(doc)
    assert offsets_from_json(json.loads(text)) == offsets
    # Canonical: the same positions always serialize to the same string (Spark compares them).
    assert json.dumps(offsets_to_json(dict(reversed(list(offsets.items()))))) == text
    assert all(isinstance(k, str) for b in doc.values() for q in b.values() for k in q)


@pytest.mark.parametrize("doc", [[], {"t": []}, {"t": {"b": 3}}, {"t": {"b": {"0": -1}}}, {"t": {"b": {"0": True}}},
                                 {"t": {"b": {"-1": 0}}}])
def test_offsets_json_rejects_bad_shapes(doc):
    with pytest.raises(OffsetFormatError):
        offsets_from_json(doc)


# -- maxOffsetsPerTrigger split ----------------------------------------------------------


def test_rate_limit_is_proportional_to_backlog():
    starts = {mq(0): 0, mq(1): 0, mq(2): 0, mq(3): 0}
    latest = {mq(0): 400, mq(1): 300, mq(2): 200, mq(3): 100}
    assert rate_limit(starts, latest, 100) == {mq(0): 40, mq(1): 30, mq(2): 20, mq(3): 10}
    # Kafka would round 0.5 shares up for small queues and admit 101; the total stays at the limit here.
    assert sum(rate_limit({mq(i): 0 for i in range(101)}, {mq(i): 1 for i in range(101)}, 100).values()) == 100
    assert rate_limit(starts, latest, 5000) == latest


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**5)), min_size=1, max_size=20),
       st.integers(1, 10**5))
def test_rate_limit_properties(queues, limit):
    starts = {mq(i): s for i, (s, _) in enumerate(queues)}
    latest = {mq(i): s + n for i, (s, n) in enumerate(queues)}
    ends = rate_limit(starts, latest, limit)
    total = sum(n for _, n in queues)
    assert sum(ends[q] - starts[q] for q in starts) == min(limit, total)
    for q in starts:
        assert starts[q] <= ends[q] <= latest[q]
        backlog = latest[q] - starts[q]
        # Proportional within one offset.
        assert abs((ends[q] - starts[q]) - min(limit, total) * backlog / max(total, 1)) < 1 + 1e-9


# -- minPartitions splitting ------------------------------------------------------------


def test_split_ranges_like_kafka():
    ranges = [OffsetRange(mq(0), 0, 100), OffsetRange(mq(1), 0, 10), OffsetRange(mq(2), 5, 5)]
    assert split_ranges(ranges, None) == ranges[:2]
    assert split_ranges(ranges, 2) == ranges[:2]
    out = split_ranges(ranges, 11)
    assert [(r.mq.queue_id, r.start, r.end) for r in out] == \
        [(0, 0, 10), (0, 10, 20), (0, 20, 30), (0, 30, 40), (0, 40, 50), (0, 50, 60), (0, 60, 70), (0, 70, 80),
         (0, 80, 90), (0, 90, 100), (1, 0, 10)]


@given(st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 10**4)), min_size=1, max_size=10),
       st.integers(1, 200))
def test_split_ranges_cover_each_offset_once(spans, min_partitions):
    ranges = [OffsetRange(mq(i), s, s + n) for i, (s, n) in enumerate(spans)]
    out = split_ranges(ranges, min_partitions)
    assert all(r.size > 0 for r in out)
    for r in ranges:
        pieces = [p for p in out if p.mq == r.mq]
        assert sum(p.size for p in pieces) == r.size
        if pieces:
            assert pieces[0].start == r.start and pieces[-1].end == r.end
            assert all(a.end == b.start for a, b in zip(pieces, pieces[1:], strict=False))
    nonempty = [r for r in ranges if r.size]
    assert len(out) >= len(nonempty)
    if min_partitions > len(nonempty):
        # round(size / ideal) pieces per large range: at least 2/3 of what was asked (or one per offset).
        assert len(out) >= 2 * min(min_partitions, sum(r.size for r in nonempty)) // 3


# -- data loss ------------------------------------------------------------------------


def test_check_start_inside_range():
    assert check_start(mq(0), 5, 0, 10, fail_on_data_loss=True) == 5
    assert check_start(mq(0), 10, 0, 10, fail_on_data_loss=True) == 10


def test_data_loss_below_min_fails_naming_the_queue_or_clamps():
    with pytest.raises(DataLossError) as e:
        check_start(mq(3), 5, 100, 200, fail_on_data_loss=True)
    assert "queueId=3" in str(e.value) and "below the queue's min offset 100" in str(e.value)
    assert "failOnDataLoss=false" in str(e.value)
    assert check_start(mq(3), 5, 100, 200, fail_on_data_loss=False) == 100


def test_data_loss_above_max_means_recreated_queue():
    with pytest.raises(DataLossError, match="beyond the queue's max offset 7; the topic was probably deleted"):
        check_start(mq(1), 50, 0, 7, fail_on_data_loss=True)
    assert check_start(mq(1), 50, 0, 7, fail_on_data_loss=False) == 0


def test_next_batch_end_rate_limits_and_admits_new_queues_at_min():
    starts = {mq(0): 10, mq(1): 0}
    bounds = {mq(0): (0, 110), mq(1): (0, 300), mq(2): (40, 90)}  # queue 2 is new
    end = next_batch_end(starts, bounds, max_rows=100, target=None, fail_on_data_loss=True)
    assert end == {mq(0): 35, mq(1): 75, mq(2): 40}
    assert next_batch_end(starts, bounds, max_rows=None, target=None, fail_on_data_loss=True) == \
        {mq(0): 110, mq(1): 300, mq(2): 40}


def test_next_batch_end_stops_at_the_available_now_target():
    starts = {mq(0): 10, mq(1): 0}
    bounds = {mq(0): (0, 110), mq(1): (0, 300), mq(2): (0, 90)}
    target = {mq(0): 50, mq(1): 300}  # queue 2 appeared after the target was taken
    end = next_batch_end(starts, bounds, max_rows=None, target=target, fail_on_data_loss=True)
    assert end == {mq(0): 50, mq(1): 300}
    # Once there, the end equals the start: Spark sees no new data and AvailableNow finishes.
    assert next_batch_end(end, bounds, max_rows=7, target=target, fail_on_data_loss=True) == end


def test_next_batch_end_data_loss():
    bounds = {mq(0): (100, 200), mq(1): (0, 5)}
    expired, recreated = {mq(0): 20, mq(1): 0}, {mq(0): 100, mq(1): 30}
    with pytest.raises(DataLossError, match="queueId=0.*below the queue's min offset 100"):
        next_batch_end(expired, bounds, max_rows=None, target=None, fail_on_data_loss=True)
    with pytest.raises(DataLossError, match="queueId=1.*beyond the queue's max offset 5"):
        next_batch_end(recreated, bounds, max_rows=None, target=None, fail_on_data_loss=True)
    # Without failOnDataLoss: an expired start reads from the min offset (the range still starts
    # at 20; the executor skips to 100), a re-created queue rejoins at its min with no rows.
    # Backlogs 100 (from the min offset) and 5 share 50 rows: 47.6 -> 48, 2.4 -> 2.
    assert next_batch_end(expired, bounds, max_rows=50, target=None, fail_on_data_loss=False) == \
        {mq(0): 148, mq(1): 2}
    assert next_batch_end(recreated, bounds, max_rows=None, target=None, fail_on_data_loss=False) == \
        {mq(0): 200, mq(1): 0}


def test_next_batch_end_keeps_vanished_queues():
    starts = {mq(0): 5, mq(0, topic="gone"): 9}
    assert next_batch_end(starts, {mq(0): (0, 8)}, max_rows=None, target=None, fail_on_data_loss=True) == \
        {mq(0): 8, mq(0, topic="gone"): 9}


def test_stream_ranges_skip_new_and_reset_queues():
    o = read(streaming=True)
    start = offsets_to_json({mq(0): 10, mq(1): 50, mq(2): 3})
    end = offsets_to_json({mq(0): 20, mq(1): 0, mq(2): 3, mq(3): 0})
    assert stream_ranges(o, start, end) == [OffsetRange(mq(0), 10, 20)]


# -- Arrow ----------------------------------------------------------------------------


def test_arrow_schema_is_what_pyspark_expects():
    assert ARROW_SCHEMA.equals(to_arrow_schema(SCHEMA, timezone="UTC"))


def _stored(records: list[MessageRecord]) -> bytes:
    """Records as the broker stores and serves them (sealed, back to back)."""
    out, phys = b"", 1000
    for i, r in enumerate(records):
        data = encode_record(r, queue_offset=7 + i, physical_offset=phys, store_timestamp=1_700_000_000_456)
        out += data
        phys += len(data)
    return out


def test_record_batch_from_stored_records():
    recs = [MessageRecord("t", 2, b"body%d" % i,
                          {"UNIQ_KEY": f"id{i}", "KEYS": "k", **({"TAGS": "tg", "a": "1"} if i else {})},
                          born_timestamp=1_700_000_000_123, reconsume_times=i) for i in range(3)]
    batch = records_to_batch(_stored(recs), 3, topic="t", broker="broker-a")
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    assert rows[0]["tags"] is None and rows[1]["tags"] == "tg"
    assert [r["msg_id"] for r in rows] == ["id0", "id1", "id2"] and rows[2]["keys"] == "k"
    assert rows[0]["properties"] == [] and rows[1]["properties"] == [("a", "1")]
    assert [r["body"] for r in rows] == [b"body0", b"body1", b"body2"]
    assert batch.column("born_timestamp")[0] == pa.scalar(1_700_000_000_123_000, pa.timestamp("us", tz="UTC"))
    assert batch.column("store_timestamp")[0] == pa.scalar(1_700_000_000_456_000, pa.timestamp("us", tz="UTC"))
    assert batch.column("queue_offset").to_pylist() == [7, 8, 9]
    assert batch.column("reconsume_times").to_pylist() == [0, 1, 2]
    assert set(batch.column("topic").to_pylist()) == {"t"} and set(batch.column("queue_id").to_pylist()) == {2}


_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), _text, _text,
                          st.dictionaries(_text.filter(bool), _text, max_size=3)), min_size=1, max_size=30))
def test_bulk_conversion_matches_decoding_each_record(messages):
    """records_to_batch (numpy + Arrow kernels) agrees field by field with decoding record by record."""
    recs = []
    for i, (body, tags, keys, props) in enumerate(messages):
        p = {k: v for k, v in props.items() if k not in ("UNIQ_KEY", "TAGS", "KEYS")}
        p["UNIQ_KEY"] = f"ID{i}"
        if tags:
            p["TAGS"] = tags
        if keys:
            p["KEYS"] = keys
        recs.append(MessageRecord("T", 1, body, p))
    data = _stored(recs)
    rows = records_to_batch(data, len(recs), topic="T", broker="b").to_pylist()
    pos = 0
    for row in rows:
        m = MessageExt.from_record(data, pos, topic="T", broker_name="b")
        pos += m.store_size
        assert row["body"] == m.body and row["msg_id"] == m.msg_id and row["queue_offset"] == m.queue_offset
        assert row["tags"] == (m.tags or None) and row["keys"] == (m.keys or None)
        assert dict(row["properties"]) == dict(m.properties)


# -- nothing unpicklable --------------------------------------------------------------


def test_source_objects_pickle():
    ds = TidemarkDataSource({**BASE, "startingOffsets": '{"t": {"broker-a": {"0": 1}}}'})
    reader = ds.reader(SCHEMA)
    stream = ds.streamReader(SCHEMA)
    stream._target = offsets_to_json({mq(0): 5})
    sink = TidemarkDataSource(dict(BASE))
    writer = sink.writer(StructType([StructField("body", StringType())]), False)
    stream_writer = sink.streamWriter(StructType([StructField("body", StringType())]), False)
    partition = QueueRangePartition("t", "broker-a", 0, 10, 20)
    for obj in (ds, reader, stream, writer, stream_writer, partition):
        copy = pickle.loads(pickle.dumps(obj))
        assert type(copy) is type(obj)
    assert pickle.loads(pickle.dumps(partition)) == partition
    assert isinstance(reader, TidemarkBatchReader) and isinstance(stream, TidemarkStreamReader)
    assert pickle.loads(pickle.dumps(reader)).options == reader.options


def test_fixed_schema_and_append_only():
    ds = TidemarkDataSource(dict(BASE))
    with pytest.raises(OptionError, match="fixed schema"):
        ds.reader(StructType([StructField("body", StringType())]))
    with pytest.raises(OptionError, match="append"):
        ds.writer(StructType([StructField("body", StringType())]), True)


_TEXT = st.text(st.characters(blacklist_characters="\x01\x02|", blacklist_categories=("Cs",)), max_size=12)


# Property names the encoder merges with the message's fields (TAGS, KEYS) or keeps in place of a generated
# id (UNIQ_KEY), drawn often: a row holding one is sized as the encoder merges it.
_PROPERTY_NAME = st.one_of(st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY"]), _TEXT.filter(bool))


@given(body=st.binary(min_size=1, max_size=64), tags=_TEXT, keys=_TEXT,
       properties=st.dictionaries(_PROPERTY_NAME, _TEXT, max_size=4))
def test_a_row_is_counted_in_the_bytes_the_producer_encodes(body, tags, keys, properties):
    """The row-by-row sink sizes a batch by its records as the client encodes them, in UTF-8 bytes (an
    emoji is 4 bytes, not 1 character), header included, and with a TAGS, KEYS or UNIQ_KEY property
    counted once, as the encoder keeps it."""
    from tidemark.client import Message
    from tidemark.client.producer.encoding import encode_message
    from tidemark.common.protocol import MessageIdGenerator
    from tidemark.common.records import RecordBatchBuilder
    from tidemark.spark_connector.sink import _record_fixed_size, _row_size

    message = Message(topic="orders", body=body, tags=tags, keys=keys, properties=properties)
    _, props, _ = encode_message(message, MessageIdGenerator())
    encoded = RecordBatchBuilder(message.topic, "10.0.0.1").append(body, props)
    assert _record_fixed_size(message.topic, "10.0.0.1") + _row_size(message) == encoded


def test_a_workers_first_write_freezes_what_it_holds_once():
    """The objects a Python worker holds when its first write starts leave the cyclic GC's walks (the full
    gc.collect() pyspark runs after every task); a later write freezes nothing more. In a process of its
    own: freezing is for the whole process."""
    import subprocess
    import sys

    script = """
import gc
from tidemark.spark_connector.sink import TidemarkWriter
from tidemark.spark_connector.options import parse_write_options
writer = TidemarkWriter(parse_write_options({"brokers": "127.0.0.1:1", "topic": "t"}))
before = gc.get_freeze_count()
for _ in range(2):
    try:
        writer.write(iter(()))
    except Exception:
        pass  # no broker: the freeze comes first
    print(gc.get_freeze_count(), flush=True)
    made_since = [[] for _ in range(1000)]  # tracked objects the second write must not freeze
print(before)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    first, second, before = (int(n) for n in out.stdout.split())
    assert before == 0
    assert first > 10_000  # pyarrow's, gRPC's, the connector's objects
    assert second < first + 1000  # (a frozen object freed by its last reference leaves the count)
