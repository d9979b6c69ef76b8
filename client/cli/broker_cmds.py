"""tidemark broker promote | status: client commands about brokers.

`tidemark broker` itself runs the daemon (broker/app.py); `tidemark broker promote` and `tidemark broker
status` are routed here by main() before the daemon's parser sees them.
"""

from __future__ import annotations

import argparse

from tidemark.client.admin import Admin
from tidemark.client.cli.args import Parser
from tidemark.client.cli.connect import client_kwargs
from tidemark.client.cli.output import emit


def build_parser(common: argparse.ArgumentParser, command: str = "promote") -> argparse.ArgumentParser:
    if command == "status":
        parser = Parser(
            prog="tidemark broker status", parents=[common],
            description="Every broker's version, uptime, store size on disk, flush mode, replication role, "
                        "connected consumer clients and fetch streams, topic and group counts (RocketMQ's "
                        "brokerStatus).")
        parser.set_defaults(run=status)
        return parser
    parser = Parser(
        prog="tidemark broker promote", parents=[common],
        description="Make the replica at --broker the master of its broker name with a new epoch. Producers "
                    "write to it from then on; the old master, when it comes back, is refused by the name "
                    "servers and takes no writes. The role survives restarts (config/role.json). In controller "
                    "mode (--controller) a planned switchover: the master stops taking writes, waits until the "
                    "replica holds everything, and hands it the mastership through etcd; the old master "
                    "follows it (docs/operations.md).")
    parser.set_defaults(run=promote)
    return parser


def promote(args: argparse.Namespace) -> int:
    if len(args.brokers) != 1:
        raise SystemExit("tidemark broker promote: give the replica's address with --broker HOST:PORT")
    kwargs = {**client_kwargs(args), "namesrv": ()}  # the replica itself, not what name servers route to
    with Admin(**kwargs).start() as a:
        info = a.promote(args.brokers[0])
    emit([{"broker": info.broker_name, "id": info.broker_id, "address": info.broker_addr, "epoch": info.epoch,
           "perm": ("R" if info.readable else "-") + ("W" if info.writable else "-")}],
         ["broker", "id", "address", "epoch", "perm"], as_json=args.json)
    return 0


def _duration(ms: int) -> str:
    s = ms // 1000
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    return (f"{days}d" if days else "") + f"{hours:02d}:{minutes:02d}:{s:02d}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def status(args: argparse.Namespace) -> int:
    with Admin(**client_kwargs(args)).start() as a:
        found = a.broker_status()
    if args.json:
        emit([{name: getattr(s, name) for name in s.__slots__} for s in found], [], as_json=True)
        return 0
    rows = [{"broker": s.broker_name, "id": s.broker_id, "address": s.broker_addr, "version": s.version,
             "uptime": _duration(s.uptime_ms), "store": _size(s.store_size_bytes), "flush": s.flush_mode,
             "role": s.role.lower() + (f" of {s.master_addr}" if s.master_addr else
                                       f" ({s.replication_mode}, {s.replicas} replica(s), in sync: "
                                       f"{','.join(map(str, s.in_sync_replicas)) or 'none'})"),
             "clients": s.consumer_clients, "fetch_streams": s.fetch_streams, "topics": s.topics,
             "groups": s.groups, "perm": ("R" if s.readable else "-") + ("W" if s.writable else "-")}
            for s in found]
    emit(rows, ["broker", "id", "address", "version", "uptime", "store", "flush", "role", "clients", "fetch_streams",
                "topics", "groups", "perm"], as_json=False)
    return 0
