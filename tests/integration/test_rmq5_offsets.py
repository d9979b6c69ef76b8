"""RocketMQ 5's queue-offset RPCs (the Java PullConsumer's PullMessage, UpdateOffset, GetOffset,
QueryOffset) on the broker's offset manager: what one API commits, the other reads."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from rmq5lib import Rmq5Stub, resource
from workload import create_topic, produce

from tidemark.client import Admin, MessageQueue
from tidemark.rmq5.v2 import messaging_pb2 as pb


@pytest.fixture
def stub(broker):
    create_topic(broker.address, "V2Pull", 2)
    produce(broker.address, "V2Pull", 20, batch=10, tags="T")  # 10 per queue
    channel = grpc.insecure_channel(broker.address)
    yield Rmq5Stub(channel)
    channel.close()


def _queue(queue_id: int) -> pb.MessageQueue:
    return pb.MessageQueue(topic=resource("V2Pull"), id=queue_id)


def test_pull_reads_from_an_offset_and_says_where_to_go_on(stub):
    answers = list(stub.PullMessage(pb.PullMessageRequest(
        group=resource("v2-pull"), message_queue=_queue(0), offset=3, batch_size=4,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))))
    assert answers[0].status.code == pb.OK
    messages = [a.message for a in answers if a.HasField("message")]
    assert [m.system_properties.queue_offset for m in messages] == [3, 4, 5, 6]
    assert messages[0].system_properties.tag == "T"
    assert answers[-1].next_offset == 7


def test_pull_at_the_end_finds_nothing_and_outside_the_queue_is_illegal(stub):
    at_end = list(stub.PullMessage(pb.PullMessageRequest(group=resource("v2-pull"), message_queue=_queue(0),
                                                         offset=10, batch_size=4,
                                                         long_polling_timeout=Duration(nanos=100_000_000))))
    assert at_end[0].status.code == pb.MESSAGE_NOT_FOUND and at_end[-1].next_offset == 10
    beyond = list(stub.PullMessage(pb.PullMessageRequest(group=resource("v2-pull"), message_queue=_queue(0),
                                                         offset=50, batch_size=4)))
    assert beyond[0].status.code == pb.ILLEGAL_OFFSET


def test_update_offset_is_the_groups_committed_offset(broker, stub):
    group = resource("v2-offsets")
    assert stub.GetOffset(pb.GetOffsetRequest(group=group, message_queue=_queue(1))).status.code == pb.OFFSET_NOT_FOUND
    assert stub.UpdateOffset(pb.UpdateOffsetRequest(group=group, message_queue=_queue(1), offset=7)).status.code == pb.OK
    assert stub.GetOffset(pb.GetOffsetRequest(group=group, message_queue=_queue(1))).offset == 7
    with Admin(brokers=broker.address) as admin:
        assert admin.committed("v2-offsets", MessageQueue("V2Pull", "broker-a", 1)) == 7
    bad = stub.UpdateOffset(pb.UpdateOffsetRequest(group=group, message_queue=_queue(1), offset=99))
    assert bad.status.code == pb.BAD_REQUEST
    assert stub.GetOffset(pb.GetOffsetRequest(group=group, message_queue=_queue(1))).offset == 7


def test_query_offset_by_policy(stub):
    def query(policy, **kw) -> int:
        answer = stub.QueryOffset(pb.QueryOffsetRequest(message_queue=_queue(0), query_offset_policy=policy, **kw))
        assert answer.status.code == pb.OK, answer.status
        return answer.offset

    assert (query(pb.BEGINNING), query(pb.END)) == (0, 10)
    from google.protobuf.timestamp_pb2 import Timestamp
    assert query(pb.TIMESTAMP, timestamp=Timestamp(seconds=1)) == 0
    unknown = stub.QueryOffset(pb.QueryOffsetRequest(message_queue=pb.MessageQueue(topic=resource("Nope"))))
    assert unknown.status.code == pb.TOPIC_NOT_FOUND
