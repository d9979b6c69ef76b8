"""Many consume queues under `ulimit -n 1024`: broker start time, RSS and open fds.

    python -m bench.many_queues                         # 16,000 and 100,000 queues
    python -m bench.many_queues --queues 16000 --queues-per-topic 8

For each queue count, builds a data dir in-process through the store API
(topics of --queues-per-topic queues, one message per queue, a clean shutdown,
topics.json written to match), then starts `python -m tidemark.broker.app` on it with
RLIMIT_NOFILE set to --nofile (soft and hard) before exec, and measures:

  - start: process spawn to the broker_ready log line (the health service
    reports SERVING from then on), median of --runs starts;
  - RSS (VmRSS, /proc/<pid>/status) and open fds (/proc/<pid>/fd) once ready,
    and again after a send and a pull on --touch queues spread over the
    topics (which opens, and evicts, consume-queue files).

Prints numbers; asserts only that the broker started and served the sends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from bench.broker_bench import machine
from bench.procs import free_port, orphan_safe

# Sets the fd limit, then execs the broker: no Python runs between fork and exec in the caller.
_LIMITED = ("import os, resource, sys; n = int(sys.argv[1]); "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); os.execv(sys.argv[2], sys.argv[2:])")


def topic_name(i: int) -> str:
    return f"mq-{i:05d}"


def populate(data_dir: Path, *, topics: int, queues_per_topic: int) -> None:
    """A broker data dir holding `topics` topics of `queues_per_topic` queues, one message in each.

    Written in-process through the store API (no broker, no gRPC), then shut
    down cleanly, so a broker started on it recovers nothing and only loads.
    """
    from tidemark.broker.store import MessageRecord, MessageStore, StoreConfig

    async def fill() -> None:
        store = MessageStore(StoreConfig(data_dir))
        store.load()
        await store.start()
        try:
            for t in range(topics):
                name = topic_name(t)
                for q in range(queues_per_topic):
                    await store.put_messages([MessageRecord(name, q, f"{name}/{q}".encode())])
        finally:
            await store.shutdown()

    asyncio.run(fill())
    table = {topic_name(t): {"topicName": topic_name(t), "readQueueNums": queues_per_topic,
                             "writeQueueNums": queues_per_topic, "perm": 6} for t in range(topics)}
    config_dir = data_dir / "config"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / "topics.json").write_text(json.dumps({"topicConfigTable": table}, indent=4))


def limited_broker_command(data_dir: Path, port: int, nofile: int, *extra: str) -> list[str]:
    """`python -m tidemark.broker.app` with RLIMIT_NOFILE = nofile (soft and hard), set just before exec."""
    return orphan_safe([sys.executable, "-c", _LIMITED, str(nofile), sys.executable, "-m", "tidemark.broker.app",
                        "--data-dir", str(data_dir), "--port", str(port), *extra])


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def wait_ready(proc: subprocess.Popen, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if b"event=broker_ready" in log_path.read_bytes():
            return
        if proc.poll() is not None:
            raise SystemExit(f"broker exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.01)
    proc.kill()
    raise SystemExit(f"broker not ready after {timeout}s:\n{log_path.read_text()[-3000:]}")


def touch_queues(address: str, topics: int, queues_per_topic: int, n: int) -> None:
    """A send and a pull on n queues spread over the topics."""
    import grpc

    from tidemark.v1 import common_pb2, messaging_pb2, messaging_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = messaging_pb2_grpc.MessagingServiceStub(channel)
        for i in range(n):
            topic, queue_id = topic_name(i * topics // n), i % queues_per_topic
            sent = stub.SendMessage(messaging_pb2.SendMessageRequest(
                topic=topic, queue_id=queue_id, messages=[common_pb2.Message(body=b"touch")]), timeout=30)
            assert sent.results[0].queue_offset == 1, sent
            pulled = stub.PullMessage(messaging_pb2.PullMessageRequest(
                topic=topic, queue_id=queue_id, queue_offset=0, max_msg_nums=8), timeout=30)
            assert len(pulled.messages) == 2, pulled


def measure(data_dir: Path, args: argparse.Namespace, topics: int, *, touch: bool) -> dict:
    port = free_port()
    log_path = data_dir.parent / f"broker-{port}.log"
    began = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(limited_broker_command(data_dir, port, args.nofile), stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        wait_ready(proc, log_path, timeout=600)
        result = {"start_s": time.monotonic() - began, "rss_mb": rss_mb(proc.pid), "fds": open_fds(proc.pid)}
        if touch:
            touch_queues(f"127.0.0.1:{port}", topics, args.queues_per_topic, args.touch)
            result.update(rss_touched_mb=rss_mb(proc.pid), fds_touched=open_fds(proc.pid))
        return result
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queues", type=int, action="append", help="total queues (repeatable; default 16000 and 100000)")
    ap.add_argument("--queues-per-topic", type=int, default=8)
    ap.add_argument("--nofile", type=int, default=1024, help="RLIMIT_NOFILE of the broker (default 1024)")
    ap.add_argument("--runs", type=int, default=3, help="starts per queue count (default 3)")
    ap.add_argument("--touch", type=int, default=2000, help="queues sent to and pulled from after start")
    args = ap.parse_args()
    counts = args.queues or [16_000, 100_000]

    rows = []
    for total in counts:
        topics = total // args.queues_per_topic
        tmp = Path(tempfile.mkdtemp(prefix="tidemark-bench-"))
        try:
            began = time.monotonic()
            with mock.patch("os.fsync"):  # scratch data: 100,000 fsyncs would take minutes and prove nothing
                populate(tmp / "data", topics=topics, queues_per_topic=args.queues_per_topic)
            built = time.monotonic() - began
            # The first start recovers nothing new but warms the page cache like later ones.
            runs = [measure(tmp / "data", args, topics, touch=False) for _ in range(args.runs)]
            touched = measure(tmp / "data", args, topics, touch=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        rows.append((topics * args.queues_per_topic, topics, built, runs, touched))

    print(f"Tidemark broker start with many consume queues, ulimit -n {args.nofile}; {machine()}")
    print("| queues | topics | start, median of runs (s) | RSS ready (MB) | open fds ready | "
          f"after send+pull on {args.touch:,} queues: RSS (MB) / fds | data dir built in (s) |")
    print("|---|---|---|---|---|---|---|")
    for total, topics, built, runs, touched in rows:
        starts = [r["start_s"] for r in runs]
        print(f"| {total:,} | {topics:,} | {statistics.median(starts):.2f} "
              f"({', '.join(f'{s:.2f}' for s in starts)}) | {statistics.median(r['rss_mb'] for r in runs):.0f} | "
              f"{max(r['fds'] for r in runs)} | {touched['rss_touched_mb']:.0f} / {touched['fds_touched']} | "
              f"{built:.1f} |")


if __name__ == "__main__":
    main()
