"""`python -m bench.client_alone`: one client process against a throwaway broker, for profiling.

Produces N messages of 1 KiB with Producer.send_async, then consumes them with one PushConsumer
(default settings) from a prefilled 8-queue topic, printing each phase's rate and the CPU this process
used per message. Run under `py-spy record --subprocesses -- .venv/bin/python -m bench.client_alone`
to see where a client's time goes; the peer comparison is `python -m bench`.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import threading
import time
from pathlib import Path

from bench.tidemark_system import TidemarkServer


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.client_alone", description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=400_000)
    p.add_argument("--size", type=int, default=1024)
    args = p.parse_args(argv)
    from tidemark.client import (
        Admin,
        ConsumeConcurrentlyStatus,
        ConsumeFromWhere,
        Message,
        Producer,
        PushConsumer,
    )

    n, body = args.messages, b"x" * args.size
    server = TidemarkServer(Path(tempfile.mkdtemp(prefix="tidemark-alone-"))).start()
    try:
        with Admin(brokers=server.address) as admin:
            admin.create_topic("Alone", 8)
        with Producer(brokers=server.address) as producer:
            producer.send(Message("Alone", body))  # routes and the stream, before timing
            started, cpu = time.perf_counter(), _cpu()
            for _ in range(n):
                producer.send_async(Message("Alone", body))
            producer.shutdown()  # returns once every send_async is answered
            elapsed, used = time.perf_counter() - started, _cpu() - cpu
        print(f"produce: {n / elapsed:,.0f} msg/s, {used / n * 1e6:.1f} us CPU per message in this process")

        total = n + 1
        seen = [0]
        lock, done = threading.Lock(), threading.Event()

        def listener(msgs, ctx):
            with lock:
                seen[0] += len(msgs)
                if seen[0] >= total:
                    done.set()
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer = PushConsumer(group="alone", brokers=server.address,
                                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        consumer.subscribe("Alone")
        consumer.register_message_listener(listener)
        started, cpu = time.perf_counter(), _cpu()
        consumer.start()
        if not done.wait(300):
            print(f"consume: only {seen[0]:,} of {total:,} in 300 s")
            return 1
        elapsed, used = time.perf_counter() - started, _cpu() - cpu
        consumer.shutdown()
        print(f"consume: {total / elapsed:,.0f} msg/s, {used / total * 1e6:.1f} us CPU per message in this process")
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
