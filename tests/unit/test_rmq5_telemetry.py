"""A Telemetry stream that never says who it is is closed with INVALID_ARGUMENT (the broker does not keep
silent streams forever). An in-process broker, so the 30 s limit can be shortened for the test."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tidemark.broker.config import BrokerConfig
from tidemark.broker.server import BrokerServer
from tidemark.broker.services.rmq5 import service
from tidemark.rmq5.v2 import messaging_pb2 as pb


def test_a_telemetry_stream_without_settings_is_closed(tmp_path, monkeypatch):
    monkeypatch.setattr(service, "SETTINGS_TIMEOUT_S", 0.3)

    async def main() -> None:
        server = BrokerServer(BrokerConfig(data_dir=tmp_path, host="127.0.0.1", port=0))
        port = await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                telemetry = channel.stream_stream(f"/{service.SERVICE}/Telemetry",
                                                  request_serializer=pb.TelemetryCommand.SerializeToString,
                                                  response_deserializer=pb.TelemetryCommand.FromString)

                async def silent():
                    await asyncio.Event().wait()  # the stream stays open and sends nothing
                    yield pb.TelemetryCommand()

                with pytest.raises(grpc.aio.AioRpcError) as e:
                    async for _ in telemetry(silent(), metadata=(("x-mq-client-id", "127.0.0.1@silent"),),
                                             timeout=10):
                        pass
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "no settings" in e.value.details()
        finally:
            await server.stop(0)

    asyncio.run(main())
