"""A push consumer in its own process, for tests that need real separate consumers.

Each consumed message is appended to --out as "msg_id queue_id queue_offset client_id start_ns end_ns"
(flushed at once). Prints READY when started; SIGTERM shuts down gracefully. With --hold-file, a listener
call that starts while that file exists logs "listener held" and lasts until the file is gone (a listener
stuck on something outside, as long as the test says).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidemark.client import (  # noqa: E402
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    PushConsumer,
)
from tidemark.common.logs import setup_logging  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--brokers", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--instance", default=str(os.getpid()))
    p.add_argument("--no-locking", action="store_true")
    p.add_argument("--orderly", action="store_true")
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--persist-interval", type=float, default=5.0)
    p.add_argument("--rebalance-interval", type=float, default=20.0)
    p.add_argument("--heartbeat-interval", type=float, default=30.0)
    p.add_argument("--lock-renew-interval", type=float, default=20.0)
    p.add_argument("--drain-timeout", type=float, default=10.0)
    p.add_argument("--hold-file", type=Path)
    p.add_argument("--strategy", default="AVG")
    p.add_argument("--log-level", default="INFO", help="of the client's log on stderr (the test's <out>.log)")
    args = p.parse_args()
    setup_logging(args.log_level)

    out = open(args.out, "a", buffering=1)
    lock = threading.Lock()
    consumer = PushConsumer(
        group=args.group, brokers=args.brokers, instance_name=args.instance,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, queue_locking=not args.no_locking,
        persist_consumer_offset_interval_s=args.persist_interval, rebalance_interval_s=args.rebalance_interval,
        heartbeat_interval_s=args.heartbeat_interval, lock_renew_interval_s=args.lock_renew_interval,
        drain_timeout_s=args.drain_timeout, allocate_strategy=args.strategy)
    client_id = consumer.client_id

    def record(msgs, started):
        ended = time.monotonic_ns()
        with lock:
            for m in msgs:
                out.write(f"{m.msg_id} {m.queue_id} {m.queue_offset} {client_id} {started} {ended}\n")

    def work():
        if args.hold_file is not None and args.hold_file.exists():
            print("listener held", file=sys.stderr, flush=True)
            while args.hold_file.exists():
                time.sleep(0.01)
        if args.delay_ms:
            time.sleep(random.uniform(0, args.delay_ms) / 1000)

    def concurrently(msgs, ctx):
        started = time.monotonic_ns()
        work()
        record(msgs, started)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def orderly(msgs, ctx):
        started = time.monotonic_ns()
        work()
        record(msgs, started)
        return ConsumeOrderlyStatus.SUCCESS

    consumer.subscribe(args.topic)
    if args.orderly:
        consumer.register_message_listener_orderly(orderly)
    else:
        consumer.register_message_listener(concurrently)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    consumer.start()
    print("READY", flush=True)
    stop.wait()
    consumer.shutdown()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
