"""Writes: df.write and df.writeStream .format("tidemark"), read back through the source."""

from __future__ import annotations

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from spark_testlib import wait_for

pytestmark = pytest.mark.spark


def _write(kit, df, topic):
    df.write.format("tidemark").mode("append").option("brokers", kit.address).option("topic", topic).save()


def test_write_then_read_back(spark, kit):
    topic, _ = kit.topic(4)
    rows = [(f"m{i}", f"k{i}" if i % 3 else None, f"t{i % 2}", {"i": str(i)} if i % 4 else None,
             2 if i % 5 == 0 else None) for i in range(200)]
    df = spark.createDataFrame(rows, "body string, keys string, tags string, properties map<string,string>, "
                                     "queue_id int").repartition(3)
    _write(kit, df, topic)
    back = kit.read(spark, topic).collect()
    assert len(back) == 200
    got = sorted((bytes(r.body).decode(), r.keys, r.tags, r.properties or None) for r in back)
    assert got == sorted((b, k, t, p) for b, k, t, p, _ in rows)
    # Rows with a queue_id went to that queue.
    by_body = {bytes(r.body).decode(): r.queue_id for r in back}
    assert all(by_body[b] == 2 for b, *_, q in rows if q == 2)
    # The other rows were spread over the queues, in batches.
    assert len({r.queue_id for r in back}) > 1


def test_write_binary_bodies_and_extra_columns(spark, kit):
    topic, _ = kit.topic(1)
    source, mqs = kit.topic(2)
    kit.produce(source, mqs, [20, 20])
    # A DataFrame read from one topic can be written to another: extra columns are ignored.
    _write(kit, kit.read(spark, source).drop("queue_id", "broker"), topic)
    assert sorted(bytes(r.body) for r in kit.read(spark, topic).collect()) == \
        sorted(bytes(r.body) for r in kit.read(spark, source).collect())


@pytest.mark.parametrize(("frame", "expected"), [
    ("select 'x' as value", "needs a 'body' column"),
    ("select cast(null as string) as body", "row 0 has a null body"),
    ("select 'x' as body, 9 as queue_id", "has no writable queue 9"),
    ("select '' as body", "message body must not be empty"),
    ("select 'x' as body, map('a', cast(null as string)) as properties", "row 0 has a null value in properties ['a']"),
])
def test_write_errors_fail_with_the_reason(spark, kit, frame, expected):
    topic, _ = kit.topic(1)
    with pytest.raises(PySparkException) as e:
        _write(kit, spark.sql(frame), topic)
    assert expected in str(e.value)


def test_write_needs_append_mode(spark, kit):
    topic, _ = kit.topic(1)
    with pytest.raises(PySparkException, match="only appends"):
        spark.sql("select 'x' as body").write.format("tidemark").mode("overwrite").option("topic", topic) \
            .option("brokers", kit.address).save()


def test_write_stream_from_rate_source(spark, kit, tmp_path):
    topic, _ = kit.topic(4)
    rate = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", "50").load()
            .select(F.col("value").cast("string").alias("body"), F.lit("rate").alias("tags")))
    q = (rate.writeStream.format("tidemark").option("brokers", kit.address).option("topic", topic)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="0 seconds").start())
    wait_for(q, lambda q: sum(p["numInputRows"] for p in q.recentProgress) >= 150)
    q.stop()
    done = sum(p["numInputRows"] for p in q.recentProgress)
    values = [int(bytes(r.body)) for r in kit.read(spark, topic).collect()]
    # At-least-once: every row of every finished batch is there; a batch cut by stop() may add rows.
    assert set(range(done)) <= set(values)
    assert set(values) <= set(range(done + 50))
    assert len(values) == len(set(values))  # no batch ran twice


def test_rows_with_large_properties_go_in_requests_the_broker_takes(kit):
    """The row-by-row path (a properties column) sizes its batches by the properties too: 2,048 rows of
    small bodies and 2.5 KB of properties each are 5 MB encoded, over a request's 4 MiB."""
    import pyarrow as pa

    from tidemark.spark_connector.options import parse_write_options
    from tidemark.spark_connector.sink import produce

    topic, _ = kit.topic(1)
    n = 2048
    props = pa.array([[("p", "v" * 2500)]] * n, pa.map_(pa.string(), pa.string()))
    batch = pa.RecordBatch.from_arrays([pa.array([b"x"] * n, pa.binary()), props], names=["body", "properties"])
    options = parse_write_options({"brokers": kit.address, "topic": topic})
    assert produce(options, iter([batch])) == n
    with kit.admin() as admin:
        assert sum(high - low for low, high in admin.offsets(admin.fetch_message_queues(topic)).values()) == n


def test_a_large_row_after_a_smaller_one_goes_in_its_own_request(spark, kit):
    """A batch is sent before the row that would take it past 1 MiB: a 1.0 MB row then a 3.5 MB row (each
    one a request the broker takes) are two requests, not one of 4.5 MB over max_message_size (4 MiB)."""
    topic, _ = kit.topic(1)
    rows = [("a" * 1_000_000, {"row": "a"}), ("b" * 3_500_000, {"row": "b"})]
    _write(kit, spark.createDataFrame(rows, "body string, properties map<string,string>").coalesce(1), topic)
    back = kit.read(spark, topic).collect()
    assert sorted((r.properties["row"], len(r.body)) for r in back) == [("a", 1_000_000), ("b", 3_500_000)]


def test_rows_with_non_ascii_properties_are_counted_in_bytes(spark, kit):
    """A batch counts UTF-8 bytes, not characters: 105 rows of 10,000 emoji (40,000 bytes) each are
    about 1 MB counted by characters and 4.2 MB encoded, over a request's 4 MiB."""
    topic, _ = kit.topic(1)
    n, emoji = 105, "\N{GRINNING FACE}" * 10_000
    rows = [(f"m{i}", {"e": emoji}) for i in range(n)]
    _write(kit, spark.createDataFrame(rows, "body string, properties map<string,string>").coalesce(1), topic)
    back = kit.read(spark, topic).collect()
    assert sorted(bytes(r.body).decode() for r in back) == sorted(b for b, _ in rows)
    assert all(r.properties["e"] == emoji for r in back)
