"""OffsetService: commits (acknowledged and oneway-streamed), queries, reset and consume stats."""

from __future__ import annotations

import grpc

from tidemark.broker.controller import BrokerController
from tidemark.broker.errors import BrokerError, InvalidArgumentError
from tidemark.broker.operations import Commit, CommitTally, OffsetPolicy, ResetKind, ResetTarget
from tidemark.broker.services.convert import fence_from_pb, queue
from tidemark.broker.services.errors import rpc
from tidemark.v1 import offsets_pb2, offsets_pb2_grpc

_REJECT = {"FENCED": offsets_pb2.FENCED, "STALE_RESET_GENERATION": offsets_pb2.STALE_RESET_GENERATION,
           "INVALID": offsets_pb2.INVALID}


def _commit(pb) -> Commit:
    # (HasField first: reading an absent `fence` builds an empty message, a third of a stream commit's decoding)
    return Commit(pb.group, pb.topic, pb.queue_id, pb.offset,
                  fence_from_pb(pb.fence, True) if pb.HasField("fence") else None)


def _streamed_commit(pb) -> Commit:
    """One commit of a CommitOffsets message: a fence that does not decode makes it a rejected commit,
    not the end of the stream (the other commits apply, as the contract says)."""
    try:
        return _commit(pb)
    except BrokerError as e:
        return Commit(pb.group, pb.topic, pb.queue_id, pb.offset, invalid=str(e))


class OffsetServicer(offsets_pb2_grpc.OffsetServiceServicer):
    def __init__(self, broker: BrokerController) -> None:
        self._b = broker
        self._ops = broker.operations

    @rpc
    async def UpdateConsumerOffset(self, request, context: grpc.aio.ServicerContext):
        await self._ops.commit(_commit(request.commit))
        return offsets_pb2.UpdateConsumerOffsetResponse()

    @rpc
    async def CommitOffsets(self, request_iterator, context: grpc.aio.ServicerContext):
        tally = CommitTally()
        async for batch in request_iterator:
            tally.add(await self._ops.commit_batch(_streamed_commit(pb) for pb in batch.commits))
        return offsets_pb2.CommitOffsetsResponse(applied=tally.applied, rejected=tally.rejected, rejections=[
            offsets_pb2.RejectedCommit(
                commit=offsets_pb2.OffsetCommit(group=r.commit.group, topic=r.commit.topic,
                                                queue_id=r.commit.queue_id, offset=r.commit.offset),
                reason=_REJECT[r.reason.value], message=r.message)
            for r in tally.rejections])

    @rpc
    async def QueryConsumerOffset(self, request, context: grpc.aio.ServicerContext):
        offset, generation = self._ops.committed(request.group, request.topic, request.queue_id)
        return offsets_pb2.QueryConsumerOffsetResponse(offset=offset, reset_generation=generation)

    @rpc
    async def GetMinOffset(self, request, context: grpc.aio.ServicerContext):
        return offsets_pb2.OffsetResponse(
            offset=self._ops.queue_offset(request.topic, request.queue_id, OffsetPolicy.EARLIEST))

    @rpc
    async def GetMaxOffset(self, request, context: grpc.aio.ServicerContext):
        return offsets_pb2.OffsetResponse(
            offset=self._ops.queue_offset(request.topic, request.queue_id, OffsetPolicy.LATEST))

    @rpc
    async def SearchOffsetByTimestamp(self, request, context: grpc.aio.ServicerContext):
        return offsets_pb2.OffsetResponse(offset=self._ops.queue_offset(
            request.topic, request.queue_id, OffsetPolicy.TIMESTAMP, request.timestamp))

    @rpc
    async def ResetOffset(self, request, context: grpc.aio.ServicerContext):
        which = request.WhichOneof("target")
        if which is None:
            raise InvalidArgumentError("a reset needs a target: to_earliest, to_latest, timestamp, offset or shift_by")
        if which in ("to_earliest", "to_latest") and not getattr(request, which):
            raise InvalidArgumentError(f"{which} must be true when given")
        kind = {"to_earliest": ResetKind.EARLIEST, "to_latest": ResetKind.LATEST, "timestamp": ResetKind.TIMESTAMP,
                "offset": ResetKind.OFFSET, "shift_by": ResetKind.SHIFT_BY}[which]
        value = 0 if kind in (ResetKind.EARLIEST, ResetKind.LATEST) else getattr(request, which)
        queue_id = request.queue_id if request.HasField("queue_id") else None
        changes = await self._ops.reset_offsets(request.group, request.topic, queue_id, ResetTarget(kind, value),
                                                dry_run=request.dry_run)
        name = self._b.config.broker_name
        return offsets_pb2.ResetOffsetResponse(
            applied=not request.dry_run,
            changes=[offsets_pb2.QueueOffsetChange(queue=queue(c.topic, name, c.queue_id),
                                                   old_offset=c.old_offset, new_offset=c.new_offset)
                     for c in changes])

    @rpc
    async def GetConsumeStats(self, request, context: grpc.aio.ServicerContext):
        rows = self._ops.progress(request.group, request.topic or None)
        name = self._b.config.broker_name
        return offsets_pb2.GetConsumeStatsResponse(
            queues=[offsets_pb2.QueueStats(queue=queue(r.topic, name, r.queue_id), min_offset=r.min_offset,
                                           max_offset=r.max_offset, consumer_offset=r.consumer_offset,
                                           lag=r.lag, last_timestamp=r.last_timestamp) for r in rows],
            total_lag=sum(r.lag for r in rows))
