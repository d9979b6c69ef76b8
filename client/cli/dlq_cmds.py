"""tidemark dlq list | requeue: the dead-letter queue %DLQ%<group> (rules in tidemark.client.dead_letters).

`dlq requeue` is a dry run unless --execute, as every changing command: it lists what it would send."""

from __future__ import annotations

import argparse

from tidemark.client.admin import Admin
from tidemark.client.cli.args import int_in
from tidemark.client.cli.connect import client_kwargs
from tidemark.client.cli.output import DRY_RUN, emit, iso_ms
from tidemark.client.namespacing import Names
from tidemark.common.protocol import dlq_topic


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    dlq = sub.add_parser("dlq", help="dead-letter queues")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    p = dsub.add_parser("list", parents=[common], help="messages in %%DLQ%%GROUP")
    p.add_argument("group", help="consumer group whose dead letters to list")
    p.add_argument("--max", type=int_in(1, 100_000), default=1000, help="list at most this many (default 1000)")
    p.set_defaults(run=list_dlq)
    # A description is printed as written (only help strings are %-formatted): one % each.
    p = dsub.add_parser("requeue", parents=[common],
                        help="send DLQ messages back to their original topic (dry run unless --execute)",
                        description="Send dead letters back to their original topic (without --execute: list "
                                    "what would be sent). The group's offset on %DLQ%GROUP marks what was "
                                    "requeued: --all sends only the messages no earlier requeue sent (`tidemark "
                                    "group reset-offset GROUP --topic %DLQ%GROUP --to-earliest --execute` makes "
                                    "every one eligible again).")
    p.add_argument("group", help="consumer group whose dead letters to requeue")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--msg-id", help="requeue this message (even if it was requeued before)")
    which.add_argument("--all", action="store_true", help="requeue every message not requeued yet")
    p.add_argument("--execute", action="store_true", help="send them (default: only list them)")
    p.set_defaults(run=requeue)


def _preview(body: bytes) -> str:
    text = body[:40].decode("utf-8", "replace")
    return text + ("..." if len(body) > 40 else "")


def list_dlq(args: argparse.Namespace) -> int:
    with Admin(**client_kwargs(args)) as admin:
        msgs = admin.dead_letters(args.group, args.max)
    rows = [{"msg_id": m.msg_id, "original_topic": m.origin_topic, "reconsume_times": m.reconsume_times,
             "broker": m.broker_name, "queue": m.queue_id, "offset": m.queue_offset,
             "stored": iso_ms(m.store_timestamp), "body": _preview(m.body)} for m in msgs]
    emit(rows, ["msg_id", "original_topic", "reconsume_times", "broker", "queue", "offset", "stored", "body"],
         as_json=args.json, footer=f"{len(rows)} message(s) in {dlq_topic(Names(args.namespace).group(args.group))}")
    return 0


def requeue(args: argparse.Namespace) -> int:
    with Admin(**client_kwargs(args)) as admin:
        done = admin.requeue_dead_letters(args.group, args.msg_id if not args.all else None,
                                          dry_run=not args.execute)
    if not args.execute:
        # Where each waits in the DLQ, and the topic it would go back to.
        emit([{"msg_id": r.msg_id, "topic": r.topic, "dlq_broker": r.queue.broker_name,
               "dlq_queue": r.queue.queue_id, "dlq_offset": r.queue_offset} for r in done],
             ["msg_id", "topic", "dlq_broker", "dlq_queue", "dlq_offset"], as_json=args.json,
             footer=f"{len(done)} message(s) to requeue; {DRY_RUN}")
        return 0
    rows = [{"msg_id": r.msg_id, "topic": r.topic, "broker": r.queue.broker_name, "queue": r.queue.queue_id,
             "offset": r.queue_offset} for r in done]
    emit(rows, ["msg_id", "topic", "broker", "queue", "offset"], as_json=args.json,
         footer=f"{len(rows)} message(s) requeued")
    return 0
