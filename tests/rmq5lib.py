"""A raw client of RocketMQ 5's protocol for tests: one callable per method of the broker's table
(broker/services/rmq5/service.py), with the metadata the official clients send."""

from __future__ import annotations

import uuid

import grpc

from tidemark.broker.services.rmq5.service import METHODS
from tidemark.rmq5.v2 import messaging_pb2 as pb


class Rmq5Stub:
    def __init__(self, channel: grpc.Channel, client_id: str | None = None) -> None:
        self.client_id = client_id or f"test@{uuid.uuid4().hex[:12]}"
        for m in METHODS:
            kind = {(False, False): channel.unary_unary, (False, True): channel.unary_stream,
                    (True, False): channel.stream_unary, (True, True): channel.stream_stream}[
                (m.request_streaming, m.response_streaming)]
            setattr(self, m.name, _WithMetadata(kind(m.path, request_serializer=m.request.SerializeToString,
                                                     response_deserializer=m.response.FromString), self))

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-mq-client-id", self.client_id), ("x-mq-language", "PYTHON"), ("x-mq-protocol", "GRPC_V2"),
                ("x-mq-request-id", uuid.uuid4().hex))


class _WithMetadata:
    def __init__(self, call, stub: Rmq5Stub) -> None:
        self._call = call
        self._stub = stub

    def __call__(self, request, timeout: float = 10, metadata=None):
        return self._call(request, timeout=timeout, metadata=metadata if metadata is not None else self._stub.metadata())


def resource(name: str) -> pb.Resource:
    return pb.Resource(name=name)


def message(topic: str, body: bytes, message_id: str | None = None, **system) -> pb.Message:
    sp = pb.SystemProperties(message_id=uuid.uuid4().hex if message_id is None else message_id, body_encoding=pb.IDENTITY,
                             message_type=system.pop("message_type", pb.NORMAL), **system)
    return pb.Message(topic=resource(topic), system_properties=sp, body=body)
