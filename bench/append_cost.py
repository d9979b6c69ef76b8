"""The broker's CPU per row written by the Spark sink, without Spark: A/B against a baseline broker.

    python -m bench.append_cost                            # this code's broker; 500,000 x 200 B rows
    python -m bench.append_cost --baseline-rev 8b4f4f0     # and a broker of REV's store, interleaved
    python -m bench.append_cost --workload produce --baseline-rev 8b4f4f0 --rounds 5

The rows are those of bench.spark_write (a body of --size bytes and a key each), in Arrow record
batches of 10,000 rows; each run writes them all through the sink's own task code
(spark_connector.sink.produce: records encoded column by column, sent with
Producer.send_encoded_async, up to 16 batches in flight) from --tasks processes at once, each its
share of the rows, into a fresh topic of 4 queues. Measured per run: the broker's CPU (user +
system, /proc/PID/stat) per row written, and rows/s. In each of --rounds rounds every broker runs
with idempotence on and off, the brokers' order alternating from round to round; medians are
printed.

--request-rows 512,2048,4096 runs the sink's tasks with that many rows a request (the sink's
MAX_BATCH_MESSAGES; its byte limit raised to what one request may hold, 4 MiB - 64 KiB), each in turn
against every broker, in an order alternating from round to round like the brokers'.

--baseline-rev REV builds a copy of the broker (tidemark package) in which the files that decide a
produce batch's append path (common/records.py, broker/store/, broker/ingest/, broker/producers/,
and broker/memory.py, the allocator's settings) are as they were at REV and everything else is this
checkout's, and runs it beside this code's broker. Prints numbers (the broker's minor page faults a
row too); asserts nothing.

--stages times the store's stages in this process instead (CPU ns a row of a 512-record sink batch:
the check, stamping, sealing, consume-queue entries, MessageStore.append_records whole; best of 9),
and with --baseline-rev under a copy of REV's append path too.

--workload produce measures `python -m bench`'s produce workload the same way: one process sends
--rows (200,000) messages of 1 KiB with Producer.send_async each (default batching, idempotent) into 8
queues; --workload send, 5,000 of them one Producer.send at a time (batches of one record).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from bench.procs import REPO, Server, child_env, free_port
from bench.spark_baseline import copy_package

QUEUES = 4
BATCH_ROWS = 10_000
APPEND_PATH = ("common/records.py", "broker/store", "broker/ingest", "broker/producers", "broker/memory.py")


def build_baseline(rev: str, out: Path) -> Path:
    """OUT/tidemark: the installed package with the append path's files as they were at REV."""
    copy_package(out / "tidemark", rev, APPEND_PATH)
    return out


def start_broker(name: str, scratch: Path, pythonpath: Path | None) -> tuple[Server, str]:
    port = free_port()
    env = child_env()
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join((str(pythonpath), env["PYTHONPATH"]))
    server = Server(name, [sys.executable, "-m", "tidemark.broker.app", "--data-dir", str(scratch / name),
                           "--port", str(port)], scratch / f"{name}.log")
    with open(server.log_path, "ab") as log:
        from bench.procs import orphan_safe

        server.proc = subprocess.Popen(orphan_safe(server.command), stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=env, cwd=str(REPO))
    server.wait_log(r"event=broker_ready")
    return server, f"127.0.0.1:{port}"


def _batches(first: int, rows: int, size: int):
    import pyarrow as pa

    out = []
    for start in range(first, first + rows, BATCH_ROWS):
        ids = range(start, min(start + BATCH_ROWS, first + rows))
        body = pa.array([f"{i:012d}".encode() + b"x" * max(0, size - 12) for i in ids], pa.binary())
        keys = pa.array([f"k{i}" for i in ids], pa.string())
        out.append(pa.RecordBatch.from_arrays([body, keys], names=["body", "keys"]))
    return out


_SINK_DEFAULTS: dict[str, int] = {}


