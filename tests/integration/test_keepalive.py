"""Idle connections stay up: the broker accepts the keepalive pings its clients send.

Issue 31: the console's connection (and an idle CLI consumer's) was dropped every couple of minutes with
GOAWAY ENHANCE_YOUR_CALM "too_many_pings": clients ping idle connections (every 30 s), the broker kept gRPC's
server default of one ping per 5 minutes without data. Here both sides are shortened by settings: the
client pings every 300 ms, and an idle server-streaming call (a membership watch is one) must outlive many
pings when the broker accepts them, and is dropped when it does not (what users saw).
"""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

CLIENT_PING_MS = 300


def idle_watch(address: str, seconds: float) -> grpc.RpcError:
    """How an idle health watch over a channel pinging every CLIENT_PING_MS ended (DEADLINE_EXCEEDED after
    `seconds` when nothing ended it before)."""
    channel = grpc.insecure_channel(address, options=[
        ("grpc.keepalive_time_ms", CLIENT_PING_MS), ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_time_between_pings_ms", CLIENT_PING_MS)])
    try:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=seconds)
        with pytest.raises(grpc.RpcError) as ended:
            for _ in watch:
                pass
        return ended.value
    finally:
        channel.close()


@pytest.mark.parametrize("accepted_ms, survives", [(200, True), (60_000, False)])
def test_an_idle_stream_survives_the_clients_keepalive_pings(broker_factory, accepted_ms, survives):
    broker = broker_factory(args=("--keepalive-min-interval-ms", str(accepted_ms)))
    error = idle_watch(broker.address, 4.0)
    if survives:
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, f"dropped: {error.code()} {error.details()}"
    else:
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "pings" in error.details().lower(), error.details()
