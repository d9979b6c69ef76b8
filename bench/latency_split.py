"""`python -m bench.latency_split`: where the time of an end-to-end delivery goes, send -> store -> listener.

Starts a broker (async flush) and, per rate and round, a consumer process and a
paced producer process (Producer.send_async, 1 KiB, a topic of 16 queues). Each
message carries the wall-clock time it was sent; the consumer subtracts it from
its clock at arrival (e2e), and splits it at the broker's store timestamp:

- send -> store: the producer's hand-off to its loop, the Produce stream, the
  broker's append;
- store -> arrival: the broker's wake-up of the fetch stream, the frame, the
  consumer's read (and, with `--consumer push`, the hand-off to a listener
  thread).

The store timestamp is cut down to the millisecond, so it is taken as its
millisecond's middle and the split is given as means (the error averages out)
over the 90 % fastest messages after the first tenth, the typical message's
split; e2e percentiles are exact. `--consumer raw` reads with a bare FetchStream on
the consumer's event loop (no PushConsumer, no listener threads), which
isolates the push consumer's own hop. Also prints the CPU each process used
per message (/proc/PID/stat) and the producer's acknowledgement latency.
`--consumer relay` runs, in the same rounds, a bare grpc.aio relay with the
same hops and no broker (bench/relay_floor.py): the floor that Python gRPC
sets under each process's CPU per message and under the latency.

`--baseline DIR` adds, to every run, a second consumer group whose consumer
process imports the `tidemark` package found in DIR (a copy of an older
tree): both consumers read the same messages in the same frames at the same
moment, so their latency and CPU compare side by side under the same load
(the broker and the producer run the current package).

    python -m bench.latency_split --rates 1000,5000 --rounds 3 --consumer push,raw
    python -m bench.latency_split --rates 5000 --rounds 6 --consumer push --baseline /tmp/old
    python -m bench.latency_split --rates 5000,20000 --rounds 3 --consumer push,raw,relay
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import relay_floor
from bench.broker_bench import start_broker
from bench.procs import REPO, child_env, orphan_safe, own_cpu_s

HEAD = struct.Struct("<dq")  # send time (time.time()), sequence
QUEUES = 16


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def producer(address: str, topic: str, rate: int, seconds: float) -> dict:
    from tidemark.client import Message, Producer

    acks: list[float] = []
    pad = b"x" * (1024 - HEAD.size)
    with Producer(brokers=address) as p:
        p.fetch_publish_message_queues(topic)
        count = int(rate * seconds)
        cpu = own_cpu_s()
        start = time.time() + 0.2
        for i in range(count):
            delay = start + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            sent = time.time()
            p.send_async(Message(topic, HEAD.pack(sent, i) + pad),
                         lambda result, error, sent=sent: acks.append(time.time() - sent))
        deadline = time.time() + 30
        while len(acks) < count and time.time() < deadline:
            time.sleep(0.01)
        cpu = own_cpu_s() - cpu
    kept = acks[len(acks) // 10:]
    return {"ack_p50_ms": pct(kept, 0.5) * 1e3, "ack_p99_ms": pct(kept, 0.99) * 1e3,
            "cpu_us_per_msg": cpu / count * 1e6}


class Split:
    def __init__(self) -> None:
        self.e2e: list[float] = []
        self.to_store: list[float] = []
        self.from_store: list[float] = []

    def add(self, now: float, body: bytes, store_ms: int) -> None:
        sent, _ = HEAD.unpack_from(body)
        stored = (store_ms + 0.5) / 1000  # the broker's clock is cut down to the millisecond: half of one on average
        self.e2e.append(now - sent)
        self.to_store.append(stored - sent)
        self.from_store.append(now - stored)

    def result(self) -> dict:
        skip = len(self.e2e) // 10
        e2e, to_store, from_store = self.e2e[skip:], self.to_store[skip:], self.from_store[skip:]
        # The split of the typical message: means over the 90 % fastest (a busy machine's stalls of tens of
        # milliseconds would otherwise make the means; the percentiles show them).
        cut = pct(e2e, 0.9)
        typical = [i for i, v in enumerate(e2e) if v <= cut] or [0]
        mean = lambda values: statistics.fmean(values[i] for i in typical) * 1e3 if e2e else float("nan")  # noqa: E731
        return {"received": len(self.e2e), "e2e_p50_ms": pct(e2e, 0.5) * 1e3, "e2e_p99_ms": pct(e2e, 0.99) * 1e3,
                "e2e_mean_ms": mean(e2e), "send_to_store_mean_ms": mean(to_store),
                "store_to_arrival_mean_ms": mean(from_store)}


def consumer(address: str, topic: str, kind: str, expect: int, seconds: float, variant: str = "current") -> dict:
    split = Split()
    if kind == "push":
        from tidemark.client import ConsumeConcurrentlyStatus, ConsumeFromWhere, PushConsumer

        def listener(msgs, ctx):
            now = time.time()
            for m in msgs:
                split.add(now, m.body, m.store_timestamp)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        c = PushConsumer(group=f"{topic}-{variant}", brokers=address, consume_from_where=ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET)
        c.subscribe(topic)
        c.register_message_listener(listener)
        c.start()
        print("ready", flush=True)
        cpu = own_cpu_s()
        _wait(split, expect, seconds)
        cpu = own_cpu_s() - cpu
        c.shutdown()
    else:
        import asyncio

        from tidemark.client.message import MessageExt, MessageQueue
        from tidemark.client.remoting.connection import BrokerConnection

        async def run() -> float:
            conn = BrokerConnection(address, timeout_s=10)
            await conn.broker_info()

            def on_records(handle: int, count: int, data: bytes, next_offset: int, max_offset: int) -> None:
                now, pos = time.time(), 0
                for _ in range(count):
                    m = MessageExt.from_record(data, pos, topic=topic, broker_name=conn.broker_name or "")
                    pos += m.store_size
                    split.add(now, m.body, m.store_timestamp)
                stream.credit(handle, count, len(data))

            stream = conn.open_fetch_stream(on_records=on_records, on_ended=lambda h, e: None,
                                            on_broken=lambda e: None)
            for q in range(QUEUES):
                stream.open_queue(q + 1, f"{topic}-raw-{variant}", MessageQueue(topic, conn.broker_name or "", q), 0,
                                  subscription="*", fence=None, credit_messages=1000, credit_bytes=64 << 20,
                                  batch_size=32)
            print("ready", flush=True)
            cpu = own_cpu_s()
            await asyncio.get_running_loop().run_in_executor(None, _wait, split, expect, seconds)
            cpu = own_cpu_s() - cpu
            await stream.close()
            await conn.close()
            return cpu

        cpu = asyncio.run(run())
    return {**split.result(), "cpu_us_per_msg": cpu / max(1, len(split.e2e)) * 1e6}


def _wait(split: Split, expect: int, seconds: float) -> None:
    deadline = time.time() + seconds
    while len(split.e2e) < expect and time.time() < deadline:
        time.sleep(0.01)


def child(role: str, *args: str, package: str | None = None) -> subprocess.Popen:
    env = child_env()
    if package:  # a directory holding another `tidemark` package, found before the installed one
        env["PYTHONPATH"] = os.pathsep.join((package, env["PYTHONPATH"]))
    return subprocess.Popen(orphan_safe([sys.executable, "-m", "bench.latency_split", "--role", role, *args]),
                            stdout=subprocess.PIPE, text=True, env=env, cwd=str(REPO))


def one_run(address: str, broker_pid: int, topic: str, rate: int, seconds: float, kind: str,
            baseline: str | None = None, swap: bool = False) -> list[dict]:
    """One paced run; with `baseline`, a second consumer group on the same topic runs the package found there,
    side by side with the current one: both get the same messages in the same frames at the same moment.
    The group that starts first is served first by the broker on every append (its stream registered first),
    which can favour one of the two: `swap` starts the baseline's first (main() alternates it by round)."""
    import grpc

    from tidemark.v1 import admin_pb2, admin_pb2_grpc
    with grpc.insecure_channel(address) as channel:
        admin_pb2_grpc.AdminServiceStub(channel).CreateTopic(
            admin_pb2.CreateTopicRequest(name=topic, queue_nums=QUEUES), timeout=30)
    count = int(rate * seconds)
    variants = {"current": None, **({"baseline": baseline} if baseline else {})}
    if swap:
        variants = dict(reversed(variants.items()))
    consumers: dict[str, subprocess.Popen] = {}
    for name, package in variants.items():  # one after the other: the first is ready before the second starts
        cons = consumers[name] = child("consumer", address, topic, kind, str(count), str(seconds + 30), name,
                                       package=package)
        assert cons.stdout is not None
        if cons.stdout.readline().strip() != "ready":
            raise SystemExit("consumer did not start")
    time.sleep(2.0)  # the consumers own every queue before the first send
    broker_cpu = cpu_s(broker_pid)
    prod = child("producer", address, topic, str(rate), str(seconds))
    p_out, _ = prod.communicate(timeout=seconds + 60)
    outs = {name: cons.communicate(timeout=60)[0] for name, cons in consumers.items()}
    broker_cpu = cpu_s(broker_pid) - broker_cpu
    p = json.loads(p_out.strip().splitlines()[-1])
    rows = []
    for name, out in outs.items():
        c = json.loads(out.strip().splitlines()[-1])
        rows.append({"rate": rate, "consumer": kind, "variant": name, **c,
                     "producer_cpu_us_per_msg": p["cpu_us_per_msg"], "consumer_cpu_us_per_msg": c["cpu_us_per_msg"],
                     "broker_cpu_us_per_msg": broker_cpu / count * 1e6, "ack_p50_ms": p["ack_p50_ms"],
                     "ack_p99_ms": p["ack_p99_ms"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--rates", default="1000,5000", help="comma list of msg/s")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--consumer", default="push,raw",
                    help="comma list: push (PushConsumer), raw (FetchStream), relay (no broker: bench.relay_floor)")
    ap.add_argument("--relay-batching", choices=("natural", "none"), default="natural",
                    help="the relay's producer: natural batching, as Tidemark's producer, or a request a message")
    ap.add_argument("--baseline", help="a directory holding another `tidemark` package: every run also has a "
                                       "consumer group of that package's consumer beside the current one (A/B)")
    a = ap.parse_args()
    if a.role == "producer":
        address, topic, rate, seconds = a.args
        print(json.dumps(producer(address, topic, int(rate), float(seconds))))
        return
    if a.role == "consumer":
        address, topic, kind, expect, seconds, variant = a.args
        print(json.dumps(consumer(address, topic, kind, int(expect), float(seconds), variant)))
        return
    work = Path(tempfile.mkdtemp(prefix="latency-split-"))
    server, address = start_broker(work / "data")
    assert server.proc is not None
    rows: list[dict] = []
    try:
        for rnd in range(a.rounds):
            for rate in (int(r) for r in a.rates.split(",")):
                for kind in a.consumer.split(","):
                    if kind == "relay":
                        runs = [{"rate": rate, "consumer": kind, "variant": "current",
                                 **relay_floor.one_run(rate, a.seconds, a.relay_batching == "natural")}]
                    else:
                        runs = one_run(address, server.proc.pid, f"split_{rnd}_{rate}_{kind}", rate, a.seconds, kind,
                                       a.baseline, swap=rnd % 2 == 1)
                    for row in runs:
                        rows.append(row)
                        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}),
                              flush=True)
    finally:
        server.stop()
    keys = ("e2e_p50_ms", "e2e_p99_ms", "send_to_store_mean_ms", "store_to_arrival_mean_ms", "ack_p50_ms",
            "producer_cpu_us_per_msg", "broker_cpu_us_per_msg", "consumer_cpu_us_per_msg")
    print(f"medians of {a.rounds} round(s); load average {os.getloadavg()[0]:.1f}")
    print("rate consumer variant " + " ".join(keys))
    for rate in (int(r) for r in a.rates.split(",")):
        for kind in a.consumer.split(","):
            for variant in ("current", "baseline") if a.baseline else ("current",):
                mine = [r for r in rows if r["rate"] == rate and r["consumer"] == kind and r["variant"] == variant]
                if not mine:  # (the relay has no baseline)
                    continue
                print(f"{rate} {kind} {variant} " + " ".join(f"{statistics.median(r[k] for r in mine):.2f}"
                                                              for k in keys))


if __name__ == "__main__":
    main()
