"""A bad option reaches the user as the connector's one-line message (spark_connector.user_errors) from
load(), a batch query's planning, save() and a stream's run: no Python traceback, no UnboundLocalError.
No broker: the options alone are wrong and nothing connects.

What Spark itself adds is allowed: its error class before the message, the SQLSTATE after it and, for a
stream, the query's description below it.
"""

from __future__ import annotations

import os

import pytest
from pyspark.errors import PySparkException

from tidemark.spark_connector import OptionError, TidemarkDataSource
from tidemark.spark_connector.source import RejectedStreamReader
from tidemark.spark_connector.user_errors import option_errors_in_one_line

NO_BROKER = "127.0.0.1:1"


def assert_one_line(error: BaseException, message: str) -> None:
    text = str(error)
    assert "Traceback" not in text and "UnboundLocalError" not in text, text
    assert text.splitlines()[0].endswith(f"OptionError: {message}"), text


def _read(spark, *, stream: bool = False, **options: str):
    r = (spark.readStream if stream else spark.read).format("tidemark").option("brokers", NO_BROKER)
    return r.options(**options)


@pytest.mark.spark
def test_bad_options_of_batch_reads_and_writes_are_one_line(spark):
    with pytest.raises(PySparkException) as e:
        _read(spark, topic="T", startingOffsetZ="earliest").load()
    assert_one_line(e.value, "unknown tidemark read option 'startingoffsetz'; known options (case-insensitive): "
                             "brokers, namesrv, topic, subscribePattern, assign, group, startingOffsets, "
                             "startingTimestamp, startingOffsetsByTimestamp, endingOffsets, endingTimestamp, "
                             "endingOffsetsByTimestamp, maxOffsetsPerTrigger, minOffsetsPerTrigger, maxTriggerDelay, "
                             "minPartitions, failOnDataLoss, tagExpression, commitOffsets, pollTimeoutMs, "
                             "accessKey, secretKey, tls, tlsCaFile, tlsCertFile, tlsKeyFile")
    with pytest.raises(PySparkException) as e:  # batch vs streaming is known when the query plans
        _read(spark, topic="T", maxOffsetsPerTrigger="10").load().collect()
    assert_one_line(e.value, "tidemark option 'maxOffsetsPerTrigger' applies to streaming queries only, "
                             "not to batch reads")
    body = spark.sql("select 'x' as body")
    with pytest.raises(PySparkException) as e:
        body.write.format("tidemark").mode("append").option("brokers", NO_BROKER).option("topic", "a,b").save()
    assert_one_line(e.value, "tidemark option 'topic' must name exactly one topic for writes, got 'a,b'")
    with pytest.raises(PySparkException) as e:
        body.write.format("tidemark").mode("overwrite").option("brokers", NO_BROKER).option("topic", "a").save()
    assert_one_line(e.value, "the tidemark sink only appends messages; use mode('append')")


@pytest.mark.spark
@pytest.mark.parametrize("trigger", [{"availableNow": True}, {"processingTime": "0 seconds"}])
def test_a_batch_only_option_fails_the_stream_with_its_message_alone(spark, tmp_path, trigger):
    # Spark makes the stream reader in the query's thread, so the error comes from the query, not start().
    q = (_read(spark, stream=True, topic="T", endingOffsets="latest").load()
         .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt")).trigger(**trigger).start())
    try:
        with pytest.raises(PySparkException) as e:
            q.awaitTermination(60)
    finally:
        q.stop()
    assert_one_line(e.value, "tidemark option 'endingOffsets' applies to batch queries only, not to streaming reads")


# -- without Spark ---------------------------------------------------------------------------------


def test_stream_reader_for_bad_options_fails_at_spark_first_call_and_stops_quietly():
    source = TidemarkDataSource({"brokers": NO_BROKER, "topic": "T", "endingTimestamp": "5"})
    reader = source.streamReader(source.schema())
    assert isinstance(reader, RejectedStreamReader)
    message = "tidemark option 'endingTimestamp' applies to batch queries only, not to streaming reads"
    for call in (reader.initialOffset, reader.getDefaultReadLimit, reader.prepareForTriggerAvailableNow,
                 lambda: reader.latestOffset({}, None), lambda: reader.partitions({}, {}),
                 lambda: reader.commit({}), lambda: reader.read(None)):
        with pytest.raises(OptionError) as e:
            call()
        assert str(e.value) == message
    reader.stop()  # what PySpark's stream runner calls on the way out


def _raise(error: Exception) -> None:
    with option_errors_in_one_line():
        raise error


def test_the_traceback_is_hidden_only_in_a_spark_worker_failing_with_an_option_error(monkeypatch):
    monkeypatch.delenv("SPARK_HIDE_TRACEBACK", raising=False)
    monkeypatch.delenv("SPARK_PYTHON_RUNTIME", raising=False)
    with pytest.raises(OptionError):
        _raise(OptionError("bad"))
    assert "SPARK_HIDE_TRACEBACK" not in os.environ  # the driver's process: untouched

    monkeypatch.setenv("SPARK_PYTHON_RUNTIME", "PYTHON_WORKER")  # what Spark sets for its workers
    with pytest.raises(ValueError):
        _raise(ValueError("a defect keeps its traceback"))
    assert "SPARK_HIDE_TRACEBACK" not in os.environ
    with pytest.raises(OptionError):
        _raise(OptionError("bad"))
    assert os.environ["SPARK_HIDE_TRACEBACK"] == "1"
