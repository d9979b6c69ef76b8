"""`python -m bench.rmq5_client`: the official RocketMQ 5 Python client against Tidemark.

Starts one broker and measures, with the same message count and body size:

- produce: `rocketmq.Producer.send` (synchronous, one message per call, as its
  API offers) from T threads, next to Tidemark's own `Producer.send` (also one
  message per synchronous call) from the same number of threads;
- receive: `rocketmq.SimpleConsumer.receive(32)` plus one `ack` per message
  (pop consumption: the broker tracks every delivery) by C consumers, next to
  Tidemark's `PullConsumer.poll` with auto-commit (queue offsets) by one consumer.

The ratio says what the protocol adapter and pop bookkeeping cost next to
Tidemark's own path in the same run; the official client's own per-call cost
(a thread pool and an event loop per client) is part of both of its numbers.
Prints a table; writes nothing. `make bench-rmq5` runs it with the defaults.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.tidemark_system import TidemarkServer
from tidemark.client import Admin, ConsumeFromWhere, Message, Producer, PullConsumer


def _rocketmq(home: Path):
    """The official client, its log under `home` (it writes ~/logs/rocketmq_python at import)."""
    os.environ["HOME"] = str(home)
    return importlib.import_module("rocketmq")


def _threads(n: int, work) -> float:
    """Run work(i) in n threads; the seconds they took together."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def produce_official(rmq, address: str, topic: str, count: int, body: bytes, threads: int) -> float:
    producer = rmq.Producer(rmq.ClientConfiguration(address, rmq.Credentials()), (topic,))
    producer.startup()
    try:
        def work(i: int) -> None:
            for _ in range(i, count, threads):
                m = rmq.Message()
                m.topic, m.body = topic, body
                producer.send(m)
        return count / _threads(threads, work)
    finally:
        producer.shutdown()


def produce_tidemark(address: str, topic: str, count: int, body: bytes, threads: int) -> float:
    with Producer(brokers=address) as producer:
        def work(i: int) -> None:
            for _ in range(i, count, threads):
                producer.send(Message(topic, body))
        return count / _threads(threads, work)


def receive_official(rmq, address: str, topic: str, group: str, count: int, consumers: int) -> float:
    config = rmq.ClientConfiguration(address, rmq.Credentials())
    clients = [rmq.SimpleConsumer(config, group, {topic: rmq.FilterExpression()}, await_duration=2)
               for _ in range(consumers)]
    for c in clients:
        c.startup()
    done = [0]
    lock = threading.Lock()
    try:
        def work(i: int) -> None:
            while True:
                with lock:
                    if done[0] >= count:
                        return
                messages = clients[i].receive(32, 30)
                for m in messages:
                    clients[i].ack(m)
                with lock:
                    done[0] += len(messages)
        return count / _threads(consumers, work)
    finally:
        for c in clients:
            c.shutdown()


def receive_tidemark(address: str, topic: str, group: str, count: int) -> float:
    consumer = PullConsumer(group=group, brokers=address, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe(topic)
    with consumer:
        got, started = 0, time.perf_counter()
        while got < count:
            got += len(consumer.poll(1.0))
        return count / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5_000)
    parser.add_argument("--body", type=int, default=100, help="body bytes")
    parser.add_argument("--threads", type=int, default=4, help="producer threads")
    parser.add_argument("--consumers", type=int, default=2, help="official SimpleConsumers")
    args = parser.parse_args(argv)
    body = b"x" * args.body
    with tempfile.TemporaryDirectory(prefix="tidemark-rmq5-bench-") as tmp:
        workdir = Path(tmp)
        rmq = _rocketmq(workdir)
        server = TidemarkServer(workdir).start()
        try:
            with Admin(brokers=server.address) as admin:
                admin.create_topic("bench-rmq5", 4)
                admin.create_topic("bench-own", 4)
            rows = [
                ("produce", produce_official(rmq, server.address, "bench-rmq5", args.messages, body, args.threads),
                 produce_tidemark(server.address, "bench-own", args.messages, body, args.threads)),
                ("receive", receive_official(rmq, server.address, "bench-rmq5", "bench-rmq5-group", args.messages,
                                             args.consumers),
                 receive_tidemark(server.address, "bench-own", "bench-own-group", args.messages)),
            ]
        finally:
            server.server.stop()
    print(f"\nofficial RocketMQ 5 Python client vs Tidemark's client, {args.messages} messages of {args.body} B, "
          f"{args.threads} producer threads, {args.consumers} SimpleConsumers\n")
    print("| workload | official client msg/s | Tidemark client msg/s | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for name, official, own in rows:
        print(f"| {name} | {official:,.0f} | {own:,.0f} | {official / own:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
