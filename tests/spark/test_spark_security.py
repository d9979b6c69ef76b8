"""Spark against a broker with TLS and auth: reads and writes with the accessKey/secretKey/tls/tlsCaFile
options, refusals without them, and the secret key never in a query plan, a streaming checkpoint or an
error message."""

from __future__ import annotations

import pytest
from brokerproc import BrokerProcess
from pyspark.errors import PySparkException
from pyspark.sql import functions as F
from tlslib import make_pki

from tidemark.broker.auth.guard import INVALID_CREDENTIALS
from tidemark.client import Admin, Message, Producer, TlsSettings

pytestmark = pytest.mark.spark

ROOT = ("root", "spark-root-secret-1")
WRITER = ("etl-writer", "w-s3cret-never-shown")
READER = ("etl-reader", "r-s3cret-never-shown")
SECRETS = (ROOT[1], WRITER[1], READER[1])
TOPIC, SINK, GROUP = "SparkSecure", "SparkSecureOut", "spark-secure"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    pki = make_pki(tmp_path_factory.mktemp("spark-pki"))
    broker = BrokerProcess(tmp_path_factory.mktemp("spark-secure") / "data", args=(
        "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
        "--auth", "--init-user", ":".join(ROOT))).start()
    with Admin(brokers=broker.address, credentials=ROOT, tls=TlsSettings(ca_file=str(pki.ca))) as admin:
        for topic in (TOPIC, SINK):
            admin.create_topic(topic, 2)
        admin.create_user(*WRITER)
        admin.create_user(*READER)
        admin.create_acl(WRITER[0], f"Topic:{TOPIC}", ["Pub"], "Allow")
        admin.create_acl(WRITER[0], f"Topic:{SINK}", ["Pub"], "Allow")
        admin.create_acl(READER[0], f"Topic:{TOPIC}", ["Sub"], "Allow")
        admin.create_acl(READER[0], f"Group:{GROUP}", ["Sub"], "Allow")
    yield broker, str(pki.ca)
    broker.kill()
    assert not any(s in broker.log_text() for s in SECRETS)


def _options(broker, ca: str, topic: str, credentials: tuple[str, str] | None) -> dict[str, str]:
    out = {"brokers": broker.address, "topic": topic, "tls": "true", "tlsCaFile": ca}
    if credentials is not None:
        out["accessKey"], out["secretKey"] = credentials
    return out


def _plans(df) -> str:
    """Every text Spark shows of a DataFrame's plan: explain(extended) and the QueryExecution string."""
    jvm = df.sparkSession.sparkContext._jvm
    return (jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "extended")
            + df._jdf.queryExecution().toString())


def test_write_and_read_through_tls_and_auth(spark, secure):
    broker, ca = secure
    rows = spark.createDataFrame([(f"m{i}", f"t{i % 2}") for i in range(100)], "body string, tags string")
    rows.write.format("tidemark").mode("append").options(**_options(broker, ca, TOPIC, WRITER)).save()

    df = spark.read.format("tidemark").options(**_options(broker, ca, TOPIC, READER)).load()
    written = sorted(bytes(r.body).decode() for r in df.collect() if r.tags in ("t0", "t1"))
    assert written == sorted(f"m{i}" for i in range(100))
    plans = _plans(df)
    assert "tidemark" in plans.lower() and not any(s in plans for s in SECRETS), plans


def test_stream_with_a_group_commits_and_writes_as_plain_users(spark, secure, tmp_path):
    broker, ca = secure
    with Producer(brokers=broker.address, credentials=WRITER, tls=TlsSettings(ca_file=ca)) as producer:
        producer.send_batch([Message(TOPIC, b"streamed-%d" % i) for i in range(50)])
    stream = (spark.readStream.format("tidemark").options(**_options(broker, ca, TOPIC, READER))
              .option("group", GROUP).option("startingOffsets", "earliest").load()
              .select(F.col("body"), F.lit("copied").alias("tags")))
    query = (stream.writeStream.format("tidemark").options(**_options(broker, ca, SINK, WRITER))
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(60), "the availableNow query did not finish"
        assert query.exception() is None
        plans = query._jsq.explainInternal(True) + str(query.recentProgress)
    finally:
        query.stop()
    assert "tidemark" in plans.lower() and not any(s in plans for s in SECRETS), plans
    for path in (tmp_path / "ckpt").rglob("*"):
        if path.is_file():
            assert not any(s.encode() in path.read_bytes() for s in SECRETS), path
    with Admin(brokers=broker.address, credentials=ROOT, tls=TlsSettings(ca_file=ca)) as admin:
        stats = admin.consume_stats(GROUP, TOPIC)
        copied = [m.body for mq in admin.fetch_message_queues(SINK) for m in admin.pull(mq, 0, max_nums=1000).messages
                  if m.tags == "copied"]
    assert sum(s.lag for s in stats) == 0 and sum(s.consumer_offset for s in stats) >= 50
    assert {b"streamed-%d" % i for i in range(50)} <= set(copied)


@pytest.mark.parametrize(("credentials", "why"), [
    (None, "no credentials"),
    ((READER[0], "not-the-secret"), INVALID_CREDENTIALS),
    (WRITER, f"user '{WRITER[0]}' may not"),
])
def test_reads_are_refused_without_the_right_credentials(spark, secure, credentials, why):
    broker, ca = secure
    with pytest.raises(PySparkException) as refused:
        spark.read.format("tidemark").options(**_options(broker, ca, TOPIC, credentials)).load().collect()
    assert why in str(refused.value)
    assert not any(s in str(refused.value) for s in SECRETS)


def test_writes_are_refused_without_the_right_credentials(spark, secure):
    broker, ca = secure
    rows = spark.createDataFrame([("x",)], "body string")
    for credentials, why in ((None, "no credentials"), (READER, f"user '{READER[0]}' may not")):
        with pytest.raises(PySparkException) as refused:
            rows.write.format("tidemark").mode("append").options(**_options(broker, ca, SINK, credentials)).save()
        assert why in str(refused.value)
