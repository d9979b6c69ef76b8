"""tidemark cluster list: the brokers the name servers know (or the --broker list), with their roles."""

from __future__ import annotations

import argparse
import time

from tidemark.client.admin import Admin
from tidemark.client.cli.connect import client_kwargs
from tidemark.client.cli.output import emit


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    cluster = sub.add_parser("cluster", help="brokers of the cluster")
    csub = cluster.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")
    p = csub.add_parser("list", parents=[common], help="broker groups, roles, addresses, versions and the last "
                                                      "registration at the name servers")
    p.set_defaults(run=list_brokers)


def list_brokers(args: argparse.Namespace) -> int:
    with Admin(**client_kwargs(args)).start() as a:
        brokers = a.cluster_list()
    now = time.time_ns() // 1_000_000
    rows = [{"cluster": b.cluster_name, "broker": b.broker_name, "id": b.broker_id, "role": b.role,
             "address": b.address, "version": b.version,
             "perm": ("R" if b.readable else "-") + ("W" if b.writable else "-"), "topics": b.topic_count,
             "uptime_s": None if b.uptime_ms is None else round(b.uptime_ms / 1000),
             "registered_ago_s": round((now - b.last_update_ms) / 1000, 1) if b.last_update_ms else None,
             "lag_bytes": b.replica_lag_bytes if b.broker_id else None,
             "lag_ms": b.replica_lag_ms if b.broker_id else None,
             "in_sync": None if b.broker_id or not b.last_update_ms else list(b.in_sync_replicas)}
            for b in brokers]
    emit(rows, ["cluster", "broker", "id", "role", "address", "version", "perm", "topics", "uptime_s",
                "registered_ago_s", "lag_bytes", "lag_ms", "in_sync"], as_json=args.json)
    return 0
