"""Spark connector write throughput: df.write.format("tidemark") with idempotence on and off vs. JSON lines and Parquet.

    python -m bench.spark_write                      # starts a throwaway broker; 500,000 x 200 B, 4 partitions
    python -m bench.spark_write --brokers h:p --rows 200000 --rounds 5
    python -m bench.spark_baseline REV /tmp/base     # then, A/B against the connector's sink at REV:
    PYTHONPATH=/tmp/base python -m bench.spark_write --baseline tidemark_base=tidemark_base_source:Source
    python -m bench.spark_write --baseline-broker 8b4f4f0   # A/B against a broker whose append path is REV's

One local[2] SparkSession; the rows (a body of --size bytes and a key per row,
--partitions partitions) are built once and cached, so every writer reads the
same rows from memory. In each of --rounds rounds every writer runs once, in
turn (interleaved: the ratios stay steady on a busy machine where the rows/s
move with the load):
  1. tidemark, idempotent=true (the default: exactly once) into a fresh topic;
  2. tidemark, idempotent=false;
  3. JSON lines and 4. Parquet into a fresh directory.
Every writer runs once first as a warm-up. A tidemark write is checked by the
topic's message count; with the broker started here, its CPU (user + system)
per row written is printed too, and for every writer the CPU per row of the
Spark side: the JVM and the Python workers (every process under the JVM,
/proc stat; a worker reaped by its parent counts in the parent's children's
time), read once both have gone quiet after the write (pyspark's worker runs
a full gc.collect() after each task, after the write has returned). --baseline-broker REV starts a second broker
whose append path (common/records.py, broker/store, broker/ingest,
broker/producers, broker/memory.py) is REV's (bench.append_cost.build_baseline) and adds the
same two tidemark writers against it to the rounds. Prints numbers; asserts
nothing.
"""

from __future__ import annotations

import argparse
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

from bench.spark_read import ratio, register_baseline, spark_session, start_broker
from tidemark.client import Admin

QUEUES = 4


@dataclass
class Writer:
    label: str
    run: Callable[[], float]
    seconds: list[float] = field(default_factory=list)
    broker_cpu_us: list[float] = field(default_factory=list)  # per row written, when the broker is ours
    jvm_cpu_us: list[float] = field(default_factory=list)  # per row written
    workers_cpu_us: list[float] = field(default_factory=list)  # the Python workers', per row written


_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, str, float, float]:
    """(parent pid, command name, own CPU seconds, reaped children's CPU seconds) of a process."""
    text = Path(f"/proc/{pid}/stat").read_text()
    name, rest = text[text.index("(") + 1:text.rindex(")")], text.rsplit(")", 1)[1].split()
    return int(rest[1]), name, (int(rest[11]) + int(rest[12])) / _TICK, (int(rest[13]) + int(rest[14])) / _TICK


def spark_cpu(jvm_pid: int) -> tuple[float, float]:
    """(the JVM's CPU seconds, its Python workers' CPU seconds) so far: the workers are every process under
    the JVM, with the time of their reaped children (a worker that exited counts in its parent's)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stats[int(entry)] = _stat(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_rest) in stats.items():
        children.setdefault(ppid, []).append(pid)
    jvm = stats[jvm_pid][2] + 0.0
    workers, todo = 0.0, list(children.get(jvm_pid, ()))
    while todo:
        pid = todo.pop()
        _, _, own, reaped = stats[pid]
        workers += own + reaped
        todo.extend(children.get(pid, ()))
    return jvm, workers


def jvm_pid(spark) -> int:
    """The SparkSession's JVM: the java process among this process's children."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid, name, _, _ = _stat(int(entry))
            except (OSError, IndexError, ValueError):
                continue
            if ppid == os.getpid() and name == "java":
                return int(entry)
    raise SystemExit("no JVM among this process's children")


def quiet_cpu(jvm: int, settle_s: float = 0.1, limit_s: float = 3.0) -> tuple[float, float]:
    """spark_cpu once the Python workers have stopped using CPU (two readings settle_s apart within a clock
    tick of each other), or after limit_s."""
    last, deadline = spark_cpu(jvm), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(settle_s)
        now = spark_cpu(jvm)
        if now[1] - last[1] <= 1.5 / _TICK:
            return now
        last = now
    return last


