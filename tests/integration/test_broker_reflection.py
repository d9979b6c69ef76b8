"""gRPC server reflection and health: generic tools (grpcurl, grpc_cli) can discover the API."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)


def test_reflection_lists_every_service_and_resolves_their_methods(broker):
    with grpc.insecure_channel(broker.address) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        assert {"tidemark.v1.MessagingService", "tidemark.v1.OffsetService", "tidemark.v1.MembershipService",
                "tidemark.v1.AdminService", "grpc.health.v1.Health"} <= services
        pull = db.FindFileContainingSymbol("tidemark.v1.MessagingService")
        assert "tidemark/v1/messaging.proto" == pull.name
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "tidemark.v1.OffsetService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
