"""Tidemark source and sink for the PySpark Python Data Source API (pyspark >= 4.2).

    from tidemark import spark_connector
    spark_connector.register(spark)

    df = (spark.read.format("tidemark")
          .option("brokers", "127.0.0.1:10911").option("topic", "orders").load())
    df = (spark.read.format("tidemark")   # brokers found through name servers
          .option("namesrv", "127.0.0.1:9876").option("topic", "orders").load())
    q = (spark.readStream.format("tidemark")
         .option("brokers", "127.0.0.1:10911").option("topic", "orders").option("group", "spark-orders")
         .option("maxOffsetsPerTrigger", "10000").load()
         .writeStream.option("checkpointLocation", "/tmp/ckpt").format("console").start())
    df.selectExpr("body").write.format("tidemark").mode("append").option("topic", "copy").save()

Read options (string values, case-insensitive keys):
  brokers               host:port[,host:port] (default: $TIDEMARK_BROKER or 127.0.0.1:10911)
  namesrv               host:port[,host:port] of name servers; when given, brokers are found through
                        them (and `brokers` is not used). Default: $TIDEMARK_NAMESRV of the driver,
                        unless `brokers` is given
  topic                 topic name, or a comma list (reads). Exactly one of topic, subscribePattern, assign
  subscribePattern      regex over topic names (whole name, system topics excluded): matched at load for
                        batch, at every micro-batch for streams (new matching topics join at earliest)
  assign                JSON queues: {"topic": [0, 1]} (those ids on every broker) or
                        {"topic": {"broker-a": [0, 1]}}
  group                 consumer group: startingOffsets=committed reads it, streaming commits to it
  startingOffsets       earliest | latest | committed | {"topic": {"broker": {"queueId": offset}}}
                        or {"topic": {"queueId": offset}} (that id on every broker)
                        (JSON: -2 earliest, -1 latest; queues left out start at earliest)
                        default: earliest for batch, latest for streaming
  endingOffsets         batch only: latest (default) | JSON (-1 latest; queues left out end at latest)
  startingTimestamp     ms since the epoch: each queue starts at its first message stored at or after it
                        (none: at its max offset, latest)
  startingOffsetsByTimestamp  the same per queue, JSON like startingOffsets; queues left out: earliest
  endingTimestamp, endingOffsetsByTimestamp  batch only: end before the first message stored at or
                        after the time (none: latest); queues left out: latest
                        (at most one option of each: starting*, ending*)
  maxOffsetsPerTrigger  streaming: at most this many offsets per micro-batch, split across queues
                        in proportion to their backlog
  minOffsetsPerTrigger  streaming: skip a trigger until this many new messages wait, or
  maxTriggerDelay       (default 15m) has passed since the last micro-batch
  minPartitions         split large queue ranges so there are at least about this many tasks
  failOnDataLoss        true (default): a start offset below a queue's min offset (retention) or above
                        its max (topic re-created) fails the query, naming the queue;
                        false: log a warning and continue at the queue's min offset
  tagExpression         "*" (default) or "tagA || tagB": rows whose tag does not match are skipped
  commitOffsets         streaming, default true: commit each finished micro-batch's end offsets to
                        `group`, so the group's consume stats show the query's lag
  pollTimeoutMs         how long a task waits for a message it knows exists (default 60000)
Write options: brokers, namesrv, topic. Columns: body (binary|string, required), keys, tags, properties
(map<string,string>), queue_id (int), broker (string). mode("append") only.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from tidemark.spark_connector.arrow import ARROW_SCHEMA, SCHEMA
from tidemark.spark_connector.offsets import DataLossError
from tidemark.spark_connector.options import OptionError
from tidemark.spark_connector.progress import offsets_behind_latest
from tidemark.spark_connector.source import TASK_SLOTS_ENV, TidemarkDataSource


def register(spark: Any) -> None:
    """Make format("tidemark") available in this SparkSession (readers, writers, streams).

    Spark runs the source and sink in Python workers started with $PYSPARK_PYTHON, by default
    `python3` from the PATH, which need not have tidemark installed. In local mode without
    $PYSPARK_PYTHON the tidemark workers run this interpreter instead: it has tidemark (it is running
    this function) and the workers are on this machine. The session's other Python code (UDFs) keeps
    Spark's choice. On a cluster, set PYSPARK_PYTHON to a Python with tidemark on every worker.

    The source's Python processes also learn the application's task slots (its default parallelism
    now, unless spark.executorEnv.TIDEMARK_SPARK_TASK_SLOTS says otherwise): a stream packs each
    micro-batch into one wave of tasks (planner.stream_tasks).
    """
    context = _spark_context(spark)
    if context is None:  # Spark Connect: the server's session registers and runs the source
        spark.dataSource.register(TidemarkDataSource)
        return
    # register() captures the context's pythonExec and environment in the data source's Python function.
    python, environment = context.pythonExec, dict(context.environment)
    if _local_without_pyspark_python(context):
        context.pythonExec = sys.executable
    context.environment.setdefault(TASK_SLOTS_ENV, str(context.defaultParallelism))
    try:
        spark.dataSource.register(TidemarkDataSource)
    finally:
        context.pythonExec = python
        context.environment.clear()
        context.environment.update(environment)


def _spark_context(spark: Any) -> Any:
    try:
        return spark.sparkContext
    except Exception:  # Spark Connect has no SparkContext on the client; its server decides
        return None


def _local_without_pyspark_python(context: Any) -> bool:
    return "PYSPARK_PYTHON" not in os.environ and bool(sys.executable) and str(context.master).startswith("local")


__all__ = ["ARROW_SCHEMA", "SCHEMA", "DataLossError", "OptionError", "TidemarkDataSource", "offsets_behind_latest",
           "register"]
