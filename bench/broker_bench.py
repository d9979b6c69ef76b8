"""Broker send and pull throughput: 1 KiB messages, async flush, one producer and one reader process.

    python -m bench.broker_bench                      # starts a throwaway broker in a temp dir
    python -m bench.broker_bench --single 5000 --batched 50000 --queues 8

Phases, each timed in its own child process after its client is connected
(interpreter start, imports and route lookup are never timed):
  1. producer: --single sends of one message each (Producer.send, synchronous),
  2. producer: --batched messages in batches of --batch (Producer.send_batch),
  3. producer: the same single sends over the raw gRPC stub, without the client library,
  4. reader: every stored message pulled group-less from offset 0 of every queue
     (Admin.pull), once with max_nums 32 (RocketMQ's pull batch) and once with 256.
Queues are used round-robin. Prints a table; asserts only that every message was read.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.procs import REPO, Server, child_env, free_port, orphan_safe

TOPIC = "bench"


def start_broker(data_dir: Path, *extra: str) -> tuple[Server, str]:
    """A broker child on a free port; returns it and its address once it logged broker_ready."""
    port = free_port()
    server = Server("broker", [sys.executable, "-m", "tidemark.broker.app", "--data-dir", str(data_dir), "--port", str(port),
                               *extra], data_dir.parent / "broker.log")
    server.start().wait_log(r"event=broker_ready|\"event\": \"broker_ready\"", timeout=60)
    return server, f"127.0.0.1:{port}"


def run_role(role: str, args: argparse.Namespace, brokers: str) -> dict:
    cmd = [sys.executable, "-m", "bench.broker_bench", "--role", role, "--brokers", brokers,
           "--single", str(args.single), "--batched", str(args.batched), "--batch", str(args.batch),
           "--size", str(args.size), "--queues", str(args.queues)]
    proc = subprocess.run(orphan_safe(cmd), capture_output=True, text=True, env=child_env(), cwd=str(REPO),
                          timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{role} failed with exit {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _body(size: int) -> bytes:
    return (os.urandom(size // 2 + 1).hex()[:size]).encode("ascii")


def producer(args: argparse.Namespace) -> dict:
    import grpc

    from tidemark.client import Message, Producer
    from tidemark.v1 import common_pb2, messaging_pb2, messaging_pb2_grpc

    body = _body(args.size)
    out: dict = {}
    with Producer(brokers=args.brokers) as p:
        mqs = p.fetch_publish_message_queues(TOPIC)
        for i in range(100):  # warm-up: channel, stubs, first allocations (messages not counted below)
            p.send(Message(TOPIC, body), queue=mqs[i % len(mqs)])
        start = time.perf_counter()
        for i in range(args.single):
            p.send(Message(TOPIC, body), queue=mqs[i % len(mqs)])
        out["single"] = time.perf_counter() - start
        start = time.perf_counter()
        sent = 0
        while sent < args.batched:
            n = min(args.batch, args.batched - sent)
            p.send_batch([Message(TOPIC, body) for _ in range(n)], queue=mqs[(sent // args.batch) % len(mqs)])
            sent += n
        out["batched"] = time.perf_counter() - start
    with grpc.insecure_channel(args.brokers) as channel:
        stub = messaging_pb2_grpc.MessagingServiceStub(channel)
        requests = [messaging_pb2.SendMessageRequest(topic=TOPIC, queue_id=q, messages=[common_pb2.Message(body=body)])
                    for q in range(args.queues)]
        stub.SendMessage(requests[0], timeout=10)
        start = time.perf_counter()
        for i in range(args.single):
            stub.SendMessage(requests[i % args.queues], timeout=10)
        out["raw_single"] = time.perf_counter() - start
    return out


def reader(args: argparse.Namespace) -> dict:
    from tidemark.client import Admin

    out: dict = {}
    with Admin(brokers=args.brokers) as admin:
        mqs = admin.fetch_message_queues(TOPIC)
        ends = {mq: high for mq, (_, high) in admin.offsets(mqs).items()}
        for max_nums in (32, 256):
            count = pulls = 0
            start = time.perf_counter()
            for mq in mqs:
                offset = 0
                while offset < ends[mq]:
                    result = admin.pull(mq, offset, max_nums=max_nums)
                    count += len(result.messages)
                    offset = result.next_begin_offset
                    pulls += 1
            out[f"pull_{max_nums}"] = time.perf_counter() - start
            out[f"pull_{max_nums}_count"] = count
            out[f"pull_{max_nums}_calls"] = pulls
    return out


def machine() -> str:
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
            f"{platform.system()}; load average {load} at the end")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--single", type=int, default=10_000, help="single-message sends (default 10000)")
    ap.add_argument("--batched", type=int, default=200_000, help="messages sent in batches (default 200000)")
    ap.add_argument("--batch", type=int, default=32, help="messages per batch (default 32)")
    ap.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    ap.add_argument("--queues", type=int, default=4, help="queues of the topic (default 4)")
    ap.add_argument("--brokers", default=None, help="use a running broker instead of starting one")
    ap.add_argument("--role", choices=["producer", "reader"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        print(json.dumps(producer(args) if args.role == "producer" else reader(args)))
        return

    tmp = Path(tempfile.mkdtemp(prefix="tidemark-bench-"))
    server = None
    try:
        if args.brokers is None:
            server, args.brokers = start_broker(tmp / "data", "--flush", "async")
        from tidemark.client import Admin
        with Admin(brokers=args.brokers) as admin:
            admin.create_topic(TOPIC, args.queues)
        prod = run_role("producer", args, args.brokers)
        read = run_role("reader", args, args.brokers)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    stored = 101 + 2 * args.single + args.batched  # warm-up sends included
    mib = args.size / (1024 * 1024)
    rows = [
        ("send, 1 message per call (Producer.send)", args.single, prod["single"]),
        (f"send, batches of {args.batch} (Producer.send_batch)", args.batched, prod["batched"]),
        ("send, 1 message per call (raw gRPC stub)", args.single, prod["raw_single"]),
        ("pull, max 32 per call (Admin.pull)", read["pull_32_count"], read["pull_32"]),
        ("pull, max 256 per call (Admin.pull)", read["pull_256_count"], read["pull_256"]),
    ]
    for n in ("pull_32_count", "pull_256_count"):
        if read[n] != stored:
            raise SystemExit(f"reader saw {read[n]} messages, {stored} were stored")
    print(f"Tidemark broker: {args.size} B messages, async flush, {args.queues} queues; {machine()}")
    print(f"| {'phase':<44} | {'messages':>9} | {'seconds':>7} | {'msgs/s':>8} | {'MiB/s':>6} |")
    print(f"|{'-' * 46}|{'-' * 11}|{'-' * 9}|{'-' * 10}|{'-' * 8}|")
    for label, n, secs in rows:
        print(f"| {label:<44} | {n:>9,} | {secs:>7.2f} | {n / secs:>8,.0f} | {n * mib / secs:>6.1f} |")


if __name__ == "__main__":
    main()
