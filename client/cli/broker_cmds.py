"""tidemark broker promote: make a replica the master of its broker name.

`tidemark broker` itself runs the daemon (broker/app.py); `tidemark broker promote` is routed here
by main() before the daemon's parser sees it.
"""

from __future__ import annotations

import argparse

from client.admin import Admin
from client.cli.connect import client_kwargs
from client.cli.output import emit


def build_parser(common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidemark broker promote", parents=[common],
        description="Make the replica at --broker the master of its broker name with a new epoch. Producers "
                    "write to it from then on; the old master, when it comes back, is refused by the name "
                    "servers and takes no writes. The role survives restarts (config/role.json).")
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
