"""tidemark dlq list | requeue: the dead-letter queue %DLQ%<group>.

The DLQ is append-only like every topic: requeue sends a copy of a message to
its original topic (same msg id, reconsume count back to 0).
"""

from __future__ import annotations

import argparse

from client.admin import Admin
from client.cli.output import Progress, emit, iso_ms
from client.errors import InvalidArgumentError, NotFoundError
from client.message import Message, MessageExt
from client.producer.producer import Producer
from tidemark.protocol import PropertyKey, dlq_topic

# Properties the broker adds on the way to the DLQ; a requeued copy starts fresh.
_RETRY_PROPERTIES = (PropertyKey.RETRY_TOPIC, PropertyKey.ORIGIN_MESSAGE_ID, PropertyKey.MAX_RECONSUME_TIMES,
                     PropertyKey.RECONSUME_TIME, PropertyKey.REAL_TOPIC, PropertyKey.REAL_QID, PropertyKey.DELAY,
                     PropertyKey.DELIVER_TIMESTAMP)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    dlq = sub.add_parser("dlq", help="dead-letter queues")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    p = dsub.add_parser("list", parents=[common], help="messages in %%DLQ%%GROUP")
    p.add_argument("group")
    p.add_argument("--max", type=int, default=1000)
    p.set_defaults(run=list_dlq)
    p = dsub.add_parser("requeue", parents=[common], help="send DLQ messages back to their original topic")
    p.add_argument("group")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--msg-id")
    which.add_argument("--all", action="store_true")
    p.set_defaults(run=requeue)


def read_dlq(admin: Admin, group: str, limit: int) -> list[MessageExt]:
    topic = dlq_topic(group)
    try:
        mqs = admin.fetch_message_queues(topic)
    except NotFoundError:
        raise NotFoundError(f"group {group!r} has no dead-letter queue ({topic} does not exist)") from None
    out: list[MessageExt] = []
    for mq, (low, high) in admin.offsets(mqs).items():
        offset = low
        while offset < high and len(out) < limit:
            result = admin.pull(mq, offset, max_nums=64)
            out.extend(result.messages)
            if result.next_begin_offset <= offset:
                break
            offset = result.next_begin_offset
    return out[:limit]


def _preview(body: bytes) -> str:
    text = body[:40].decode("utf-8", "replace")
    return text + ("..." if len(body) > 40 else "")


def list_dlq(args: argparse.Namespace) -> int:
    with Admin(brokers=args.brokers, request_timeout_s=args.timeout) as admin:
        msgs = read_dlq(admin, args.group, args.max)
    rows = [{"msg_id": m.msg_id, "original_topic": m.origin_topic, "reconsume_times": m.reconsume_times,
             "broker": m.broker_name, "queue": m.queue_id, "offset": m.queue_offset,
             "stored": iso_ms(m.store_timestamp), "body": _preview(m.body)} for m in msgs]
    emit(rows, ["msg_id", "original_topic", "reconsume_times", "broker", "queue", "offset", "stored", "body"],
         as_json=args.json, footer=f"{len(rows)} message(s) in {dlq_topic(args.group)}")
    return 0


def requeue(args: argparse.Namespace) -> int:
    with Admin(brokers=args.brokers, request_timeout_s=args.timeout) as admin:
        msgs = read_dlq(admin, args.group, 1_000_000)
    if args.msg_id:
        msgs = [m for m in msgs if m.msg_id == args.msg_id]
        if not msgs:
            raise InvalidArgumentError(f"no message with msg id {args.msg_id} in {dlq_topic(args.group)}")
    rows = []
    progress = Progress(len(msgs), "requeue")
    with Producer(brokers=args.brokers, request_timeout_s=args.timeout) as producer:
        for i, m in enumerate(msgs, 1):
            props = {k: v for k, v in m.properties.items() if k not in _RETRY_PROPERTIES}
            props[PropertyKey.UNIQ_KEY] = m.msg_id
            result = producer.send(Message(m.origin_topic, m.body, tags=m.tags, keys=m.keys, properties=props))
            rows.append({"msg_id": m.msg_id, "topic": m.origin_topic, "broker": result.message_queue.broker_name,
                         "queue": result.message_queue.queue_id, "offset": result.queue_offset})
            progress.update(i)
    emit(rows, ["msg_id", "topic", "broker", "queue", "offset"], as_json=args.json,
         footer=f"{len(rows)} message(s) requeued")
    return 0
