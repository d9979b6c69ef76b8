"""Option `namesrv`: the connector finds the brokers through name servers, on the driver and on executors.

The end-to-end test runs a real name server and two brokers registering with it; the Spark
writer and readers get only the `namesrv` option, never a broker address.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter

import pytest
from pyspark.errors import PySparkException
from spark_testlib import BatchLog

from tidemark.client import Admin
from tidemark.client.message import MessageQueue
from tidemark.spark_connector import OptionError
from tidemark.spark_connector.fetch import FetchSettings
from tidemark.spark_connector.options import parse_read_options, parse_write_options

BROKERS = ("broker-a", "broker-b")
ROWS = 40
TARGETED = 32  # rows with queue_id + broker columns (8 per queue); the rest go round-robin


# -- options (no Spark, no broker) -----------------------------------------------------


def _parsers():
    return (lambda o: parse_read_options(o, streaming=False), lambda o: parse_read_options(o, streaming=True),
            parse_write_options)


def test_namesrv_option_reaches_every_client(monkeypatch):
    monkeypatch.delenv("TIDEMARK_NAMESRV", raising=False)
    for parse in _parsers():
        parsed = parse({"topic": "t", "NameSrv": " 10.0.0.1:9876 , ns2:9877 "})
        assert parsed.namesrv == ("10.0.0.1:9876", "ns2:9877")
        assert parsed.client_kwargs()["namesrv"] == ("10.0.0.1:9876", "ns2:9877")
    fetch = FetchSettings(brokers="h:1", namesrv=("ns:1",), fail_on_data_loss=True, poll_timeout_s=1)
    assert fetch.client_kwargs()["namesrv"] == ("ns:1",)
    assert "name servers ns:1" in fetch.servers


def test_namesrv_default_comes_from_the_driver_env_unless_brokers_is_given(monkeypatch):
    monkeypatch.setenv("TIDEMARK_NAMESRV", "envns:9876")
    for parse in _parsers():
        assert parse({"topic": "t"}).namesrv == ("envns:9876",)
        # An explicit broker list is not overridden by the environment, on the driver or on executors.
        explicit = parse({"topic": "t", "brokers": "h:1"})
        assert explicit.namesrv == () and explicit.client_kwargs()["namesrv"] == ()
        assert parse({"topic": "t", "brokers": "h:1", "namesrv": "ns:1"}).namesrv == ("ns:1",)
    monkeypatch.setenv("TIDEMARK_NAMESRV", "no-port")
    with pytest.raises(OptionError, match="'namesrv'.*TIDEMARK_NAMESRV.*'no-port' is not host:port"):
        parse_read_options({"topic": "t"}, streaming=False)
    monkeypatch.delenv("TIDEMARK_NAMESRV")
    assert parse_write_options({"topic": "t"}).namesrv == ()


@pytest.mark.parametrize(("value", "message"), [
    ("nohost", "name server address 'nohost' is not host:port"),
    ("h:0", "name server address 'h:0' is not host:port"),
    ("h:1,h:99999", "name server address 'h:99999' is not host:port"),
    (":9876", "name server address ':9876' is not host:port"),
    (" , ", "at least one name server address (host:port) is needed"),
])
def test_bad_namesrv_is_an_option_error(value, message):
    for parse in _parsers():
        with pytest.raises(OptionError) as e:
            parse({"topic": "t", "namesrv": value})
        assert str(e.value) == f"tidemark option 'namesrv': {message}"


# -- Spark ---------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize("option", ["brokers", "namesrv"])
def test_bad_namesrv_fails_reads_and_writes_like_bad_brokers(spark, tmp_path, option):
    """No server needed: the options are checked before anything connects."""
    expected = f"tidemark option {option!r}:"
    with pytest.raises(PySparkException) as e:
        spark.read.format("tidemark").option(option, "nohost").option("topic", "t").load().collect()
    assert expected in str(e.value)
    with pytest.raises(PySparkException) as e:
        spark.sql("select 'x' as body").write.format("tidemark").mode("append").option(option, "nohost") \
            .option("topic", "t").save()
    assert expected in str(e.value)
    with pytest.raises(PySparkException) as e:
        q = (spark.readStream.format("tidemark").option(option, "nohost").option("topic", "t").load()
             .writeStream.foreachBatch(BatchLog()).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination(60)
    assert expected in str(e.value)


@pytest.mark.spark
def test_write_and_read_through_the_name_server(spark, namesrv_factory, broker_factory, tmp_path):
    ns = namesrv_factory()
    for name in BROKERS:
        broker_factory(name, args=("--namesrv", ns.address))
    topic = f"spark-ns-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    with Admin(namesrv=(ns.address,)) as admin:
        # Brokers register before they report ready, and a created topic is registered at once.
        assert sorted(b.broker_name for b in admin.cluster_list()) == list(BROKERS)
        admin.create_topic(topic, 2)
        mqs = admin.fetch_message_queues(topic)
    assert sorted((mq.broker_name, mq.queue_id) for mq in mqs) == [(b, q) for b in BROKERS for q in (0, 1)]

    # Batch write with only the namesrv option: rows naming a queue (broker column: names from the
    # name server's route) and rows spread round-robin.
    def target(i: int) -> tuple[str | None, int | None]:
        return (BROKERS[i % 2], (i // 2) % 2) if i < TARGETED else (None, None)

    bodies = [f"{topic}/{i}" for i in range(ROWS)]
    df = spark.createDataFrame([(b, *target(i)) for i, b in enumerate(bodies)],
                               "body string, broker string, queue_id int").repartition(3)
    df.write.format("tidemark").mode("append").option("namesrv", ns.address).option("topic", topic).save()

    with Admin(namesrv=(ns.address,)) as admin:
        stats = {(s.queue.broker_name, s.queue.queue_id): s.max_offset for s in admin.topic_stats(topic)}
    assert set(stats) == {(b, q) for b in BROKERS for q in (0, 1)}
    assert sum(stats.values()) == ROWS
    assert all(count >= TARGETED // 4 for count in stats.values()), stats  # so: both brokers got messages

    # Batch read with only the namesrv option: planning (driver) and fetching (executors) both use it.
    rows = (spark.read.format("tidemark").option("namesrv", ns.address).option("topic", topic).load()
            .select("broker", "queue_id", "body").collect())
    got = Counter(bytes(r.body).decode() for r in rows)
    assert got == Counter(bodies)  # every body exactly once
    where = {bytes(r.body).decode(): (r.broker, r.queue_id) for r in rows}
    assert all(where[bodies[i]] == target(i) for i in range(TARGETED))
    assert {r.broker for r in rows} == set(BROKERS)

    # Streaming read (Trigger.AvailableNow) with only the namesrv option, committing to a group.
    group = f"{topic}-g"
    log = BatchLog()
    q = (spark.readStream.format("tidemark").option("namesrv", ns.address).option("topic", topic)
         .option("group", group).option("startingOffsets", "earliest").load()
         .writeStream.foreachBatch(log).option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    assert Counter(bytes(body).decode() for _, _, body in log.rows()) == Counter(bodies)
    end = json.loads(q.lastProgress["sources"][0]["endOffset"])[topic]
    assert {(b, int(k)): v for b, queues in end.items() for k, v in queues.items()} == stats
    with Admin(namesrv=(ns.address,)) as admin:
        committed = {(b, qid): admin.committed(group, MessageQueue(topic, b, qid)) for b, qid in stats}
    assert committed == stats