def rate(rows: int, seconds: list[float]) -> float:
    return rows / statistics.median(seconds)


def rows_frame(spark, rows: int, size: int, partitions: int):
    """`rows` rows of (body: `size` bytes, keys), in `partitions` partitions, cached."""
    from pyspark.sql import functions as F

    df = (spark.range(0, rows, 1, partitions)
          .select(F.expr(f"cast(concat(lpad(cast(id as string), 12, '0'), repeat('x', {max(0, size - 12)})) "
                         f"as binary)").alias("body"),
                  F.concat(F.lit("k"), F.col("id").cast("string")).alias("keys"))
          .cache())
    df.count()
    return df


def tidemark_writer(label: str, df, fmt: str, brokers: str, rows: int, idempotent: bool,
                    broker_cpu: Callable[[], float] | None = None) -> Writer:
    """broker_cpu: the broker process's CPU seconds so far (our own broker), for its CPU per row."""
    topics = itertools.count()

    def run() -> float:
        topic = f"spark-write-{os.getpid()}-{'idem' if idempotent else 'plain'}-{fmt}-{next(topics)}"
        with Admin(brokers=brokers) as admin:
            admin.create_topic(topic, QUEUES)
        cpu = broker_cpu() if broker_cpu else 0.0
        start = time.perf_counter()
        (df.write.format(fmt).option("brokers", brokers).option("topic", topic)
         .option("idempotent", str(idempotent).lower()).mode("append").save())
        elapsed = time.perf_counter() - start
        if broker_cpu:
            writer.broker_cpu_us.append((broker_cpu() - cpu) / rows * 1e6)
        with Admin(brokers=brokers) as admin:
            got = sum(high - low for low, high in admin.offsets(admin.fetch_message_queues(topic)).values())
            admin.delete_topic(topic)
        if got != rows:
            raise SystemExit(f"{label}: the topic holds {got} messages, expected {rows}")
        return elapsed

    writer = Writer(label, run)
    return writer


def file_writer(label: str, df, kind: str, scratch: Path) -> Writer:
    runs = itertools.count()

    def run() -> float:
        path = scratch / f"{kind}-{next(runs)}"
        start = time.perf_counter()
        getattr(df.write.mode("overwrite"), kind)(str(path))
        elapsed = time.perf_counter() - start
        shutil.rmtree(path, ignore_errors=True)
        return elapsed

    return Writer(label, run)


def writers(spark, df, brokers: str, rows: int, scratch: Path, formats: list[str],
            broker_cpu: Callable[[], float] | None = None) -> dict[str, Writer]:
    out = {}
    for fmt in formats:
        for idempotent in (True, False):
            label = f"{fmt} idempotent={str(idempotent).lower()}"
            out[label] = tidemark_writer(label, df, fmt, brokers, rows, idempotent, broker_cpu)
    out["json lines"] = file_writer("json lines", df, "json", scratch)
    out["parquet"] = file_writer("parquet", df, "parquet", scratch)
    return out


def run_rounds(all_writers: dict[str, Writer], rounds: int, rows: int, jvm: int, out=print) -> None:
    for writer in all_writers.values():
        writer.run()  # warm-up: Python workers, the JVM's code, the broker's first segment
    for writer in all_writers.values():
        writer.broker_cpu_us.clear()
    for r in range(rounds):
        cpu = quiet_cpu(jvm)
        for writer in all_writers.values():
            writer.seconds.append(writer.run())
            after = quiet_cpu(jvm)
            writer.jvm_cpu_us.append((after[0] - cpu[0]) / rows * 1e6)
            writer.workers_cpu_us.append((after[1] - cpu[1]) / rows * 1e6)
            cpu = after
        out(f"  round {r + 1}: " + ", ".join(f"{w.label} {w.seconds[-1]:.2f}s" for w in all_writers.values()))


