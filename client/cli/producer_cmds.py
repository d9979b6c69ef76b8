"""tidemark producer list: the idempotent producers each broker remembers, and where they stand per queue."""

from __future__ import annotations

import argparse
import time

from tidemark.client.admin import Admin
from tidemark.client.cli.connect import client_kwargs
from tidemark.client.cli.output import emit


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    producer = sub.add_parser("producer", help="idempotent producers")
    psub = producer.add_subparsers(dest="producer_command", required=True, metavar="ACTION")
    p = psub.add_parser("list", parents=[common],
                        help="producer ids, keys and the last sequence stored per queue (a retried batch at or "
                             "below it is answered as a duplicate)")
    p.add_argument("--topic", default="", help="only producers that wrote to this topic")
    p.set_defaults(run=list_producers)


def list_producers(args: argparse.Namespace) -> int:
    with Admin(**client_kwargs(args)).start() as a:
        producers = a.list_producers(args.topic)
    now = time.time_ns() // 1_000_000
    rows = [{"broker": p.broker_name, "producer_id": p.producer_id, "key": p.key,
             "idle_s": round(max(0, now - p.last_active_ms) / 1000, 1),
             "topic": q.topic if q else None, "queue": q.queue_id if q else None,
             "epoch": q.epoch if q else None, "last_sequence": q.last_sequence if q else None,
             "last_offset": q.last_offset if q else None}
            for p in producers for q in (p.queues or (None,))]
    emit(rows, ["broker", "producer_id", "key", "idle_s", "topic", "queue", "epoch", "last_sequence", "last_offset"],
         as_json=args.json)
    return 0
