"""`python -m bench.tracing`: what message traces cost a producer, against one broker.

Three modes, alternated in every round (so drift on the machine hits them alike), each timed as
bench.idempotence times a producer: a fresh producer in this process sending 1 KiB messages with send_async
to an 8-queue topic (the `make bench` produce workload's shape), then another sending one at a time:

- `bypass`: the send calls without the tracing hooks (Producer.send_async/send_batch replaced by the
  methods they call when tracing is off): the code as it was before traces;
- `off`: the hooks in place, tracing off (the default): one module-flag test per send;
- `on`: tracing.enable() with an SDK TracerProvider that records every span and exports none (the
  spans' cost without an exporter's, which is the application's choice).

Prints medians and the ratios to `bypass`. `--smoke` runs tiny counts.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.idempotence import send_async_rate, send_latencies
from bench.tidemark_system import TidemarkServer

MODES = ("bypass", "off", "on")


@contextlib.contextmanager
def _mode(mode: str) -> Iterator[None]:
    from tidemark.client import Producer, tracing

    if mode == "on":
        from opentelemetry.sdk.trace import TracerProvider

        tracing.enable(TracerProvider())
    saved = Producer.send_async, Producer.send_batch
    if mode == "bypass":
        Producer.send_async = lambda self, message, callback=None, **kw: self._send_async(  # type: ignore
            message, callback, queue=kw.get("queue"), selector=kw.get("selector"), arg=kw.get("arg"))
        Producer.send_batch = lambda self, messages, **kw: self._send_batch(  # type: ignore
            messages, queue=kw.get("queue"), selector=kw.get("selector"), arg=kw.get("arg"),
            timeout=kw.get("timeout"))
    try:
        yield
    finally:
        Producer.send_async, Producer.send_batch = saved
        tracing.disable()


def _round(address: str, topic: str, n: int, sync: int, body: bytes) -> tuple[float, list[float]]:
    return send_async_rate(address, topic, n, body), send_latencies(address, topic, sync, body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=100_000, help="send_async messages per round and mode")
    p.add_argument("--sync", type=int, default=2_000, help="sync sends per round and mode")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--smoke", action="store_true", help="tiny counts, one round")
    args = p.parse_args(argv)
    if args.smoke:
        args.messages, args.sync, args.rounds = 2_000, 50, 1
    from tidemark.client import Admin

    body = b"x" * args.size
    server = TidemarkServer(Path(tempfile.mkdtemp(prefix="tidemark-tracing-"))).start()
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    p50s: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        with Admin(brokers=server.address) as admin:
            admin.create_topic("Traced8", 8)
        for i in range(args.rounds):
            for mode in MODES[i % 3:] + MODES[:i % 3]:  # each mode goes first in turn
                with _mode(mode):
                    rate, latencies = _round(server.address, "Traced8", args.messages, args.sync, body)
                rates[mode].append(rate)
                p50s[mode].append(statistics.median(latencies))
    finally:
        server.stop()
    print(f"message traces, {args.size} B messages, 8 queues, {args.rounds} round(s), medians of the rounds:")
    base_rate, base_p50 = statistics.median(rates["bypass"]), statistics.median(p50s["bypass"])
    for mode in MODES:
        rate, p50 = statistics.median(rates[mode]), statistics.median(p50s[mode])
        print(f"  {mode:7} send_async {rate:>9,.0f} msg/s ({rate / base_rate:.2f}x)   "
              f"sync send p50 {p50 * 1000:.3f} ms ({p50 / base_p50:.2f}x)   "
              f"rounds: {', '.join(f'{r:,.0f}' for r in rates[mode])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
