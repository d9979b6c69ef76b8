"""Consumer offset manager: commit throughput, commit latency while a 100k-entry table persists, persist time.

    python -m bench.offsets_bench                     # starts a throwaway broker in a temp dir
    python -m bench.offsets_bench --stream-commits 500000 --latency-seconds 20

Starts a broker (async flush, consumerOffset.json written every
--persist-interval-ms instead of 5 s so that a persist runs often during the
latency phase, JSON logs at DEBUG so each persist's duration is logged), fills
--topics topics of --queues queues with --messages-per-queue messages (commits
must stay <= the max offset), then measures from this process:

  1. CommitOffsets stream: --stream-commits commits in batches of 64 queue
     offsets (one commit per queue of a 64-queue slice), pre-built, one stream;
     rate = commits / (first write .. broker's answer, which comes after the
     last commit was applied).
  2. UpdateConsumerOffset, one call in flight (latency bound), and --inflight
     calls in flight (grpc.aio).
  3. Seeds the table to --groups x --topics x --queues entries (100,000 by
     default: 1,000 topic@group keys x 100 queues), then for --latency-seconds
     times one unary commit after another, each changing an offset so the
     table stays dirty; the broker's offsets_persisted log lines give each
     persist's [end - duration, end] window, and latencies are split into
     those starting inside a window and the rest.
  4. Time to persist the 100k-entry table: the broker's own log (duration of
     snapshot + encode + atomic write with fsyncs), and the same
     ConsumerOffsetManager driven in-process (its snapshot part is what runs on
     the event loop).

Broker CPU seconds per phase come from /proc/<pid>/stat. Prints numbers; asserts
only that the commits were applied.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.broker_bench import machine, start_broker
from tidemark.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    messaging_pb2,
    messaging_pb2_grpc,
    offsets_pb2,
    offsets_pb2_grpc,
)

BATCH = 64


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def commit(group: str, topic: str, queue_id: int, offset: int) -> offsets_pb2.OffsetCommit:
    return offsets_pb2.OffsetCommit(group=group, topic=topic, queue_id=queue_id, offset=offset)


class Bench:
    def __init__(self, args: argparse.Namespace, address: str, pid: int | None, log_path: Path | None) -> None:
        self.args = args
        self.address = address
        self.pid = pid
        self.log_path = log_path
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])
        self.offsets = offsets_pb2_grpc.OffsetServiceStub(self.channel)
        self.messaging = messaging_pb2_grpc.MessagingServiceStub(self.channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)
        self.topics = [f"ot{i}" for i in range(args.topics)]

    def cpu(self) -> float:
        return cpu_seconds(self.pid) if self.pid else float("nan")

    def fill(self) -> None:
        a = self.args
        body = [common_pb2.Message(body=b"o" * 16) for _ in range(a.messages_per_queue)]
        for topic in self.topics:
            self.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=topic, queue_nums=a.queues), timeout=30)
            for q in range(a.queues):
                self.messaging.SendMessage(messaging_pb2.SendMessageRequest(topic=topic, queue_id=q, messages=body),
                                           timeout=30)

    def stream(self, total: int) -> tuple[float, float]:
        topic, top = self.topics[0], self.args.messages_per_queue
        requests = [offsets_pb2.CommitOffsetsRequest(
            commits=[commit("stream-g", topic, q, (i % top) + 1) for q in range(BATCH)])
            for i in range(total // BATCH)]
        cpu = self.cpu()
        start = time.perf_counter()
        resp = self.offsets.CommitOffsets(iter(requests), timeout=3600)
        elapsed = time.perf_counter() - start
        if resp.applied != len(requests) * BATCH or resp.rejected:
            raise SystemExit(f"stream: applied {resp.applied}, rejected {resp.rejected}: {resp.rejections[:3]}")
        return len(requests) * BATCH / elapsed, self.cpu() - cpu

    def unary_sequential(self, total: int) -> tuple[float, list[float], float]:
        topic, top = self.topics[0], self.args.messages_per_queue
        requests = [offsets_pb2.UpdateConsumerOffsetRequest(commit=commit("unary-g", topic, i % BATCH, (i % top) + 1))
                    for i in range(total)]
        call = self.offsets.UpdateConsumerOffset
        latencies = []
        cpu = self.cpu()
        start = time.perf_counter()
        for r in requests:
            t = time.perf_counter()
            call(r, timeout=30)
            latencies.append(time.perf_counter() - t)
        return total / (time.perf_counter() - start), latencies, self.cpu() - cpu

    def unary_concurrent(self, total: int, inflight: int) -> tuple[float, float]:
        topic, top = self.topics[0], self.args.messages_per_queue

        async def go() -> float:
            async with grpc.aio.insecure_channel(self.address) as ch:
                stub = offsets_pb2_grpc.OffsetServiceStub(ch)
                counter = iter(range(total))

                async def worker() -> None:
                    for i in counter:
                        await stub.UpdateConsumerOffset(offsets_pb2.UpdateConsumerOffsetRequest(
                            commit=commit("aio-g", topic, i % BATCH, (i % top) + 1)), timeout=30)

                await stub.UpdateConsumerOffset(offsets_pb2.UpdateConsumerOffsetRequest(
                    commit=commit("aio-g", topic, 0, 1)), timeout=30)
                start = time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(inflight)))
                return time.perf_counter() - start

        cpu = self.cpu()
        elapsed = asyncio.run(go())
        return total / elapsed, self.cpu() - cpu

    def seed(self) -> tuple[int, float]:
        a = self.args
        requests = []
        for g in range(a.groups):
            for topic in self.topics:
                for q0 in range(0, a.queues, BATCH):
                    requests.append(offsets_pb2.CommitOffsetsRequest(commits=[
                        commit(f"seed-g{g}", topic, q, 1) for q in range(q0, min(q0 + BATCH, a.queues))]))
        start = time.perf_counter()
        resp = self.offsets.CommitOffsets(iter(requests), timeout=3600)
        return resp.applied, time.perf_counter() - start

    def latency_under_persist(self) -> tuple[list[tuple[float, float]], list[dict]]:
        a = self.args
        call = self.offsets.UpdateConsumerOffset
        top = a.messages_per_queue
        samples: list[tuple[float, float]] = []  # (wall-clock start, latency)
        log_from = self.log_path.stat().st_size if self.log_path else 0
        end = time.monotonic() + a.latency_seconds
        i = 0
        while time.monotonic() < end:
            g, topic, q = i % a.groups, self.topics[(i // a.groups) % len(self.topics)], i % a.queues
            r = offsets_pb2.UpdateConsumerOffsetRequest(commit=commit(f"seed-g{g}", topic, q, 1 + (i // 7) % top))
            wall, t = time.time(), time.perf_counter()
            call(r, timeout=30)
            samples.append((wall, time.perf_counter() - t))
            i += 1
        time.sleep(0.2)
        return samples, self.persist_events(log_from)

    def persist_events(self, log_from: int) -> list[dict]:
        if self.log_path is None:
            return []
        events = []
        with open(self.log_path, "rb") as f:
            f.seek(log_from)
            for line in f:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if doc.get("event") == "offsets_persisted":
                    events.append({"end": float(doc["ts"]), "duration": float(doc["duration_s"]),
                                   "entries": int(doc["entries"]), "bytes": int(doc["bytes"])})
        return events


def in_process_persist(entries_per_key: int, keys: int, repeat: int) -> dict:
    """ConsumerOffsetManager persisting a table of keys x entries_per_key, outside any broker."""
    from tidemark.broker.membership.epoch import EpochSequence
    from tidemark.broker.offsets import ConsumerOffsetManager

    tmp = Path(tempfile.mkdtemp(prefix="tidemark-offsets-"))
    try:
        mgr = ConsumerOffsetManager(tmp, epochs=EpochSequence(seed=0))
        mgr.load()
        for k in range(keys):
            for q in range(entries_per_key):
                mgr.commit(f"g{k % 100}", f"t{k // 100}", q, 1000 + q)
        reports = []

        async def persist():
            return await mgr.persist_if_dirty()

        for i in range(repeat):
            mgr.commit("g0", "t0", 0, i)  # dirty again
            reports.append(asyncio.run(persist()))
        return {"entries": mgr.entry_count(), "bytes": reports[-1].size_bytes,
                "total": statistics.median(r.duration_s for r in reports),
                "snapshot": statistics.median(r.snapshot_s for r in reports)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stream-commits", type=int, default=200_000)
    ap.add_argument("--unary-commits", type=int, default=10_000)
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--topics", type=int, default=10)
    ap.add_argument("--queues", type=int, default=100)
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--messages-per-queue", type=int, default=64)
    ap.add_argument("--persist-interval-ms", type=int, default=1000)
    ap.add_argument("--latency-seconds", type=float, default=15.0)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tidemark-bench-"))
    server, address = start_broker(tmp / "data", "--flush", "async", "--log-level", "DEBUG", "--log-format", "json",
                                   "--flush-consumer-offset-interval-ms", str(args.persist_interval_ms))
    try:
        b = Bench(args, address, server.proc.pid, server.log_path)
        b.fill()
        stream_rate, stream_cpu = b.stream(args.stream_commits)
        seq_rate, seq_lat, seq_cpu = b.unary_sequential(args.unary_commits)
        aio_rate, aio_cpu = b.unary_concurrent(args.unary_commits, args.inflight)
        seeded, seed_s = b.seed()
        samples, events = b.latency_under_persist()
        local = in_process_persist(args.queues, args.groups * args.topics, repeat=5)
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    big = [e for e in events if e["entries"] >= args.groups * args.topics * args.queues]
    windows = [(e["end"] - e["duration"], e["end"]) for e in big]
    inside = [lat for wall, lat in samples if any(lo <= wall <= hi for lo, hi in windows)]
    outside = [lat for wall, lat in samples if not any(lo <= wall <= hi for lo, hi in windows)]
    every = [lat for _, lat in samples]

    print(f"Tidemark consumer offsets; {machine()}")
    print(f"| {'measurement':<58} | {'result':>28} |")
    print(f"|{'-' * 60}|{'-' * 30}|")

    def row(label: str, value: str) -> None:
        print(f"| {label:<58} | {value:>28} |")

    row(f"CommitOffsets stream, batches of {BATCH}, 1 stream", f"{stream_rate:,.0f} commits/s")
    row("  broker CPU per 1,000 streamed commits", ms(stream_cpu / args.stream_commits * 1000))
    row("UpdateConsumerOffset, 1 in flight", f"{seq_rate:,.0f} commits/s")
    row("  latency p50 / p99", f"{ms(pct(seq_lat, .5))} / {ms(pct(seq_lat, .99))}")
    row(f"UpdateConsumerOffset, {args.inflight} in flight (grpc.aio)", f"{aio_rate:,.0f} commits/s")
    row("  broker CPU per 1,000 unary commits", ms(aio_cpu / args.unary_commits * 1000))
    row(f"seed {seeded:,} entries over the stream", f"{seed_s:.2f} s")
    row(f"unary commits, {seeded:,} entries persisted every {args.persist_interval_ms} ms", "")
    row(f"  all ({len(every):,} commits) p50 / p99", f"{ms(pct(every, .5))} / {ms(pct(every, .99))}")
    row(f"  while a persist ran ({len(inside):,}) p50 / p90 / max",
        f"{ms(pct(inside, .5))} / {ms(pct(inside, .9))} / {ms(max(inside, default=float('nan')))}")
    row(f"  otherwise ({len(outside):,}) p50 / p99", f"{ms(pct(outside, .5))} / {ms(pct(outside, .99))}")
    if big:
        durations = [e["duration"] for e in big]
        row(f"persist of {big[0]['entries']:,} entries in the broker ({len(big)} runs)",
            f"median {ms(statistics.median(durations))}, max {ms(max(durations))}")
        row("  consumerOffset.json size", f"{big[-1]['bytes'] / 1e6:.1f} MB")
    row(f"persist of {local['entries']:,} entries in-process, median of 5", ms(local["total"]))
    row("  of which on the event loop (snapshot copy)", ms(local["snapshot"]))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
