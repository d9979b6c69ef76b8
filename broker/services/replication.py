"""ReplicationService: a master's side of replication (broker/cluster/replication.py), a thin adapter."""

from __future__ import annotations

import contextlib

import grpc

from tidemark.broker.controller import BrokerController
from tidemark.broker.errors import BrokerError, FailedPreconditionError
from tidemark.broker.services.errors import replica_rpc, status_for
from tidemark.broker.services.streams import ends_last, write
from tidemark.common.logs import get_logger
from tidemark.v1 import replication_pb2, replication_pb2_grpc

log = get_logger("tidemark.broker.cluster.replication")


class ReplicationServicer(replication_pb2_grpc.ReplicationServiceServicer):
    def __init__(self, broker: BrokerController) -> None:
        self._b = broker

    def _source(self):
        if self._b.replication is None:
            raise FailedPreconditionError(f"broker {self._b.config.broker_name} here is a replica (id "
                                          f"{self._b.config.broker_id}); replicas follow its master "
                                          f"{self._b.config.master}")
        return self._b.replication

    @ends_last  # a stop lets it copy the log's end and answer sync replication's waits first
    async def Replicate(self, request_iterator, context: grpc.aio.ServicerContext) -> None:
        """A replica's copy of the log. A coroutine that writes its chunks (services/streams.py says why) and
        closes the master's side of the stream, whose task reads the replica's acknowledgements, before it
        returns, however the stream ends."""
        try:
            chunks = self._source().serve(request_iterator, context.peer() or "")
        except BrokerError as e:
            await context.abort(status_for(e), str(e))
        async with contextlib.aclosing(chunks):
            try:
                async for chunk in chunks:
                    await write(context, chunk)
            except BrokerError as e:
                await context.abort(status_for(e), str(e))

    @replica_rpc
    async def GetMetadata(self, request, context: grpc.aio.ServicerContext):
        self._source()
        return self._b.operations.replica_metadata()

    @replica_rpc
    async def HandBackOffsets(self, request, context: grpc.aio.ServicerContext):
        self._source()
        moved = self._b.operations.take_back_offsets(request.offsets_json)
        log.info("offsets handed back by a replica", event="offsets_handed_back", entries=moved,
                 peer=context.peer())  # once per replica connection
        return replication_pb2.HandBackOffsetsResponse(advanced=moved)