def summary(all_writers: dict[str, Writer], rows: int, formats: list[str]) -> list[str]:
    lines = [f"{'writer':<34} {'rows/s':>12}   (median of {len(next(iter(all_writers.values())).seconds)})"]
    for w in all_writers.values():
        cpu = f"   broker CPU {statistics.median(w.broker_cpu_us):.2f} us/row" if w.broker_cpu_us else ""
        spark = (f"   JVM {statistics.median(w.jvm_cpu_us):.2f}, Python workers "
                 f"{statistics.median(w.workers_cpu_us):.2f} us/row" if w.jvm_cpu_us else "")
        lines.append(f"{w.label:<34} {rate(rows, w.seconds):>12,.0f}{spark}{cpu}")
    json_s = all_writers["json lines"].seconds
    parquet_s = all_writers["parquet"].seconds
    lines.append("ratios (median of the rounds' ratios):")
    for fmt in formats:
        on, off = all_writers[f"{fmt} idempotent=true"].seconds, all_writers[f"{fmt} idempotent=false"].seconds
        lines.append(f"  {fmt}: idempotent/json {ratio(on, json_s):.2f}, idempotent/parquet {ratio(on, parquet_s):.2f}, "
                     f"idempotent/not idempotent {ratio(on, off):.2f}, not idempotent/json {ratio(off, json_s):.2f}")
    if len(formats) == 2:
        new, old = formats
        for idem in ("true", "false"):
            lines.append(f"  {new}/{old} idempotent={idem}: "
                         f"{ratio(all_writers[f'{new} idempotent={idem}'].seconds, all_writers[f'{old} idempotent={idem}'].seconds):.2f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--brokers", default=None, help="use these brokers (default: start one)")
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", default=None, metavar="NAME=module:Class",
                        help="also write through this data source class, registered as format NAME")
    parser.add_argument("--baseline-broker", default=None, metavar="REV",
                        help="also write to a broker whose append path is REV's")
    args = parser.parse_args(argv)

    scratch = Path(tempfile.mkdtemp(prefix="tidemark-spark-write-"))
    broker = base_broker = None
    try:
        brokers = args.brokers
        if brokers is None:
            broker, brokers = start_broker(scratch)
        if args.baseline_broker:
            from bench import append_cost

            base = append_cost.build_baseline(args.baseline_broker, scratch / "base")
            base_broker, base_brokers = append_cost.start_broker("base", scratch, base)
        from tidemark import spark_connector

        spark = spark_session()
        spark_connector.register(spark)
        formats = ["tidemark"]
        if args.baseline:
            formats.append(register_baseline(spark, args.baseline))
        df = rows_frame(spark, args.rows, args.size, args.partitions)
        all_writers = writers(spark, df, brokers, args.rows, scratch, formats,
                              broker.cpu_seconds if broker is not None else None)
        if base_broker is not None:
            for idempotent in (True, False):
                label = f"tidemark idempotent={str(idempotent).lower()}, broker {args.baseline_broker}"
                all_writers[label] = tidemark_writer(label, df, "tidemark", base_brokers, args.rows, idempotent,
                                                     base_broker.cpu_seconds)
        print(f"Spark {spark.version}, local[2]; {args.rows:,} rows x {args.size} B in {args.partitions} partitions "
              f"(cached), {QUEUES} queues; {args.rounds} rounds, writers in turn", flush=True)
        run_rounds(all_writers, args.rounds, args.rows, jvm_pid(spark), out=lambda line: print(line, flush=True))
        print()
        print("\n".join(summary(all_writers, args.rows, formats)))
        if base_broker is not None:
            for idem in ("true", "false"):
                this, before = (all_writers[f"tidemark idempotent={idem}"].seconds,
                                all_writers[f"tidemark idempotent={idem}, broker {args.baseline_broker}"].seconds)
                print(f"  this broker / broker {args.baseline_broker}, idempotent={idem}: {ratio(this, before):.2f}")
        spark.stop()
        return 0
    finally:
        for server in (broker, base_broker):
            if server is not None:
                server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
