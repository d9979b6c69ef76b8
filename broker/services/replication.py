"""ReplicationService: a master's side of replication (broker/replication.py), a thin adapter."""

from __future__ import annotations

import grpc

from broker.controller import BrokerController
from broker.errors import BrokerError, FailedPreconditionError
from broker.services.errors import rpc, status_for
from tidemark.v1 import replication_pb2_grpc


class ReplicationServicer(replication_pb2_grpc.ReplicationServiceServicer):
    def __init__(self, broker: BrokerController) -> None:
        self._b = broker

    def _source(self):
        if self._b.replication is None:
            raise FailedPreconditionError(f"broker {self._b.config.broker_name} here is a replica (id "
                                          f"{self._b.config.broker_id}); replicas follow its master "
                                          f"{self._b.config.master}")
        return self._b.replication

    async def Replicate(self, request_iterator, context: grpc.aio.ServicerContext):
        try:
            async for chunk in self._source().serve(request_iterator, context.peer() or ""):
                yield chunk
        except BrokerError as e:
            await context.abort(status_for(e), str(e))

    @rpc
    async def GetMetadata(self, request, context: grpc.aio.ServicerContext):
        b = self._b
        return self._source().metadata(b.topics, b.groups, b.offsets)
