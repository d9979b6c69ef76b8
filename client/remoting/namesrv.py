"""NameServerClient: asks the name servers (any one that answers) for routes and the cluster view.

The name servers are equal and unaware of each other (every broker registers
with each), so a question goes to the one that answered last and, when it
does not answer, to the next. Only when none answers is the call an
UnavailableError; BrokerCluster then keeps the routes it has.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import grpc

from tidemark.client.errors import (
    Status,
    TidemarkError,
    TlsHandshakeError,
    UnavailableError,
)
from tidemark.client.remoting import convert
from tidemark.client.remoting.rpc_errors import from_rpc_error
from tidemark.client.remoting.security import open_channel
from tidemark.client.security import TlsSettings
from tidemark.client.types import ClusterBroker, TopicRoute
from tidemark.common.auth import Credentials
from tidemark.v1 import admin_pb2, namesrv_pb2, namesrv_pb2_grpc

_CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 2_000),
                    ("grpc.use_local_subchannel_pool", 1))


class NameServerClient:
    def __init__(self, addresses: Sequence[str], *, timeout_s: float = 3.0, credentials: Credentials | None = None,
                 tls: TlsSettings | None = None) -> None:
        self.addresses = tuple(addresses)
        self._timeout = timeout_s
        self._tls = tls
        self._channels = [open_channel(a, options=_CHANNEL_OPTIONS, credentials=credentials, tls=tls)
                          for a in self.addresses]
        self._stubs = [namesrv_pb2_grpc.NameServerServiceStub(c) for c in self._channels]
        # Where the first question goes: spread over the name servers, so each adds read capacity.
        self._preferred = random.randrange(len(self.addresses)) if self.addresses else 0

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    async def route(self, topic: str) -> TopicRoute:
        """The topic's route (NotFoundError when no broker serves it; UnavailableError when no name
        server answers)."""
        return convert.topic_route(await self._ask("GetRoute", admin_pb2.GetRouteRequest(topic=topic)))

    async def cluster(self) -> list[ClusterBroker]:
        pb = await self._ask("GetClusterInfo", namesrv_pb2.GetClusterInfoRequest())
        return [ClusterBroker(b.cluster_name, b.broker_name, b.broker_id, b.address, b.version, b.readable,
                              b.writable, b.topic_count, b.last_update_ms, b.uptime_ms, b.replica_lag_bytes,
                              b.replica_lag_ms, tuple(b.in_sync_replicas)) for b in pb.brokers]

    async def _ask(self, method: str, request):
        """The first answer, starting at the name server that answered last; an answer that is an
        error (INVALID_ARGUMENT) is the answer, only an unreachable name server is skipped. NOT_FOUND
        asks the others too (a name server restarted a moment ago knows no broker yet), and is the
        answer when none knows better."""
        failures: list[TidemarkError] = []
        not_found: TidemarkError | None = None
        n = len(self._stubs)
        for i in range(n):
            k = (self._preferred + i) % n
            try:
                answer = await getattr(self._stubs[k], method)(request, timeout=self._timeout)
            except grpc.RpcError as e:
                error: TidemarkError = from_rpc_error(e, address=self.addresses[k], tls=self._tls is not None,
                                                      client_cert=bool(self._tls and self._tls.cert_file),
                                                      peer="name server")
                if e.code() is grpc.StatusCode.NOT_FOUND:
                    not_found = not_found or error
                    continue
                if not isinstance(error, UnavailableError) and e.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:
                    self._preferred = k
                    raise error from None
                failures.append(error)
                continue
            self._preferred = k
            return answer
        if not_found is not None:
            raise not_found
        # Every name server refused the handshake: a setting to fix, not an outage to wait out.
        kind = TlsHandshakeError if all(isinstance(f, TlsHandshakeError) for f in failures) else UnavailableError
        raise kind(f"no name server answers ({'; '.join(str(f) for f in failures)})",
                   code=Status.UNAVAILABLE)
