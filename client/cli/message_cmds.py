"""tidemark send | consume | message get | message search."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime

from client.admin import Admin
from client.cli.args import OFFSET, QUEUE_ID, int_in
from client.cli.connect import client_kwargs
from client.cli.output import Progress, emit, iso_ms, message_json, print_line
from client.consumer.push_consumer import PushConsumer
from client.errors import InvalidArgumentError, TidemarkError
from client.message import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageQueue,
    PullStatus,
)
from client.producer.producer import Producer

# `consume --group` started while no broker answers: try again, backing off up to this.
START_RETRY_MIN_S = 0.5
START_RETRY_MAX_S = 5.0


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("send", parents=[common], help="send messages")
    p.add_argument("topic")
    body = p.add_mutually_exclusive_group()
    body.add_argument("--body", help="message body (UTF-8)")
    body.add_argument("--count", type=int_in(1, 10**9), help="send this many generated messages")
    p.add_argument("--size", type=int_in(0, 64 << 20), default=1024, help="bytes per generated message (default 1024)")
    p.add_argument("--tag", default="", help="message tag")
    p.add_argument("--keys", default="", help="business keys, space separated")
    p.add_argument("--batch", type=int_in(1, 10_000), default=1, help="messages per send with --count (default 1)")
    p.add_argument("--queue", type=QUEUE_ID, help="queue id (default: round-robin)")
    p.add_argument("--delay-level", type=int_in(0, 1000), default=0, help="deliver after this delay level")
    p.set_defaults(run=send)

    p = sub.add_parser("consume", parents=[common], help="print messages as JSON lines")
    p.add_argument("topic")
    p.add_argument("--group", help="consume as a push consumer of this group (commits as it goes)")
    p.add_argument("--from-offset", default="earliest", help="without --group: earliest | latest | N")
    p.add_argument("--count", type=int_in(1, 10**12), help="stop after this many messages (default: until SIGINT/SIGTERM)")
    p.add_argument("--tag", default="*", help="tag expression, e.g. 'a || b'")
    p.add_argument("--from-where", choices=["last", "first", "timestamp"], default="last",
                   help="with --group: where a new group starts (default last)")
    p.set_defaults(run=consume)

    msg = sub.add_parser("message", help="look up messages")
    msub = msg.add_subparsers(dest="message_command", required=True, metavar="ACTION")
    p = msub.add_parser("get", parents=[common], help="one message by queue position")
    p.add_argument("--topic", required=True)
    p.add_argument("--queue", type=QUEUE_ID, required=True)
    p.add_argument("--offset", type=OFFSET, required=True)
    p.add_argument("--broker-name", help="broker holding the queue (default: the only/first one)")
    p.set_defaults(run=message_get)
    p = msub.add_parser("search", parents=[common], help="messages with a key within a time range")
    p.add_argument("--topic", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--begin", help="ISO time (default: 24 h ago)")
    p.add_argument("--end", help="ISO time (default: now)")
    p.add_argument("--max", type=int_in(1, 10_000), default=64)
    p.set_defaults(run=message_search)


def parse_time_ms(text: str, option: str) -> int:
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise InvalidArgumentError(f"{option}: {text!r} is not an ISO date/time like 2026-11-22T10:00:00") from None


def send(args: argparse.Namespace) -> int:
    if args.body is None and args.count is None:
        raise InvalidArgumentError("give --body TEXT or --count N")
    with Producer(**client_kwargs(args), send_msg_timeout_s=args.timeout) as producer:
        queue = None
        if args.queue is not None:
            mqs = [q for q in producer.fetch_publish_message_queues(args.topic) if q.queue_id == args.queue]
            if not mqs:
                raise InvalidArgumentError(f"topic {args.topic!r} has no writable queue {args.queue}")
            queue = mqs[0]
        if args.body is not None:
            result = producer.send(Message(args.topic, args.body.encode("utf-8"), tags=args.tag, keys=args.keys,
                                           delay_level=args.delay_level), queue=queue)
            emit([{"msg_id": result.msg_id, "broker": result.message_queue.broker_name,
                   "queue": result.message_queue.queue_id, "offset": result.queue_offset}],
                 ["msg_id", "broker", "queue", "offset"], as_json=args.json)
            return 0
        if args.count <= 0 or args.size <= 0 or args.batch <= 0:
            raise InvalidArgumentError("--count, --size and --batch must be > 0")
        payload = (os.urandom(args.size // 2 + 1).hex()[: args.size]).encode("ascii")
        progress = Progress(args.count, "send")
        started, sent = time.monotonic(), 0
        while sent < args.count:
            n = min(args.batch, args.count - sent)
            producer.send_batch([Message(args.topic, payload, tags=args.tag, keys=args.keys) for _ in range(n)],
                                queue=queue)
            sent += n
            progress.update(sent)
        elapsed = time.monotonic() - started
    summary = {"topic": args.topic, "sent": sent, "seconds": round(elapsed, 3),
               "msgs_per_s": round(sent / elapsed) if elapsed else sent}
    emit([summary], ["topic", "sent", "seconds", "msgs_per_s"], as_json=args.json)
    return 0


def consume(args: argparse.Namespace) -> int:
    if args.count is not None and args.count <= 0:
        raise InvalidArgumentError("--count must be > 0")
    return consume_group(args) if args.group else consume_plain(args)


def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def consume_plain(args: argparse.Namespace) -> int:
    """Read every queue of the topic without a group, from --from-offset."""
    stop = _stop_event()
    with Admin(**client_kwargs(args)) as admin:
        mqs = admin.fetch_message_queues(args.topic)
        positions: dict[MessageQueue, int] = {}
        for mq, (low, high) in admin.offsets(mqs).items():
            positions[mq] = _start(args.from_offset, low, high)
        printed = 0
        while not stop.is_set():
            idle = True
            for mq in mqs:
                result = admin.pull(mq, positions[mq], max_nums=32, subscription=args.tag)
                positions[mq] = result.next_begin_offset
                if result.status is PullStatus.FOUND:
                    idle = False
                for m in result.messages:
                    print_line(message_json(m))
                    printed += 1
                    if args.count is not None and printed >= args.count:
                        return 0
            if idle:
                stop.wait(0.2)
    return 0


def _start(spec: str, low: int, high: int) -> int:
    if spec == "earliest":
        return low
    if spec == "latest":
        return high
    try:
        n = int(spec)
    except ValueError:
        raise InvalidArgumentError(f"--from-offset must be earliest, latest or a number, got {spec!r}") from None
    if n < 0:
        raise InvalidArgumentError(f"--from-offset must be >= 0, got {n}")
    return min(max(n, low), high)


def consume_group(args: argparse.Namespace) -> int:
    """A push consumer of the group; prints and commits what it printed.

    At --count, or when stdout is closed (`| head`), the consumer is suspended: later messages never
    reach the listener, and one that could not be printed is not acknowledged, so everything not
    printed stays uncommitted for the group's next reader (nothing is sent to %RETRY%)."""
    stop = _stop_event()
    lock = threading.Lock()
    printed = [0]
    enough = threading.Event()
    closed = threading.Event()
    where = {"last": ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET, "first": ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
             "timestamp": ConsumeFromWhere.CONSUME_FROM_TIMESTAMP}[args.from_where]
    current: list[PushConsumer] = []  # the consumer being started or running (the listener suspends it)

    def listener(msgs, context):
        with lock:
            if enough.is_set():
                return ConsumeConcurrentlyStatus.RECONSUME_LATER  # suspended: held, never sent back
            for i, m in enumerate(msgs):
                try:
                    print_line(message_json(m))
                except BrokenPipeError:
                    closed.set()
                    return _stop_at(current[-1], enough, context, i)
                printed[0] += 1
                if args.count is not None and printed[0] >= args.count:
                    return _stop_at(current[-1], enough, context, i + 1)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def build() -> PushConsumer:
        # One consume thread: messages reach the listener one at a time, so suspending stops the very next one.
        c = PushConsumer(group=args.group, **client_kwargs(args), consume_from_where=where, consume_thread_max=1)
        c.subscribe(args.topic, args.tag)
        c.register_message_listener(listener)
        current.append(c)
        return c

    consumer = _start_riding_out_outages(build, stop)
    if consumer is None:
        return 0  # stopped before any broker answered
    try:
        while not stop.is_set() and not enough.is_set():
            stop.wait(0.1)
    finally:
        consumer.shutdown()
        if closed.is_set():
            # Nothing more can reach the reader; keep Python's exit-time flush from failing on the pipe.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _start_riding_out_outages(build: Callable[[], PushConsumer], stop: threading.Event) -> PushConsumer | None:
    """Start a consumer, trying again with backoff while no broker can be reached (it may be restarting);
    None when stopped first. Errors a retry cannot fix (an unknown topic, a bad group name) are raised.

    Once started, the consumer itself rides through broker restarts: fetch streams reopen with backoff,
    lost queues are locked again and resume from where this process got."""
    delay = START_RETRY_MIN_S
    while not stop.is_set():
        consumer = build()
        try:
            return consumer.start()
        except TidemarkError as e:
            if not e.retriable:
                raise
            print(f"tidemark: no broker answered ({e}); retrying in {delay:.1f}s", file=sys.stderr, flush=True)
        stop.wait(delay)
        delay = min(delay * 2, START_RETRY_MAX_S)
    return None


