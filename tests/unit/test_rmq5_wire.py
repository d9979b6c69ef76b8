"""Tidemark's RocketMQ 5 wire messages (proto/tidemark/rmq5/v2/messaging.proto) against the official client's.

The official Python client (`rocketmq-python-client`, a test dependency) ships the protocol's generated
module. Its descriptors are read in a child process (the package sets up logging under ~/logs when it is
imported) and compared here as FileDescriptorProtos: every message and enum Tidemark declares must exist
upstream with the same fields (name, number, type, label, type name, proto3 presence) and values. That is
what makes the bytes the same on the wire.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest
from google.protobuf import descriptor_pb2

from tidemark.rmq5.v2 import messaging_pb2

_DUMP = """
import base64, json
from rocketmq.grpc_protocol import definition_pb2, service_pb2
print(json.dumps([base64.b64encode(m.DESCRIPTOR.serialized_pb).decode() for m in (definition_pb2, service_pb2)]))
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> dict[str, object]:
    """Upstream's messages and enums by simple name (names are unique across its two files)."""
    home = tmp_path_factory.mktemp("home")
    out = subprocess.run([sys.executable, "-c", _DUMP], capture_output=True, text=True, timeout=60, check=True,
                         env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
    found: dict[str, object] = {}
    for blob in json.loads(out.stdout.strip().splitlines()[-1]):
        f = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(blob))
        for m in f.message_type:
            found[m.name] = m
        for e in f.enum_type:
            found[e.name] = e
    return found


def ours() -> descriptor_pb2.FileDescriptorProto:
    f = descriptor_pb2.FileDescriptorProto()
    messaging_pb2.DESCRIPTOR.CopyToProto(f)
    return f


def _field_shape(field: descriptor_pb2.FieldDescriptorProto) -> tuple:
    # Type names are compared by their last part: the packages differ by design.
    return (field.name, field.number, field.type, field.label, field.type_name.rsplit(".", 1)[-1],
            field.proto3_optional, field.HasField("oneof_index"))


def _message_shape(m: descriptor_pb2.DescriptorProto) -> dict:
    return {
        "fields": sorted(_field_shape(f) for f in m.field),
        "oneofs": [o.name for o in m.oneof_decl],
        "nested": {n.name: _message_shape(n) for n in m.nested_type},
    }


def test_every_message_has_upstream_fields(upstream):
    mine = ours()
    assert len(mine.message_type) >= 50
    for m in mine.message_type:
        assert m.name in upstream, f"{m.name} is not a message of apache.rocketmq.v2"
        assert _message_shape(m) == _message_shape(upstream[m.name]), m.name


def test_every_enum_has_upstream_values(upstream):
    for e in ours().enum_type:
        assert e.name in upstream, e.name
        assert [(v.name, v.number) for v in e.value] == [(v.name, v.number) for v in upstream[e.name].value], e.name


def test_the_messages_of_every_served_method_are_declared(upstream):
    """Each method the broker serves takes and answers messages declared here."""
    from tidemark.broker.services.rmq5.service import METHODS

    declared = {m.name for m in ours().message_type}
    for method in METHODS:
        assert method.request.DESCRIPTOR.name in declared
        assert method.response.DESCRIPTOR.name in declared


def test_presence_survives_a_round_trip():
    """An explicitly zero optional field stays present, as the clients rely on (invisible_duration)."""
    request = messaging_pb2.ReceiveMessageRequest(batch_size=1)
    request.invisible_duration.SetInParent()
    again = messaging_pb2.ReceiveMessageRequest.FromString(request.SerializeToString())
    assert again.HasField("invisible_duration") and not again.HasField("long_polling_timeout")