def set_request_rows(rows: int | None) -> None:
    """The sink's rows a request (MAX_BATCH_MESSAGES) in this process: `rows`, or the sink's own (None). Its
    byte limit grows with it, up to what one request may hold (the producer's max_message_size)."""
    from tidemark.spark_connector import sink

    if not _SINK_DEFAULTS:
        _SINK_DEFAULTS.update(MAX_BATCH_MESSAGES=sink.MAX_BATCH_MESSAGES, MAX_BATCH_BYTES=sink.MAX_BATCH_BYTES)
    sink.MAX_BATCH_MESSAGES = rows or _SINK_DEFAULTS["MAX_BATCH_MESSAGES"]
    sink.MAX_BATCH_BYTES = (_SINK_DEFAULTS["MAX_BATCH_BYTES"] if rows is None
                            else max(_SINK_DEFAULTS["MAX_BATCH_BYTES"], (4 << 20) - (64 << 10)))


def task(brokers: str, topic: str, idempotent: bool, first: int, rows: int, size: int,
         request_rows: int | None = None) -> int:
    """One sink task (a child process): its share of the rows written through spark_connector.sink."""
    from tidemark.spark_connector.options import parse_write_options
    from tidemark.spark_connector.sink import produce

    set_request_rows(request_rows)
    batches = _batches(first, rows, size)
    options = parse_write_options({"brokers": brokers, "topic": topic, "idempotent": str(idempotent).lower()})
    return produce(options, iter(batches))


def produce_task(brokers: str, topic: str, idempotent: bool, first: int, rows: int, size: int) -> int:
    """bench's produce workload (a child process): Producer.send_async per 1 KiB message, all answered."""
    import threading

    from bench.workloads import payload
    from tidemark.client import Message, Producer

    answered, done, lock = [0, 0], threading.Event(), threading.Lock()

    def ack(result, error) -> None:
        with lock:
            answered[error is not None] += 1
            if sum(answered) == rows:
                done.set()

    with Producer(brokers=brokers, enable_idempotence=idempotent) as producer:
        producer.fetch_publish_message_queues(topic)
        for i in range(first, first + rows):
            producer.send_async(Message(topic, payload(i)), ack)
        done.wait(300)
    return answered[0]


def send_task(brokers: str, topic: str, idempotent: bool, first: int, rows: int, size: int) -> int:
    """One Producer.send at a time (a child process): batches of one record, the per-record path."""
    from bench.workloads import payload
    from tidemark.client import Message, Producer

    with Producer(brokers=brokers, enable_idempotence=idempotent) as producer:
        for i in range(first, first + rows):
            producer.send(Message(topic, payload(i)))
    return rows


def minor_faults(server: Server) -> int:
    """The broker's minor page faults so far (/proc/PID/stat): a request buffer served from fresh mmap pages
    faults once a page."""
    try:
        return int(Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[7])
    except (OSError, AttributeError):
        return 0


def run_once(pool: ProcessPoolExecutor, server: Server, brokers: str, topic: str, idempotent: bool, rows: int,
             size: int, tasks: int, workload: str = "sink", request_rows: int | None = None) -> tuple[float, float]:
    """(broker CPU us per row, rows/s) of one write."""
    from tidemark.client import Admin

    with Admin(brokers=brokers) as admin:
        admin.create_topic(topic, QUEUES if workload == "sink" else 8)
    share = rows // tasks
    cpu0, faults0, t0 = server.cpu_seconds(), minor_faults(server), time.perf_counter()
    fn = {"sink": task, "produce": produce_task, "send": send_task}[workload]
    extra = (request_rows,) if workload == "sink" else ()
    futures = [pool.submit(fn, brokers, topic, idempotent, i * share, share, size, *extra) for i in range(tasks)]
    sent = sum(f.result() for f in futures)
    elapsed, cpu = time.perf_counter() - t0, server.cpu_seconds() - cpu0
    faults = minor_faults(server) - faults0
    with Admin(brokers=brokers) as admin:
        got = sum(high - low for low, high in admin.offsets(admin.fetch_message_queues(topic)).values())
        admin.delete_topic(topic)
    if got != share * tasks or sent != got:
        raise SystemExit(f"{topic}: the topic holds {got} messages, {sent} sent, expected {share * tasks}")
    return cpu / got * 1e6, got / elapsed, faults / got


