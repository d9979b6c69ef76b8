"""Properties that steer how a message is stored (broker/ingest/steering.py), against a real broker: a
record batch that carries a delay level or a transaction's half is refused with the record named, not
stored as plain messages delivered at once; RocketMQ 4's DELAY property sent by the producer delays the
message as its delay_level would."""

from __future__ import annotations

import time

import grpc
from brokerproc import BrokerStubs
from workload import create_topic, wait_until

from tidemark.client import Message, Producer
from tidemark.common.protocol import tag_hash
from tidemark.common.records import RecordBatchBuilder, encode_properties
from tidemark.v1 import messaging_pb2, offsets_pb2


def batch(*properties: dict[str, str]) -> bytes:
    b = RecordBatchBuilder("S", "h")
    for i, extra in enumerate(properties):
        b.append(b"body-%d" % i, encode_properties({"UNIQ_KEY": f"ID{i}", **extra}), tags_code=tag_hash(""))
    return bytes(b.buffer)


def max_offset(stubs: BrokerStubs, topic: str, queue_id: int) -> int:
    return stubs.offsets.GetMaxOffset(offsets_pb2.QueueRequest(topic=topic, queue_id=queue_id), timeout=10).offset


def test_a_record_batch_that_carries_a_delay_or_a_half_is_refused_whole(broker):
    create_topic(broker.address, "S", 1)
    ahead, past = str(int(time.time() * 1000) + 3_600_000), str(int(time.time() * 1000) - 60_000)
    cases = [  # (records' extra properties, the property named in the refusal or "" when stored)
        (({}, {"DELAY": "2"}, {}), "record 1 of the batch sets DELAY"),
        (({"TRAN_MSG": "true"},), "record 0 of the batch sets TRAN_MSG"),
        (({"TRAN_MSG": "TRUE"}, {"DELAY": "3"}), "record 0 of the batch sets TRAN_MSG"),
        (({}, {"DELIVER_TIMESTAMP": ahead}), "record 1 of the batch sets DELIVER_TIMESTAMP"),
        (({"DELAY": "0"}, {"TRAN_MSG": "false"}, {"XDELAY": "4"}), ""),  # no delay, no half: plain
        (({"DELIVER_TIMESTAMP": past},), ""),  # a delivered timed message copied: due, stored as it came
    ]
    with BrokerStubs(broker.address) as stubs:
        requests = [messaging_pb2.ProduceRequest(request_id=i + 1, topic="S", queue_id=0, count=len(props),
                                                 records=batch(*props))
                    for i, (props, _) in enumerate(cases)]
        answers = list(stubs.messaging.Produce(iter(requests), timeout=10))
        for (props, refusal), answer in zip(cases, answers, strict=True):
            if refusal:
                assert answer.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], (props, answer)
                assert refusal in answer.error and "SendMessage" in answer.error, answer.error
            else:
                assert answer.code == 0, answer
        assert [a.first_queue_offset for a in answers if not a.code] == [0, 3]
        assert max_offset(stubs, "S", 0) == 4  # the plain batches alone


def test_the_delay_property_delays_a_message_as_its_delay_level_would(broker):
    create_topic(broker.address, "S", 1)
    with Producer(brokers=broker.address) as producer, BrokerStubs(broker.address) as stubs:
        producer.send(Message("S", b"later", properties={"DELAY": "1"}))  # RocketMQ 4's setDelayTimeLevel(1)
        assert max_offset(stubs, "S", 0) == 0  # held by the schedule, not stored plain
        producer.send(Message("S", b"now"))
        assert max_offset(stubs, "S", 0) == 1
        wait_until(lambda: max_offset(stubs, "S", 0) == 2, 30, "the delayed message (level 1: 1 s)")


def test_the_deliver_timestamp_property_holds_a_message_until_then(broker):
    """A message carrying DELIVER_TIMESTAMP (the property a timed message keeps) is due then, as a send's
    delivery time would say, whichever call the producer picks for it."""
    create_topic(broker.address, "T", 1)
    with Producer(brokers=broker.address) as producer, BrokerStubs(broker.address) as stubs:
        due = int(time.time() * 1000) + 1_500
        producer.send(Message("T", b"later", properties={"DELIVER_TIMESTAMP": str(due)}))
        assert max_offset(stubs, "T", 0) == 0  # held by the schedule, not stored plain
        wait_until(lambda: max_offset(stubs, "T", 0) == 1, 30, "the message due 1.5 s after its send")


def test_delivered_timed_messages_copied_go_on_as_they_came_single_and_in_batches(broker):
    """A consumer forwarding timed messages it received (their DELIVER_TIMESTAMP past): the producer sent
    them by SendMessage, which read the property as a delivery time, and refused a send_batch of them as
    delayed messages in a batch."""
    create_topic(broker.address, "F", 1)
    past = str(int(time.time() * 1000) - 60_000)
    with Producer(brokers=broker.address) as producer, BrokerStubs(broker.address) as stubs:
        producer.send_batch([Message("F", b"a", properties={"DELIVER_TIMESTAMP": past}),
                             Message("F", b"b", properties={"DELIVER_TIMESTAMP": past})])
        producer.send(Message("F", b"c", properties={"DELIVER_TIMESTAMP": past}))
        assert max_offset(stubs, "F", 0) == 3  # stored at once, as they came
