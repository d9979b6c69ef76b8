"""NameServerService: registrations in, routes and the cluster view out (a thin adapter over RouteTable)."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from tidemark.broker.namesrv.guard import RegistrationGuard
from tidemark.broker.namesrv.routes import Registration, RouteTable, TopicQueues
from tidemark.broker.services.errors import stateless_rpc
from tidemark.common.logs import get_logger
from tidemark.v1 import admin_pb2, namesrv_pb2, namesrv_pb2_grpc

log = get_logger("tidemark.namesrv")


def registration(pb: namesrv_pb2.BrokerRegistration) -> Registration:
    return Registration(
        cluster_name=pb.cluster_name, broker_name=pb.broker_name, broker_id=pb.broker_id, address=pb.address,
        version=pb.version, readable=pb.readable, writable=pb.writable, uptime_ms=pb.uptime_ms,
        replica_lag_bytes=max(0, pb.replica_lag_bytes), replica_lag_ms=max(0, pb.replica_lag_ms), epoch=pb.epoch,
        in_sync_replicas=tuple(sorted(set(pb.in_sync_replicas))),
        topics=tuple(TopicQueues(t.name, t.read_queue_nums, t.write_queue_nums, t.readable, t.writable)
                     for t in pb.topics))


class NameServerServicer(namesrv_pb2_grpc.NameServerServiceServicer):
    def __init__(self, table: RouteTable, clock_ms: Callable[[], int],
                 guard: RegistrationGuard | None = None) -> None:
        self._table = table
        self._clock_ms = clock_ms
        self._guard = guard or RegistrationGuard(None)

    def _check_signed(self, context: grpc.aio.ServicerContext) -> None:
        """Before a call changes the table: refused unless signed by the brokers' user (when one is set)."""
        if not self._guard.open:
            self._guard.check(dict(context.invocation_metadata() or ()))

    @stateless_rpc
    async def RegisterBroker(self, request, context: grpc.aio.ServicerContext):
        self._check_signed(context)
        r = registration(request.broker)
        if self._table.register(r, self._clock_ms()):
            log.info("broker registered", event="broker_registered", cluster=r.cluster_name, broker=r.broker_name,
                     broker_id=r.broker_id, addr=r.address, topics=len(r.topics))
        return namesrv_pb2.RegisterBrokerResponse(expiry_ms=self._table.expiry_ms,
                                                  master_epoch=self._table.master_epoch(r.broker_name))

    @stateless_rpc
    async def UnregisterBroker(self, request, context: grpc.aio.ServicerContext):
        self._check_signed(context)
        removed = self._table.unregister(request.broker_name, request.broker_id, request.address)
        if removed:
            log.info("broker unregistered", event="broker_unregistered", broker=request.broker_name,
                     broker_id=request.broker_id, addr=request.address)
        return namesrv_pb2.UnregisterBrokerResponse(removed=removed)

    @stateless_rpc
    async def GetRoute(self, request, context: grpc.aio.ServicerContext):
        return admin_pb2.TopicRoute(topic=request.topic, queue_datas=[admin_pb2.QueueData(
            broker_name=q.broker_name, broker_addr=q.address, read_queue_nums=q.read_queue_nums,
            write_queue_nums=q.write_queue_nums, readable=q.readable, writable=q.writable)
            for q in self._table.route(request.topic)])

    @stateless_rpc
    async def GetClusterInfo(self, request, context: grpc.aio.ServicerContext):
        return namesrv_pb2.ClusterInfo(brokers=[namesrv_pb2.RegisteredBroker(
            cluster_name=r.cluster_name, broker_name=r.broker_name, broker_id=r.broker_id, address=r.address,
            version=r.version, readable=r.readable, writable=r.writable, topic_count=b.user_topic_count,
            last_update_ms=b.last_update_ms, uptime_ms=r.uptime_ms, replica_lag_bytes=r.replica_lag_bytes,
            replica_lag_ms=r.replica_lag_ms, epoch=r.epoch, in_sync_replicas=r.in_sync_replicas)
            for b in self._table.brokers() for r in (b.registration,)])
