"""The official Python client's Producer against a Tidemark broker, read back with Tidemark's client.

Normal, FIFO and delayed sends, with tag, keys, user properties and the
client's message id kept; refusals come back as the client's own exceptions
with the codes the RocketMQ proxy uses.
"""

from __future__ import annotations

import time

import pytest
from workload import wait_until

from tidemark.client import Admin, Message, MessageQueue, Producer


@pytest.fixture
def producer(broker, official, rmq):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Orders", 4)
    return official(rmq.Producer(rmq.ClientConfiguration(broker.address, rmq.Credentials()), ("Orders",)))


def _message(rmq, body: bytes, **fields):
    m = rmq.Message()
    m.topic = fields.pop("topic", "Orders")
    m.body = body
    for name, value in fields.pop("properties", {}).items():
        m.add_property(name, value)
    for name, value in fields.items():
        setattr(m, name, value)
    return m


def _stored(address: str, topic: str) -> list:
    """Every message of the topic, queue by queue, in queue order."""
    with Admin(brokers=address) as admin:
        out = []
        for mq in admin.fetch_message_queues(topic):
            out.extend(admin.pull(mq, 0, max_nums=1000).messages)
        return out


def test_normal_send_keeps_tag_keys_properties_and_message_id(broker, producer, rmq):
    receipt = producer.send(_message(rmq, b"hello", tag="TagA", keys="k1", properties={"color": "red"}))
    [stored] = _stored(broker.address, "Orders")
    assert stored.msg_id == receipt.message_id
    assert (stored.body, stored.tags, stored.keys) == (b"hello", "TagA", "k1")
    assert stored.properties["color"] == "red"
    assert receipt.offset == stored.queue_offset


def test_fifo_sends_of_one_message_group_share_a_queue_in_order(broker, producer, rmq):
    for n in range(20):
        producer.send(_message(rmq, b"a-%d" % n, message_group="group-a"))
        producer.send(_message(rmq, b"b-%d" % n, message_group="group-b"))
    by_queue: dict[int, list[bytes]] = {}
    for m in _stored(broker.address, "Orders"):
        by_queue.setdefault(m.queue_id, []).append(m.body)
    for group in (b"a", b"b"):
        [queue] = [q for q, bodies in by_queue.items() if any(b.startswith(group) for b in bodies)]
        assert [b for b in by_queue[queue] if b.startswith(group)] == [group + b"-%d" % n for n in range(20)]


def test_delayed_send_is_invisible_until_its_delivery_time(broker, producer, rmq):
    due = int(time.time() * 1000) + 3_000
    receipt = producer.send(_message(rmq, b"later", delivery_timestamp=due))
    assert _stored(broker.address, "Orders") == []
    wait_until(lambda: len(_stored(broker.address, "Orders")) == 1, 30, "the delayed message delivered")
    [stored] = _stored(broker.address, "Orders")
    assert stored.msg_id == receipt.message_id and stored.body == b"later"
    assert stored.store_timestamp >= due, "delivered no earlier than asked"


def test_a_tidemark_producer_message_reads_back_through_the_route(broker, producer, rmq):
    """The route the official client got (QueryRoute) names this broker's queues."""
    with Producer(brokers=broker.address) as ours:
        ours.send(Message("Orders", b"x"), queue=MessageQueue("Orders", "broker-a", 0))
    assert len(_stored(broker.address, "Orders")) == 1


def test_refusals_are_the_clients_own_exceptions(broker, producer, rmq):
    from rocketmq.v5.exception import BadRequestException

    with pytest.raises(BadRequestException, match="reserved system property"):
        producer.send(_message(rmq, b"x", properties={"UNIQ_KEY": "mine"}))
    # The client looks the topic's route up first; TOPIC_NOT_FOUND fails that look-up.
    with pytest.raises(Exception, match="route"):
        producer.send(_message(rmq, b"x", topic="NoSuchTopic"))
    assert _stored(broker.address, "Orders") == []
