"""The broker's own work per round of the latency workload, in one process, without gRPC.

    python -m bench.round_cost                          # this code: CPU us a round, medians of 5 runs
    python -m bench.round_cost --baseline-rev 16033a8   # and a copy of REV's broker/ and common/, interleaved
    python -m bench.round_cost --profile                # cProfile of one run, by own time

A round is what the broker does for one Produce request at 5,000 msg/s with natural batching (3 to 4
messages a request): an idempotent producer's batch of --records 1 KiB records appended through the
operations layer (`Operations.append`: the check, the idempotence journal, the commit log, the consume
queue, the metrics), and the frame it wakes on a fetch session serving the topic's 16 queues
(`FetchSession.next_frame`, `Operations.fetched`). Measured: the loop thread's CPU time
(`time.thread_time`) over --requests rounds, after 500 to warm up. What it leaves out is the transport:
gRPC's reads and writes, the request and answer messages, the servicer's tasks (docs/benchmarks.md
says how much of the broker's CPU each side is).

It runs in-process and reads thread CPU time, so a busy machine moves it less than the end-to-end
benchmarks; each run is a fresh child process, the variants' runs interleaved. Prints numbers; stops
only when a round is not what it says (a frame that does not carry the batch just appended).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.procs import REPO, child_env
from bench.spark_baseline import copy_package

QUEUES = 16
WARM_UP = 500


def _batch(records: int, first: int) -> bytes:
    from tidemark.common.protocol import tag_hash
    from tidemark.common.records import RecordBatchBuilder, encode_properties

    builder = RecordBatchBuilder("T")
    for i in range(records):
        builder.append(os.urandom(16) * 64, encode_properties({"UNIQ_KEY": f"7F000001{first + i:024X}"}),
                       tags_code=tag_hash(""))
    return bytes(builder.buffer)


async def _rounds(data_dir: Path, records: int, requests: int, profile: bool) -> float:
    from tidemark.broker.config import BrokerConfig
    from tidemark.broker.controller import BrokerController
    from tidemark.broker.delivery.fetch import OpenQueue
    from tidemark.broker.operations import BatchSequence

    broker = BrokerController(BrokerConfig(data_dir=data_dir, flush_interval_ms=3_600_000))
    broker.load()
    await broker.start()
    try:
        broker.topics.create("T", QUEUES)
        ops = broker.operations
        producer_id = ops.init_producer("", "T")
        batches = [_batch(records, i * records) for i in range(WARM_UP + requests)]
        session = ops.open_fetch()
        for q in range(QUEUES):
            session.open(OpenQueue(q + 1, "g", "T", q, 0, credit_messages=1 << 30, credit_bytes=1 << 40,
                                   batch_size=32))
        sequences = [0] * QUEUES

        async def one(i: int) -> None:
            q = i % QUEUES
            ops.append("T", q, batches[i], records, BatchSequence(producer_id, 0, sequences[q], True))
            sequences[q] += records
            frame = await session.next_frame()
            if [(part.queue_id, part.count) for part in frame.records] != [(q, records)]:
                raise SystemExit(f"round {i}: the frame carries {frame.records!r}, not the batch just appended")
            ops.fetched(frame)

        for i in range(WARM_UP):
            await one(i)
        profiler = None
        if profile:
            import cProfile
            profiler = cProfile.Profile()
            profiler.enable()
        started = time.thread_time()
        for i in range(WARM_UP, WARM_UP + requests):
            await one(i)
        spent = time.thread_time() - started
        if profiler is not None:
            import pstats
            profiler.disable()
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(45)
        ops.close_fetch(session)
        return spent / requests * 1e6
    finally:
        await broker.shutdown()


def child(records: int, requests: int, profile: bool) -> None:
    import uvloop

    with tempfile.TemporaryDirectory(prefix="round-cost-") as tmp:
        print(f"{uvloop.run(_rounds(Path(tmp), records, requests, profile)):.2f}", flush=True)


def run_once(pythonpath: Path | None, records: int, requests: int) -> float:
    env = child_env()
    if pythonpath is not None:
        env["PYTHONPATH"] = f"{pythonpath}{os.pathsep}{env.get('PYTHONPATH', '')}"
    out = subprocess.run([sys.executable, "-m", "bench.round_cost", "--child", "--records", str(records),
                          "--requests", str(requests)], capture_output=True, text=True, env=env, cwd=str(REPO),
                         timeout=600, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=4, help="records a request")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline-rev", default=None, help="also run a copy of REV's broker/ and common/")
    parser.add_argument("--profile", action="store_true", help="one run of this code under cProfile")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.child or a.profile:
        child(a.records, a.requests, a.profile)
        return 0
    variants: dict[str, Path | None] = {"this": None}
    with tempfile.TemporaryDirectory(prefix="round-cost-base-") as tmp:
        if a.baseline_rev:
            copy_package(Path(tmp) / "tidemark", a.baseline_rev, ("broker", "common"))
            variants[a.baseline_rev] = Path(tmp)
        results: dict[str, list[float]] = {name: [] for name in variants}
        for run in range(a.runs):
            order = list(variants) if run % 2 == 0 else list(reversed(variants))
            for name in order:
                results[name].append(run_once(variants[name], a.records, a.requests))
            print(f"run {run + 1}: " + ", ".join(f"{n} {results[n][-1]:.1f}" for n in variants), flush=True)
    print(f"CPU us a round ({a.records} records a request, medians of {a.runs} runs; load average "
          f"{os.getloadavg()[0]:.1f}):")
    for name, values in results.items():
        print(f"  {name}: {statistics.median(values):.1f} (runs {', '.join(f'{v:.1f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
