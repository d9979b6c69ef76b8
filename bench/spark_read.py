"""Spark connector throughput: tidemark source vs. Parquet and JSON lines, batch and streaming.

    python -m bench.spark_read                       # starts a throwaway broker; 1,000,000 x 200 B
    python -m bench.spark_read --brokers h:p --messages 200000

Produces --messages messages of --size bytes over --queues queues, then in one
local[2] SparkSession measures rows/s of the same aggregation (touching every
column) over
  1. spark.read.format("tidemark") (batch),
  2. the same rows written to Parquet, and 3. to JSON lines (read with the schema),
  4. spark.readStream.format("tidemark") with maxOffsetsPerTrigger=100000 and
     Trigger.AvailableNow into the noop sink.
Each batch read runs --repeat times after one warm-up run; the best time counts.
Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.procs import Server, free_port
from tidemark.client import Admin, Message, MessageQueue, Producer


def produce(brokers: str, topic: str, queues: int, messages: int, size: int) -> float:
    with Admin(brokers=brokers) as admin:
        admin.create_topic(topic, queues)
        mqs = admin.fetch_message_queues(topic)
    body = b"x" * size
    start = time.perf_counter()
    with Producer(brokers=brokers) as producer:
        sent = 0
        batch = 500
        while sent < messages:
            n = min(batch, messages - sent)
            mq: MessageQueue = mqs[(sent // batch) % len(mqs)]
            producer.send_batch([Message(topic, body, keys=f"k{sent + i}", tags="bench") for i in range(n)], queue=mq)
            sent += n
    return messages / (time.perf_counter() - start)


def aggregate(df):
    from pyspark.sql import functions as F

    return df.agg(F.count("*"), F.sum(F.length("body")), F.max("queue_offset"), F.count("msg_id"),
                  F.count("keys"), F.count("tags"), F.sum(F.size("properties")), F.max("store_timestamp"),
                  F.max("born_timestamp"), F.sum("reconsume_times"), F.countDistinct("queue_id"),
                  F.max("topic"), F.max("broker")).collect()[0]


def best_rate(label: str, make_df, rows: int, repeat: int) -> float:
    aggregate(make_df())  # warm-up: Python workers, JIT, file listing
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = aggregate(make_df())
        times.append(time.perf_counter() - start)
        if result[0] != rows:
            raise SystemExit(f"{label}: read {result[0]} rows, expected {rows}")
    rate = rows / min(times)
    print(f"{label:<34} {rate:>12,.0f} rows/s   best {min(times):6.2f}s of {', '.join(f'{t:.2f}' for t in times)}")
    return rate


def stream_rate(spark, brokers: str, topic: str, rows: int, checkpoint: Path) -> float:
    start = time.perf_counter()
    q = (spark.readStream.format("tidemark").option("brokers", brokers).option("topic", topic)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100000").load()
         .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    elapsed = time.perf_counter() - start
    if q.exception() is not None:
        raise SystemExit(f"stream failed: {q.exception()}")
    read = sum(p["numInputRows"] for p in q.recentProgress)
    if read != rows:
        raise SystemExit(f"stream read {read} rows, expected {rows}")
    per_batch = [p["numInputRows"] / max(p["durationMs"]["triggerExecution"] / 1000, 1e-9)
                 for p in q.recentProgress if p["numInputRows"]]
    rate = rows / elapsed
    print(f"{'tidemark streaming (100k/trigger)':<34} {rate:>12,.0f} rows/s   {elapsed:6.2f}s, "
          f"{len(per_batch)} batches, per batch {min(per_batch):,.0f}..{max(per_batch):,.0f} rows/s")
    return rate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--brokers", default=None, help="use these brokers (default: start one)")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="tidemark-spark-bench-"))
    broker = None
    try:
        brokers = args.brokers
        if brokers is None:
            port = free_port()
            broker = Server("broker", [sys.executable, "-m", "tidemark.broker.app", "--data-dir", str(scratch / "data"),
                                       "--port", str(port)], scratch / "broker.log").start()
            broker.wait_log(r"event=broker_ready")
            brokers = f"127.0.0.1:{port}"
        topic = f"spark-bench-{os.getpid()}"
        rate = produce(brokers, topic, args.queues, args.messages, args.size)
        print(f"produced {args.messages:,} x {args.size} B over {args.queues} queues ({rate:,.0f} msg/s)")

        from pyspark.sql import SparkSession

        from tidemark import spark_connector

        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = (SparkSession.builder.master("local[2]").appName("tidemark-spark-bench")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark_connector.register(spark)

        def tidemark():
            return spark.read.format("tidemark").option("brokers", brokers).option("topic", topic).load()

        n = args.messages
        print(f"Spark {spark.version}, local[2]; aggregation over every column of {n:,} rows")
        t = best_rate("tidemark batch (4 queues)", tidemark, n, args.repeat)
        parquet, jsonl = str(scratch / "rows.parquet"), str(scratch / "rows.json")
        tidemark().write.parquet(parquet)
        tidemark().write.json(jsonl)
        schema = spark_connector.SCHEMA
        p = best_rate("parquet", lambda: spark.read.schema(schema).parquet(parquet), n, args.repeat)
        j = best_rate("json lines (with schema)", lambda: spark.read.schema(schema).json(jsonl), n, args.repeat)
        print(f"ratios: tidemark/parquet = {t / p:.2f}, tidemark/json = {t / j:.2f}")
        stream_rate(spark, brokers, topic, n, scratch / "checkpoint")
        spark.stop()
        return 0
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
