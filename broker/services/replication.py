"""ReplicationService: a master's side of replication (broker/replication.py), a thin adapter."""

from __future__ import annotations

import grpc

from tidemark.broker.controller import BrokerController
from tidemark.broker.errors import BrokerError, FailedPreconditionError
from tidemark.broker.replication import decode_offsets
from tidemark.broker.services.errors import rpc, status_for
from tidemark.logs import get_logger
from tidemark.v1 import replication_pb2, replication_pb2_grpc

log = get_logger("tidemark.broker.replication")


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
        return self._source().metadata(b.topics, b.groups, b.offsets, b.schedule, b.pop)

    @rpc
    async def HandBackOffsets(self, request, context: grpc.aio.ServicerContext):
        self._source()
        offsets = decode_offsets(request.offsets_json)
        moved = self._b.commits.take_back(offsets.table, offsets.reset_generations)
        log.info("offsets handed back by a replica", event="offsets_handed_back", entries=moved,
                 peer=context.peer())  # once per replica connection
        return replication_pb2.HandBackOffsetsResponse(advanced=moved)
