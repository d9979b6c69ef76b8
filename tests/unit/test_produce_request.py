"""client/remoting/streams.py produce_request: the Produce stream's requests, written with their records
appended by hand, parse as the ProduceRequest protobuf builds from the same values."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemark.client.remoting.streams import produce_request
from tidemark.v1 import messaging_pb2

_U64 = st.integers(0, 2**64 - 1)
_I32 = st.integers(-(2**31), 2**31 - 1)
_I64 = st.integers(-(2**63), 2**63 - 1)
# Record lengths around every varint width's edge (1 to 3 bytes of length), and small random ones.
_RECORDS = st.one_of(st.binary(max_size=300),
                     st.sampled_from([127, 128, 16_383, 16_384, 1 << 20]).map(lambda n: bytes(range(256)) * (n // 256)
                                                                             + bytes(n % 256)))


def built(request_id, topic, queue_id, count, records, sequence) -> messaging_pb2.ProduceRequest:
    pb = messaging_pb2.ProduceRequest(request_id=request_id, topic=topic, queue_id=queue_id, count=count,
                                      records=records)
    if sequence is not None:
        pb.producer_id, pb.producer_epoch, pb.base_sequence = sequence
        pb.sequence_gaps = True
    return pb


@given(_U64, st.text(max_size=40), _I32, _I32, _RECORDS, st.none() | st.tuples(_I64, _I64, _I64),
       st.booleans())
def test_parses_as_the_message_protobuf_builds(request_id, topic, queue_id, count, records, sequence, as_view):
    data = memoryview(bytearray(b"\xff" + records + b"\xff"))[1:-1] if as_view else records
    wire = produce_request(request_id, topic, queue_id, count, data, sequence)
    assert messaging_pb2.ProduceRequest.FromString(wire) == built(request_id, topic, queue_id, count, records,
                                                                 sequence)


def test_records_are_the_requests_last_bytes():
    """The records are copied once, as they are, after protobuf's bytes of the other fields."""
    records = bytes(range(256)) * 600  # 153,600 bytes: a 3-byte length
    wire = produce_request(7, "orders", 3, 600, records, (11, 2, 4_800))
    assert wire.endswith(records)
    assert len(wire) == len(built(7, "orders", 3, 600, records, (11, 2, 4_800)).SerializeToString())