def stages(count: int = 512) -> dict[str, float]:
    """CPU ns a row of the append path's stages, for one sink batch of `count` records (thread CPU time, best
    of 9 runs): the per-record functions, and the bulk ones where this code has them."""
    import asyncio
    import zlib

    from tidemark.broker.store import MessageStore, StoreConfig, codec
    from tidemark.common import records
    from tidemark.spark_connector.encode import RecordEncoder, record_bytes

    topic, limits = "spark-write-topic", dict(max_message_size=4 << 20, max_record_size=1 << 30)
    encoded, offsets = RecordEncoder(topic, "10.0.0.1", 4 << 20).encode(_batches(0, count, 200)[0], 0)
    data = record_bytes(encoded, offsets, 0, count)

    def best(f, n: int = 40) -> float:
        f()
        runs = []
        for _ in range(9):
            t0 = time.thread_time()
            for _ in range(n):
                f()
            runs.append((time.thread_time() - t0) / n / count * 1e9)
        return min(runs)

    out = {"check, record by record (records.check_batch)": best(
        lambda: records.check_batch(data, count, topic=topic, **limits))}
    checked = records.check_batch(data, count, topic=topic, **limits)
    buf = bytearray(data)
    view = memoryview(buf)

    def stamp_each() -> None:
        for i, start in enumerate(checked.starts):
            records.I32.pack_into(buf, start + records.QUEUE_ID_OFFSET, 1)
            records.I64.pack_into(buf, start + records.QUEUE_OFFSET_OFFSET, i)
            records.I64.pack_into(buf, start + records.STORE_TS_OFFSET, 5)

    out["stamp, record by record"] = best(stamp_each)
    out["seal (physical offset, CRC), record by record"] = best(
        lambda: [codec.seal(buf, view, s, n, 1000 + s) for s, n in zip(checked.starts, checked.sizes, strict=True)])
    pack = codec.CQ_ENTRY.pack
    out["consume-queue entries, record by record"] = best(lambda: b"".join(
        [pack(p, s, t) for p, s, t in zip(checked.starts, checked.sizes, checked.tags_codes, strict=True)]))
    try:
        from tidemark.broker.store import batches
    except ImportError:
        batches = None
    if batches is not None:
        bulk = batches.check_batch(data, count, topic=topic, **limits)
        positions = bulk.starts + 1000
        slices = [view[s + 12:s + n] for s, n in zip(checked.starts, checked.sizes, strict=True)]
        out["check, bulk (batches.check_batch)"] = best(lambda: batches.check_batch(data, count, topic=topic, **limits))
        out["  of which the size walk"] = best(lambda: batches._walk(data, count))
        out["stamp, bulk"] = best(lambda: batches.stamp(buf, bulk, 1, 0, 5))
        out["seal, bulk"] = best(lambda: batches.seal_all(buf, bulk.starts, bulk.sizes, positions))
        out["  of which the zlib.crc32 calls"] = best(lambda: [zlib.crc32(x) for x in slices])
        out["consume-queue entries, bulk"] = best(lambda: codec.queue_entries(positions, bulk.sizes, bulk.tags_codes))

    async def whole() -> None:
        store = MessageStore(StoreConfig(Path(tempfile.mkdtemp(prefix="tidemark-stages-")),
                                         commitlog_segment_size=1 << 30))
        store.load()
        await store.start()
        try:
            out["MessageStore.append_records, whole"] = best(lambda: store.append_records(topic, 0, data, count), 20)
        finally:
            await store.shutdown()
            shutil.rmtree(store._config.data_dir, ignore_errors=True)

    asyncio.run(whole())
    return out


