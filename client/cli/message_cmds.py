"""tidemark send | consume | message get | message search | message trace."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime

from tidemark.client.admin import Admin
from tidemark.client.cli.args import INT64_MAX, OFFSET, QUEUE_ID, from_offset, group_name, int_in
from tidemark.client.cli.connect import client_kwargs
from tidemark.client.cli.output import (
    BODY_FORMATS,
    Progress,
    emit,
    iso_ms,
    message_fields,
    message_json,
    message_line,
    print_line,
)
from tidemark.client.consumer.push_consumer import PushConsumer
from tidemark.client.errors import FailedPreconditionError, InvalidArgumentError, TidemarkError
from tidemark.client.journey import trace_message
from tidemark.client.message import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    MessageQueue,
    PullStatus,
)
from tidemark.client.namespacing import Names
from tidemark.client.producer.producer import Producer
from tidemark.common.backoff import Backoff

# `consume --group` started while no broker answers: try again, backing off up to this.
START_RETRY = Backoff(first_s=0.5, max_s=5.0)
# Readable consume lines show this much of a body unless --max-body-bytes says otherwise.
READABLE_MAX_BODY_BYTES = 256


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("send", parents=[common], help="send messages")
    p.add_argument("topic", help="topic to send to")
    body = p.add_mutually_exclusive_group()
    body.add_argument("--body", help="message body (UTF-8); - reads it from stdin")
    body.add_argument("--body-file", metavar="FILE", help="message body from FILE, as its bytes are (- for stdin)")
    body.add_argument("--count", type=int_in(1, 10**9), help="send this many generated messages")
    p.add_argument("--lines", action="store_true",
                   help="with --body/--body-file: one message per line (blank lines skipped) instead of the whole "
                        "input as one message")
    p.add_argument("--size", type=int_in(0, 64 << 20), default=1024, help="bytes per generated message (default 1024)")
    p.add_argument("--tag", default="", help="message tag")
    p.add_argument("--keys", default="", help="business keys, space separated")
    p.add_argument("--batch", type=int_in(1, 10_000), default=1,
                   help="messages per send with --count or --lines (default 1)")
    p.add_argument("--queue", type=QUEUE_ID, help="queue id (default: round-robin)")
    p.add_argument("--delay-level", type=int_in(0, 1000), default=0, help="deliver after this delay level")
    p.set_defaults(run=send)

    p = sub.add_parser("consume", parents=[common], help="print messages: a readable line each on a terminal, "
                                                         "JSON lines otherwise (or with --json)")
    p.add_argument("topic", help="topic to read")
    p.add_argument("--group", type=group_name,
                   help="consume as a push consumer of this group (commits as it goes)")
    p.add_argument("--from-offset", type=from_offset, default="earliest",
                   help="without --group: earliest | latest | N (0 to 2^63-1)")
    p.add_argument("--count", type=int_in(1, 10**12), help="stop after this many messages (default: until SIGINT/SIGTERM)")
    p.add_argument("--tag", default="*", help="tag expression, e.g. 'a || b'")
    p.add_argument("--from-where", choices=["last", "first", "timestamp"], default="last",
                   help="with --group: where a new group starts (default last)")
    p.add_argument("--readable", action="store_true",
                   help="a readable line per message even when stdout is not a terminal")
    p.add_argument("--max-body-bytes", type=int_in(0, 2**31), default=None, metavar="N",
                   help=f"show at most N bytes of each body, saying how many were cut (default "
                        f"{READABLE_MAX_BODY_BYTES} on readable lines, all with JSON; 0: all)")
    p.add_argument("--body-format", choices=BODY_FORMATS, default=None,
                   help="text (undecodable bytes and controls escaped as \\xNN), hex or base64 (default: text on "
                        "readable lines; with JSON UTF-8 when the body is, else base64)")
    p.set_defaults(run=consume)

    msg = sub.add_parser("message", help="look up messages")
    msub = msg.add_subparsers(dest="message_command", required=True, metavar="ACTION")
    p = msub.add_parser("get", parents=[common],
                        help="one message by msg id (--msg-id) or by queue position (--topic --queue --offset)")
    p.add_argument("--msg-id", metavar="ID",
                   help="the msg id a send printed (RocketMQ's queryMsgById); with --topic only that topic is "
                        "searched, else every topic; retry and dead-letter copies are shown too")
    p.add_argument("--topic", help="the queue's topic (with --msg-id: only search this topic)")
    p.add_argument("--queue", type=QUEUE_ID, help="queue id (without --msg-id)")
    p.add_argument("--offset", type=OFFSET, help="queue offset (without --msg-id)")
    p.add_argument("--broker-name", help="broker holding the queue (default: the only/first one)")
    p.set_defaults(run=message_get)
    p = msub.add_parser("search", parents=[common], help="messages with a key within a time range")
    p.add_argument("--topic", required=True, help="the topic to search")
    p.add_argument("--key", required=True, help="a message key (one of the keys the producer set)")
    p.add_argument("--begin", help="ISO time or epoch milliseconds (default: 24 h ago)")
    p.add_argument("--end", help="ISO time or epoch milliseconds (default: now)")
    p.add_argument("--max", type=int_in(1, 10_000), default=64, help="at most this many messages (default 64)")
    p.set_defaults(run=message_search)
    p = msub.add_parser("trace", parents=[common],
                        help="a message's journey: sent, stored where, consumed by which group and client, "
                             "retried, dead-lettered (and its trace id when it carries a traceparent)")
    p.add_argument("msg_id", metavar="MSG_ID", help="the msg id a send printed")
    p.add_argument("--topic", default="", help="the topic it was sent to (default: search every topic)")
    p.set_defaults(run=message_trace)


def parse_time_ms(text: str, option: str) -> int:
    """An ISO date/time (local time unless it has an offset), or epoch milliseconds as RocketMQ's tools take
    them (digits only: never read as an ISO basic date like 20261122)."""
    if text.isascii() and text.isdigit():
        if len(text) > 19 or int(text) > INT64_MAX:  # (a length check first: int() refuses 4,300 digits)
            shown = text if len(text) <= 25 else text[:20] + "..."
            raise InvalidArgumentError(f"{option}: {shown} is past the largest epoch milliseconds ({INT64_MAX})")
        return int(text)
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise InvalidArgumentError(f"{option}: {text!r} is not an ISO date/time like 2026-11-22T10:00:00 or epoch "
                                   f"milliseconds") from None


def _bodies(args: argparse.Namespace) -> list[bytes]:
    """The bodies to send from --body/--body-file (stdin for -): the whole input, or a line each with --lines."""
    if args.body is not None and args.body != "-":
        data = args.body.encode("utf-8")
    elif args.body == "-" or args.body_file == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            with open(args.body_file, "rb") as f:
                data = f.read()
        except OSError as e:
            raise InvalidArgumentError(f"--body-file {args.body_file}: {e.strerror or e}") from None
    if not args.lines:
        return [data]
    bodies = [line.rstrip(b"\r") for line in data.split(b"\n") if line.strip()]
    if not bodies:
        raise InvalidArgumentError("--lines: the input has no line to send (blank lines are skipped)")
    return bodies


def send(args: argparse.Namespace) -> int:
    if args.body is None and args.body_file is None and args.count is None:
        raise InvalidArgumentError("give --body TEXT, --body-file FILE or --count N")
    if args.lines and args.count is not None:
        raise InvalidArgumentError("--lines splits --body or --body-file into messages; it does not go with --count")
    bodies = None if args.count is not None else _bodies(args)  # read before connecting: a bad file fails fast
    with Producer(**client_kwargs(args), send_msg_timeout_s=args.timeout) as producer:
        # A queue the topic does not have is an input error; one whose master is down is an outage.
        queue = None if args.queue is None else producer.fetch_publish_message_queue(args.topic, args.queue)
        if bodies is not None:
            step = args.batch if args.lines else 1
            results = []
            for i in range(0, len(bodies), step):
                results.extend(producer.send_batch(
                    [Message(args.topic, body, tags=args.tag, keys=args.keys, delay_level=args.delay_level)
                     for body in bodies[i:i + step]], queue=queue))
            emit([{"msg_id": r.msg_id, "broker": r.message_queue.broker_name, "queue": r.message_queue.queue_id,
                   "offset": r.queue_offset} for r in results], ["msg_id", "broker", "queue", "offset"],
                 as_json=args.json)
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
    if args.json and args.readable:
        raise InvalidArgumentError("--json and --readable ask for different outputs; give one")
    args.show = _shower(args)
    return consume_group(args) if args.group else consume_plain(args)


def _shower(args: argparse.Namespace) -> Callable[[MessageExt], None]:
    """How consume prints a message: a readable line on a terminal (or with --readable), else a JSON line,
    so scripts and pipes keep the format they parse."""
    if args.readable or (not args.json and sys.stdout.isatty()):
        max_bytes = READABLE_MAX_BODY_BYTES if args.max_body_bytes is None else args.max_body_bytes
        body_format = args.body_format or "text"

        def line(m: MessageExt) -> None:
            sys.stdout.write(message_line(m, body_format=body_format, max_body_bytes=max_bytes) + "\n")
            sys.stdout.flush()
        return line
    max_bytes, body_format = args.max_body_bytes or 0, args.body_format
    return lambda m: print_line(message_json(m, body_format=body_format, max_body_bytes=max_bytes))


def _stop_event() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def consume_plain(args: argparse.Namespace) -> int:
    """Read every queue of the topic without a group, from --from-offset."""
    stop = _stop_event()
    names = Names(args.namespace)
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
                    args.show(names.bare_message(m))  # as a consumer of the namespace sees it (--group)
                    printed += 1
                    if args.count is not None and printed >= args.count:
                        return 0
            if idle:
                stop.wait(0.2)
    return 0


def _start(spec: str | int, low: int, high: int) -> int:
    """Where --from-offset (earliest, latest or an offset, checked by args.from_offset) starts a queue."""
    if spec == "earliest":
        return low
    if spec == "latest":
        return high
    return min(max(int(spec), low), high)


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
                    args.show(m)
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

    _check_may_consume(args)
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


def _check_may_consume(args: argparse.Namespace) -> None:
    """FailedPreconditionError when the brokers refuse the group's reads (consume_enable=false): its consumer
    would get nothing, and wait silently for ever."""
    try:
        with Admin(**client_kwargs(args)) as admin:
            config = admin.group_config(args.group)
    except TidemarkError:  # no config (a new group may consume), no broker yet, no right to read it: go on
        return
    if not config.consume_enable:
        raise FailedPreconditionError(f"group {args.group!r} has consume_enable=false: the brokers refuse its reads "
                                      f"(`tidemark group update {args.group} --consume-enable true --execute`)")


def _start_riding_out_outages(build: Callable[[], PushConsumer], stop: threading.Event) -> PushConsumer | None:
    """Start a consumer, trying again with backoff while no broker can be reached (it may be restarting);
    None when stopped first. Errors a retry cannot fix (an unknown topic, a bad group name) are raised.

    Once started, the consumer itself rides through broker restarts: fetch streams reopen with backoff,
    lost queues are locked again and resume from where this process got."""
    attempt = 0
    while not stop.is_set():
        consumer = build()
        try:
            return consumer.start()
        except TidemarkError as e:
            if not e.retriable:
                raise
            delay = START_RETRY.delay(attempt)
            print(f"tidemark: no broker answered ({e}); retrying in {delay:.1f}s", file=sys.stderr, flush=True)
        stop.wait(delay)
        attempt += 1
    return None


def _stop_at(consumer: PushConsumer, enough: threading.Event, context, done: int) -> ConsumeConcurrentlyStatus:
    """Suspend the consumer; the first `done` messages of this batch were printed, the rest stay."""
    consumer.suspend()
    enough.set()
    context.ack_index = done - 1
    return ConsumeConcurrentlyStatus.RECONSUME_LATER


def message_get(args: argparse.Namespace) -> int:
    if args.msg_id is not None:
        return _message_get_by_id(args)
    if args.topic is None or args.queue is None or args.offset is None:
        raise InvalidArgumentError("give --msg-id ID, or --topic, --queue and --offset")
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
        emit(message_fields(doc), ["field", "value"], as_json=False)
    return 0


def _message_get_by_id(args: argparse.Namespace) -> int:
    if args.queue is not None or args.offset is not None or args.broker_name:
        raise InvalidArgumentError("--msg-id finds the message itself: --queue, --offset and --broker-name "
                                   "do not apply")
    with Admin(**client_kwargs(args)) as admin:
        found = admin.query_message_by_id(args.msg_id, args.topic or "")
    for i, m in enumerate(found):
        doc = {**message_json(m), "stored_topic": m.topic}  # a retry or dead-letter copy's own topic
        if args.json:
            print_line(doc)
            continue
        if i:
            print()
        emit(message_fields(doc), ["field", "value"], as_json=False)
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


TRACE_COLUMNS = ["step", "time", "topic", "queue", "group", "client", "detail"]


def message_trace(args: argparse.Namespace) -> int:
    with Admin(**client_kwargs(args)) as admin:
        found = trace_message(admin, args.msg_id, args.topic)
    if args.json:
        print_line(found.to_json())
        return 0
    print(f"msg id {found.msg_id}  topic {found.topic}  trace id {found.trace_id or '- (no traceparent)'}")
    emit([{**asdict(s), "time": iso_ms(s.at_ms)} for s in found.steps], TRACE_COLUMNS, as_json=False)
    return 0
