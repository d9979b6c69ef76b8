"""The broker's CPU per row served to a large read, without Spark: A/B against a baseline broker.

    python -m bench.read_cost                            # this code's broker; 1,000,000 x 200 B rows
    python -m bench.read_cost --baseline-rev 6e31ef8     # and a broker of REV's read path, interleaved

Each broker gets the same rows (bench.spark_read's: a 200-byte body and a key each, on 4 queues), then
this process reads every queue from its first offset to its last with the Spark source's own reader
(spark_connector.fetch.fetch_ranges: one fetch stream, the next range opened while the current one
drains), the brokers in turn, --rounds times, the order alternating. Measured per read: the broker's CPU
(user + system, /proc/PID/stat) per row served, this process's CPU per row, and rows/s.

--baseline-rev REV builds a copy of the broker (tidemark package) in which the files of the read path
(broker/memory.py, broker/store/, broker/delivery/fetch.py) are as they were at REV and
everything else is this checkout's, and runs it beside this code's broker. Prints numbers; asserts
nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.append_cost import start_broker
from bench.procs import Server
from bench.spark_baseline import copy_package
from bench.spark_read import produce

READ_PATH = ("broker/memory.py", "broker/store", "broker/delivery/fetch.py")
QUEUES = 4


def read_all(server: Server, brokers: str, topic: str) -> tuple[int, float, float, float]:
    """Rows read, the broker's and this process's CPU seconds, and the wall seconds of one whole read."""
    from tidemark.client import Admin
    from tidemark.spark_connector.fetch import FetchSettings, fetch_ranges
    from tidemark.spark_connector.offsets import OffsetRange

    with Admin(brokers=brokers) as admin:
        ranges = [OffsetRange(mq, admin.min_offset(mq), admin.max_offset(mq))
                  for mq in admin.fetch_message_queues(topic)]
    settings = FetchSettings(brokers=brokers, fail_on_data_loss=True, poll_timeout_s=5.0)
    broker_cpu, own_cpu, wall = server.cpu_seconds(), time.process_time(), time.perf_counter()
    rows = sum(batch.num_rows for batch in fetch_ranges(settings, ranges))
    return (rows, server.cpu_seconds() - broker_cpu, time.process_time() - own_cpu,
            time.perf_counter() - wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--baseline-rev", default=None, help="also run a broker whose read path is REV's")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="tidemark-read-cost-"))
    brokers: list[tuple[str, Server, str]] = []
    topic = f"read-{os.getpid()}"
    try:
        server, address = start_broker("this", scratch, None)
        brokers.append(("this", server, address))
        if args.baseline_rev:
            copy_package(scratch / "base" / "tidemark", args.baseline_rev, READ_PATH)
            server, address = start_broker("base", scratch, scratch / "base")
            brokers.append((f"base {args.baseline_rev}", server, address))
        for _, _, address in brokers:
            produce(address, topic, QUEUES, args.rows, args.size)
        for _, server, address in brokers:  # warm-up: the store's files in the page cache, first connections
            read_all(server, address, topic)
        results: dict[str, list[tuple[float, float, float]]] = {}
        for r in range(args.rounds):
            for label, server, address in brokers if r % 2 == 0 else brokers[::-1]:
                rows, broker_cpu, own_cpu, wall = read_all(server, address, topic)
                runs = results.setdefault(label, [])
                runs.append((broker_cpu / rows * 1e6, own_cpu / rows * 1e6, rows / wall))
                print(f"round {r + 1} {label:>14} broker CPU {runs[-1][0]:5.2f} us/row  reader CPU "
                      f"{runs[-1][1]:5.2f} us/row  {runs[-1][2]:10,.0f} rows/s  load {os.getloadavg()[0]:.1f}",
                      flush=True)
        print(f"\nmedians of {args.rounds} reads of {args.rows:,} rows of {args.size} B on {QUEUES} queues:")
        for label, runs in results.items():
            print(f"{label:>14} broker CPU {statistics.median(b for b, _, _ in runs):5.2f} us/row  reader CPU "
                  f"{statistics.median(o for _, o, _ in runs):5.2f} us/row  "
                  f"{statistics.median(w for _, _, w in runs):10,.0f} rows/s")
    finally:
        for _, server, _ in brokers:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
