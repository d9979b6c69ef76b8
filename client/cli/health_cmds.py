"""tidemark health: the gRPC health check of each broker (the container healthcheck)."""

from __future__ import annotations

import argparse

from tidemark.client.cli.output import emit
from tidemark.client.remoting.health import check


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("health", parents=[common], help="exit 0 when every broker (with --namesrv: every name "
                                                        "server) reports SERVING")
    p.set_defaults(run=health)


def health(args: argparse.Namespace) -> int:
    kind = "broker" if args.brokers else "namesrv"
    rows = [{kind: address, "status": check(address, args.timeout, credentials=args.credentials, tls=args.tls)}
            for address in args.brokers or args.namesrv]
    emit(rows, [kind, "status"], as_json=args.json)
    return 0 if all(r["status"] == "SERVING" for r in rows) else 1
