"""tidemark transaction list: half messages waiting for their transaction's end, with the checks sent so far."""

from __future__ import annotations

import argparse
import time

from tidemark.client.admin import Admin
from tidemark.client.cli.connect import client_kwargs
from tidemark.client.cli.output import emit


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    transaction = sub.add_parser("transaction", help="transactional messages")
    tsub = transaction.add_subparsers(dest="transaction_command", required=True, metavar="ACTION")
    p = tsub.add_parser("list", parents=[common],
                        help="half messages not yet committed or rolled back, their age and the checks sent")
    p.add_argument("--group", default="", help="only this producer group's")
    p.set_defaults(run=list_transactions)


def list_transactions(args: argparse.Namespace) -> int:
    with Admin(**client_kwargs(args)).start() as a:
        halves = a.list_transactions(args.group)
    now = time.time_ns() // 1_000_000
    rows = [{"broker": h.broker_name, "msg_id": h.msg_id, "group": h.producer_group, "topic": h.topic,
             "half_offset": h.half_offset, "age_s": round(max(0, now - h.stored_ms) / 1000, 1), "checks": h.checks,
             "max_checks": h.max_checks, "next_check_in_s": round(max(0, h.next_check_ms - now) / 1000, 1)}
            for h in halves]
    emit(rows, ["broker", "msg_id", "group", "topic", "half_offset", "age_s", "checks", "max_checks",
                "next_check_in_s"], as_json=args.json)
    return 0