def print_stages(rev: str | None) -> None:
    import tidemark

    print(f"CPU ns a row, 512-record sink batch, best of 9 ({Path(tidemark.__path__[0]).parent}):")
    for name, ns in stages().items():
        print(f"  {name:<50} {ns:7,.0f}")
    if rev:
        scratch = Path(tempfile.mkdtemp(prefix="tidemark-stages-base-"))
        try:
            env = child_env()
            env["PYTHONPATH"] = os.pathsep.join((str(build_baseline(rev, scratch)), env["PYTHONPATH"]))
            print(f"at {rev}:", flush=True)
            subprocess.run([sys.executable, "-m", "bench.append_cost", "--stages"], env=env, cwd=REPO, check=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=2, help="sink tasks (processes) writing at once")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-rev", default=None, help="also run a broker whose append path is REV's")
    parser.add_argument("--only", choices=("idempotent", "plain"), default=None)
    parser.add_argument("--workload", choices=("sink", "produce", "send"), default="sink")
    parser.add_argument("--request-rows", default=None, metavar="N,M,...",
                        help="the sink's rows a request: run each of these against every broker, interleaved")
    parser.add_argument("--stages", action="store_true", help="time the store's stages in-process instead")
    args = parser.parse_args(argv)
    if args.stages:
        print_stages(args.baseline_rev)
        return 0
    if args.workload != "sink":
        args.tasks, args.only = 1, args.only or "idempotent"
        if args.rows == parser.get_default("rows"):
            args.rows = 200_000 if args.workload == "produce" else 5_000
    scratch = Path(tempfile.mkdtemp(prefix="tidemark-append-cost-"))
    brokers: list[tuple[str, Server, str]] = []
    try:
        server, address = start_broker("this", scratch, None)
        brokers.append(("this", server, address))
        if args.baseline_rev:
            base = build_baseline(args.baseline_rev, scratch / "base")
            server, address = start_broker("base", scratch, base)
            brokers.append((f"base {args.baseline_rev}", server, address))
        modes = [m for m in (True, False) if args.only is None or m == (args.only == "idempotent")]
        sizes = [int(n) for n in args.request_rows.split(",")] if args.request_rows else [None]
        results: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
        with ProcessPoolExecutor(args.tasks, mp_context=get_context("spawn")) as pool:
            for _, server, address in brokers:  # warm-up: imports, first connections
                run_once(pool, server, address, f"warm-{os.getpid()}", True, min(BATCH_ROWS * args.tasks, args.rows), args.size,
                         args.tasks, args.workload)
            for r in range(args.rounds):
                order = brokers if r % 2 == 0 else brokers[::-1]
                for idempotent, request_rows in [(m, n) for m in modes for n in (sizes if r % 2 == 0 else sizes[::-1])]:
                    for name, server, address in order:
                        label = name if request_rows is None else f"{name} {request_rows}/req"
                        topic = f"append-{os.getpid()}-{r}-{'idem' if idempotent else 'plain'}-{request_rows}"
                        cpu, rate, faults = run_once(pool, server, address, topic, idempotent, args.rows, args.size,
                                             args.tasks, args.workload, request_rows)
                        results.setdefault((label, idempotent), []).append((cpu, rate, faults))
                        print(f"round {r + 1} {label:>22} idempotent={str(idempotent).lower():5} "
                              f"broker CPU {cpu:6.2f} us/row  {rate:10,.0f} rows/s  {faults:5.2f} faults/row  load {os.getloadavg()[0]:.1f}",
                              flush=True)
        what = {"produce": "messages of 1 KiB, send_async", "send": "messages of 1 KiB, one send at a time"}.get(
            args.workload, f"rows of {args.size} B, {args.tasks} sink tasks")
        print(f"\nmedians of {args.rounds} rounds, {args.rows:,} {what}:")
        for (label, idempotent), runs in results.items():
            print(f"{label:>22} idempotent={str(idempotent).lower():5} broker CPU "
                  f"{statistics.median(c for c, _, _ in runs):6.2f} us/row  "
                  f"{statistics.median(r for _, r, _ in runs):10,.0f} rows/s  "
                  f"{statistics.median(f for _, _, f in runs):5.2f} faults/row")
    finally:
        for _, server, _ in brokers:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
