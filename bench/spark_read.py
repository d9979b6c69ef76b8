"""Spark connector read throughput: tidemark batch and streaming reads vs. JSON lines and Parquet of the same rows.

    python -m bench.spark_read                       # starts a throwaway broker; 1,000,000 x 200 B
    python -m bench.spark_read --brokers h:p --messages 200000
    python -m bench.spark_read --brokers h:p --topic t   # read what topic t holds, produce nothing
    python -m bench.spark_baseline REV /tmp/base   # then, A/B against the connector at REV:
    PYTHONPATH=/tmp/base python -m bench.spark_read --baseline tidemark_base=tidemark_base_source:Source

Produces --messages messages of --size bytes over --queues queues, copies them
to Parquet and to JSON lines, and then, in one local[2] SparkSession, runs
--rounds rounds; in each round every reader runs once, in turn:
  1. spark.read.format("tidemark") (batch) and the same aggregation (every column) over
  2. JSON lines (read with the schema) and 3. Parquet;
  4. spark.readStream.format("tidemark") with maxOffsetsPerTrigger=100000 and
     Trigger.AvailableNow into the noop sink, the whole topic (ten micro-batches of 1M rows);
  5. the same stream with the source's defaults (no maxOffsetsPerTrigger, as Spark's Kafka
     source has no per-trigger limit by default): AvailableNow then reads everything there is
     in one micro-batch.
Every reader runs once first as a warm-up. Interleaving makes the ratios (medians
of each round's ratios) steady on a busy machine, where the rows/s move with the load.

The stream is reported twice: "whole query" is rows / (start() to termination), the
query's own start-up included (Spark starts a Python process for the source's
planning per query); "micro-batches" is rows / the sum of the batches'
triggerExecution times, which is what a long-running stream sees.

--baseline NAME=module:Class registers another data source class (e.g. a copy of
an older connector under another package name, importable by the Python workers:
bench/spark_baseline.py makes one) and reads it the same way, batch and streaming,
in every round.
Prints numbers; asserts nothing (a wrong row count stops the run).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.procs import Server, free_port
from tidemark.client import Admin, Message, MessageQueue, Producer

PER_TRIGGER = 100_000


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


@dataclass
class Reader:
    """One way of reading the rows; `run` returns the seconds it counts (and checks the row count)."""

    label: str
    run: Callable[[], float]
    seconds: list[float] = field(default_factory=list)
    query_seconds: list[float] = field(default_factory=list)  # streams: start() to termination


def batch_reader(label: str, make_df, rows: int) -> Reader:
    def run() -> float:
        start = time.perf_counter()
        got = aggregate(make_df())[0]
        elapsed = time.perf_counter() - start
        if got != rows:
            raise SystemExit(f"{label}: read {got} rows, expected {rows}")
        return elapsed

    return Reader(label, run)


def stream_reader(label: str, spark, fmt: str, brokers: str, topic: str, rows: int, scratch: Path,
                  per_trigger: int | None = PER_TRIGGER) -> Reader:
    """The stream of the whole topic (AvailableNow, noop sink), at most per_trigger rows a micro-batch
    (None: the source's default, no limit)."""
    query_seconds: list[float] = []
    runs = itertools.count()

    def run() -> float:
        checkpoint = scratch / f"checkpoint-{fmt}-{per_trigger}-{next(runs)}"
        start = time.perf_counter()
        source = (spark.readStream.format(fmt).option("brokers", brokers).option("topic", topic)
                  .option("startingOffsets", "earliest"))
        if per_trigger is not None:
            source = source.option("maxOffsetsPerTrigger", str(per_trigger))
        q = (source.load()
             .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        elapsed = time.perf_counter() - start
        if q.exception() is not None:
            raise SystemExit(f"{label}: the stream failed: {q.exception()}")
        progress = q.recentProgress
        got = sum(p["numInputRows"] for p in progress)
        if got != rows:
            raise SystemExit(f"{label}: the stream read {got} rows, expected {rows}")
        query_seconds.append(elapsed)
        shutil.rmtree(checkpoint, ignore_errors=True)
        return sum(p["durationMs"]["triggerExecution"] for p in progress if p["numInputRows"]) / 1000

    return Reader(label, run, query_seconds=query_seconds)


def register_baseline(spark, spec: str) -> str:
    """NAME=module:Class -> the class registered; returns NAME (its format name must be NAME)."""
    name, _, target = spec.partition("=")
    module, _, cls = target.partition(":")
    source = getattr(importlib.import_module(module), cls)
    if source.name() != name:
        raise SystemExit(f"--baseline {spec}: {cls}.name() is {source.name()!r}, not {name!r}")
    spark.dataSource.register(source)
    return name


def rate(rows: int, seconds: list[float]) -> str:
    return f"{rows / statistics.median(seconds):>12,.0f}"


def ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a's rows/s over b's, from their seconds per round (the same rows)."""
    return statistics.median(tb / ta for ta, tb in zip(a, b, strict=True))


def start_broker(scratch: Path) -> tuple[Server, str]:
    """A broker of its own for a bench run, with its data under `scratch`: the server and its address."""
    port = free_port()
    broker = Server("broker", [sys.executable, "-m", "tidemark.broker.app", "--data-dir", str(scratch / "data"),
                               "--port", str(port)], scratch / "broker.log").start()
    broker.wait_log(r"event=broker_ready")
    return broker, f"127.0.0.1:{port}"


def spark_session():
    """The benchmarks' local[2] SparkSession (workers run this Python)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("tidemark-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--brokers", default=None, help="use these brokers (default: start one)")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--topic", default=None, help="read this topic as it is (with --brokers; no produce)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default=None, metavar="NAME=module:Class",
                        help="also read through this data source class, registered as format NAME")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="tidemark-spark-bench-"))
    broker = None
    try:
        brokers = args.brokers
        if brokers is None:
            broker, brokers = start_broker(scratch)
        if args.topic:
            topic = args.topic
            with Admin(brokers=brokers) as admin:
                n = sum(high - low for low, high in admin.offsets(admin.fetch_message_queues(topic)).values())
            print(f"topic {topic}: {n:,} messages")
        else:
            topic, n = f"spark-bench-{os.getpid()}", args.messages
            produced = produce(brokers, topic, args.queues, n, args.size)
            print(f"produced {n:,} x {args.size} B over {args.queues} queues ({produced:,.0f} msg/s)")

        from tidemark import spark_connector

        spark = spark_session()
        spark_connector.register(spark)
        formats = ["tidemark"]
        if args.baseline:
            formats.append(register_baseline(spark, args.baseline))

        schema = spark_connector.SCHEMA
        parquet, jsonl = str(scratch / "rows.parquet"), str(scratch / "rows.json")

        def source(fmt: str):
            return lambda: spark.read.format(fmt).option("brokers", brokers).option("topic", topic).load()

        source("tidemark")().write.parquet(parquet)
        source("tidemark")().write.json(jsonl)
        batch = {fmt: batch_reader(f"{fmt} batch", source(fmt), n) for fmt in formats}
        stream = {fmt: stream_reader(f"{fmt} streaming {PER_TRIGGER // 1000}k/trigger", spark, fmt, brokers, topic, n,
                                     scratch) for fmt in formats}
        defaults = {fmt: stream_reader(f"{fmt} streaming defaults", spark, fmt, brokers, topic, n, scratch,
                                       per_trigger=None) for fmt in formats}
        json_lines = batch_reader("json lines (with schema)", lambda: spark.read.schema(schema).json(jsonl), n)
        parquet_files = batch_reader("parquet", lambda: spark.read.schema(schema).parquet(parquet), n)
        readers = [*batch.values(), json_lines, parquet_files, *stream.values(), *defaults.values()]
        for reader in readers:
            reader.run()  # warm-up: Python workers, JIT, file listing
            reader.query_seconds.clear()
        print(f"Spark {spark.version}, local[2]; {n:,} rows, aggregation over every column (batch), noop sink "
              f"(streaming, AvailableNow: {PER_TRIGGER:,} per trigger, and defaults: no limit, one micro-batch); "
              f"{args.rounds} rounds, readers in turn")
        for r in range(args.rounds):
            for reader in readers:
                reader.seconds.append(reader.run())
            print(f"  round {r + 1}: " + ", ".join(f"{x.label} {x.seconds[-1]:.2f}s" for x in readers), flush=True)

        print(f"\n{'reader':<34} {'rows/s':>12}   (median of {args.rounds})")
        for reader in readers:
            print(f"{reader.label:<34} {rate(n, reader.seconds)}"
                  + (" micro-batches" if reader.query_seconds else ""))
            if reader.query_seconds:
                print(f"{reader.label + ', whole query':<34} {rate(n, reader.query_seconds)}")
        print("\nratios (median of the rounds' ratios):")
        for fmt in formats:
            b, s, d = batch[fmt], stream[fmt], defaults[fmt]
            print(f"  {fmt}: batch/json {ratio(b.seconds, json_lines.seconds):.2f}, "
                  f"batch/parquet {ratio(b.seconds, parquet_files.seconds):.2f}, "
                  f"streaming {PER_TRIGGER // 1000}k/trigger / batch {ratio(s.seconds, b.seconds):.2f} (micro-batches), "
                  f"{ratio(s.query_seconds, b.seconds):.2f} (whole query); "
                  f"streaming defaults / batch {ratio(d.seconds, b.seconds):.2f} (micro-batch), "
                  f"{ratio(d.query_seconds, b.seconds):.2f} (whole query; noop sink against the batch read's "
                  f"aggregation of every column: the 0.9 target is read against the {PER_TRIGGER // 1000}k/trigger "
                  f"stream)")
        if args.baseline:
            new, old = formats
            print(f"  tidemark/{old}: batch {ratio(batch[new].seconds, batch[old].seconds):.2f}, streaming "
                  f"{PER_TRIGGER // 1000}k/trigger {ratio(stream[new].seconds, stream[old].seconds):.2f} "
                  f"(micro-batches), {ratio(stream[new].query_seconds, stream[old].query_seconds):.2f} (whole query), "
                  f"streaming defaults {ratio(defaults[new].seconds, defaults[old].seconds):.2f} (micro-batch), "
                  f"{ratio(defaults[new].query_seconds, defaults[old].query_seconds):.2f} (whole query)")
        spark.stop()
        return 0
    finally:
        if broker is not None:
            broker.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
