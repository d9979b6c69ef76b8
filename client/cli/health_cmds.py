"""tidemark health: the gRPC health check of each broker (the container healthcheck)."""

from __future__ import annotations

import argparse

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from client.cli.output import emit
from client.remoting.security import open_sync_channel
from client.security import TlsSettings
from tidemark.auth import Credentials, signed_metadata


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("health", parents=[common], help="exit 0 when every broker (with --namesrv: every name "
                                                        "server) reports SERVING")
    p.set_defaults(run=health)


def check(address: str, timeout: float, *, credentials: Credentials | None = None,
          tls: TlsSettings | None = None) -> str:
    metadata = signed_metadata(credentials) if credentials is not None else None
    with open_sync_channel(address, tls=tls) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                               timeout=timeout, metadata=metadata)
        except grpc.RpcError as e:
            return f"UNREACHABLE ({e.code().name})"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def health(args: argparse.Namespace) -> int:
    kind = "broker" if args.brokers else "namesrv"
    rows = [{kind: address, "status": check(address, args.timeout, credentials=args.credentials, tls=args.tls)}
            for address in args.brokers or args.namesrv]
    emit(rows, [kind, "status"], as_json=args.json)
    return 0 if all(r["status"] == "SERVING" for r in rows) else 1
