"""`python -m bench.idempotence`: what the idempotent producer costs, on against off, against one broker.

Rounds alternate (on, off, on, off, ...) so drift on the machine hits both
sides alike; each round is a fresh producer in this process:

- send_async throughput, 1 KiB messages, on an 8-queue topic (the `make bench`
  produce workload's shape) and on a 1-queue topic (the worst case: at most
  max_in_flight_per_queue batches of that queue in flight, the rest wait);
- sync send() latency, one message at a time (p50 and p99).

Prints medians and the on/off ratios. `--smoke` runs tiny counts (tests/bench).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.tidemark_system import TidemarkServer


def send_async_rate(address: str, topic: str, n: int, body: bytes, idempotent: bool = True) -> float:
    """Messages per second of `n` send_async calls of a fresh producer (also bench.tracing's)."""
    from tidemark.client import Message, Producer

    with Producer(brokers=address, enable_idempotence=idempotent) as producer:
        producer.send(Message(topic, body))  # routes, stream and producer id before timing
        started = time.perf_counter()
        futures = [producer.send_async(Message(topic, body)) for _ in range(n)]
        for f in futures:
            f.result(120)
        return n / (time.perf_counter() - started)


def send_latencies(address: str, topic: str, n: int, body: bytes, idempotent: bool = True) -> list[float]:
    """Seconds of each of `n` sync sends, one at a time, of a fresh producer (also bench.tracing's)."""
    from tidemark.client import Message, Producer

    with Producer(brokers=address, enable_idempotence=idempotent) as producer:
        producer.send(Message(topic, body))
        out = []
        for _ in range(n):
            started = time.perf_counter()
            producer.send(Message(topic, body))
            out.append(time.perf_counter() - started)
        return out


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idempotence", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=200_000, help="send_async messages per round")
    p.add_argument("--sync", type=int, default=3_000, help="sync sends per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--smoke", action="store_true", help="tiny counts, one round")
    args = p.parse_args(argv)
    if args.smoke:
        args.messages, args.sync, args.rounds = 2_000, 50, 1
    from tidemark.client import Admin

    body = b"x" * args.size
    server = TidemarkServer(Path(tempfile.mkdtemp(prefix="tidemark-idem-"))).start()
    results: dict[tuple[str, bool], list[float]] = {}
    latencies: dict[bool, list[float]] = {True: [], False: []}
    try:
        with Admin(brokers=server.address) as admin:
            admin.create_topic("Idem8", 8)
            admin.create_topic("Idem1", 1)
        for _ in range(args.rounds):
            for idempotent in (True, False):
                for topic in ("Idem8", "Idem1"):
                    rate = send_async_rate(server.address, topic, args.messages, body, idempotent)
                    results.setdefault((topic, idempotent), []).append(rate)
                latencies[idempotent] += send_latencies(server.address, "Idem8", args.sync, body, idempotent)
    finally:
        server.stop()
    print(f"idempotent producer, {args.size} B messages, {args.rounds} round(s), medians:")
    for topic, label in (("Idem8", "send_async, 8 queues"), ("Idem1", "send_async, 1 queue")):
        on, off = statistics.median(results[(topic, True)]), statistics.median(results[(topic, False)])
        print(f"  {label:22} on {on:>10,.0f} msg/s   off {off:>10,.0f} msg/s   on/off {on / off:.2f}x")
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        on, off = _p(latencies[True], q) * 1000, _p(latencies[False], q) * 1000
        print(f"  sync send {name:12} on {on:>8.3f} ms     off {off:>8.3f} ms     on/off {on / off:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
