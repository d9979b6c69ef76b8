"""The gRPC health check of one broker or name server, as container healthchecks and the console ask it."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tidemark.client.remoting.security import open_sync_channel
from tidemark.client.security import TlsSettings
from tidemark.common.auth import Credentials, signed_metadata


def check(address: str, timeout: float, *, credentials: Credentials | None = None,
          tls: TlsSettings | None = None) -> str:
    """SERVING, NOT_SERVING (a broker that is starting, stopping or fenced), or UNREACHABLE (CODE)."""
    metadata = signed_metadata(credentials) if credentials is not None else None
    with open_sync_channel(address, tls=tls) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                               timeout=timeout, metadata=metadata)
        except grpc.RpcError as e:
            return f"UNREACHABLE ({e.code().name})"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