def _stop_at(consumer: PushConsumer, enough: threading.Event, context, done: int) -> ConsumeConcurrentlyStatus:
    """Suspend the consumer; the first `done` messages of this batch were printed, the rest stay."""
    consumer.suspend()
    enough.set()
    context.ack_index = done - 1
    return ConsumeConcurrentlyStatus.RECONSUME_LATER


def message_get(args: argparse.Namespace) -> int:
    with Admin(**client_kwargs(args)) as admin:
        if args.broker_name:
            broker = args.broker_name
        else:
            names = sorted({d.broker_name for d in admin.route(args.topic).queue_datas})
            broker = names[0]
        m = admin.view_message(MessageQueue(args.topic, broker, args.queue), args.offset)
    doc = message_json(m)
    if args.json:
        print_line(doc)
    else:
        emit([{"field": k, "value": v} for k, v in doc.items()], ["field", "value"], as_json=False)
    return 0


def message_search(args: argparse.Namespace) -> int:
    end = parse_time_ms(args.end, "--end") if args.end else int(time.time() * 1000)
    begin = parse_time_ms(args.begin, "--begin") if args.begin else end - 24 * 3600 * 1000
    with Admin(**client_kwargs(args)) as admin:
        found = admin.query_message_by_key(args.topic, args.key, begin, end, args.max)
    rows = [{"msg_id": m.msg_id, "broker": m.broker_name, "queue": m.queue_id, "offset": m.queue_offset,
             "keys": m.keys, "tags": m.tags, "stored": iso_ms(m.store_timestamp)} for m in found]
    emit(rows, ["msg_id", "broker", "queue", "offset", "keys", "tags", "stored"], as_json=args.json)
    return 0
