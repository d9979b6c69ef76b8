"""The official Python client's SQL92 filters (FilterExpression(..., FilterType.SQL)) against a Tidemark broker:
its simple and push consumers receive exactly the messages whose properties match, the skipped ones count as
done (the group's offsets reach the end), and a bad expression is refused with its column."""

from __future__ import annotations

import threading
import time

import pytest
from workload import wait_until

from tidemark.client import Admin, Message, Producer

SQL = "region = 'eu' AND amount > 100"


@pytest.fixture
def topic(broker) -> str:
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Orders", 2)
    return "Orders"


def _config(rmq, broker):
    return rmq.ClientConfiguration(broker.address, rmq.Credentials())


def _sql(rmq, expression: str = SQL):
    from rocketmq.grpc_protocol import FilterType
    return rmq.FilterExpression(expression, FilterType.SQL)


def _produce(address: str, topic: str) -> tuple[set[str], int]:
    """Messages with every mix of region and amount (some without a region); the ids of those SQL matches."""
    wanted, sent = set(), 0
    with Producer(brokers=address) as producer:
        for i, amount in enumerate(["50", "150", "abc", "101", "100"] * 2):
            for region in ("eu", "us", None):
                properties = {"amount": amount, **({"region": region} if region else {})}
                msg_id = producer.send(Message(topic, b"m-%d" % i, properties=properties)).msg_id
                sent += 1
                if region == "eu" and amount.isdigit() and int(amount) > 100:
                    wanted.add(msg_id)
    return wanted, sent


def _committed(address: str, group: str, topic: str) -> int:
    with Admin(brokers=address) as admin:
        return sum(max(s.consumer_offset, 0) for s in admin.consume_stats(group, topic))


def test_a_simple_consumer_receives_exactly_the_matching_messages(broker, topic, official, rmq):
    wanted, sent = _produce(broker.address, topic)
    consumer = official(rmq.SimpleConsumer(_config(rmq, broker), "sql-simple", {topic: _sql(rmq)}, await_duration=2))
    got = set()
    deadline = time.monotonic() + 30
    while got != wanted and time.monotonic() < deadline:
        for m in consumer.receive(16, 15):
            assert m.properties["region"] == "eu" and int(m.properties["amount"]) > 100
            got.add(m.message_id)
            consumer.ack(m)
    assert got == wanted and len(wanted) == 4
    wait_until(lambda: _committed(broker.address, "sql-simple", topic) == sent, 10, "skipped ones count as done")
    assert consumer.receive(16, 15) == []


def test_a_push_consumer_receives_exactly_the_matching_messages(broker, topic, official, rmq):
    wanted, sent = _produce(broker.address, topic)
    got, lock = [], threading.Lock()

    class Collect(rmq.MessageListener):
        def consume(self, message):
            with lock:
                got.append(message.message_id)
            return rmq.ConsumeResult.SUCCESS

    official(rmq.PushConsumer(_config(rmq, broker), "sql-push", Collect(), {topic: _sql(rmq)}))
    wait_until(lambda: set(got) == wanted, 30, "the matching messages delivered")
    wait_until(lambda: _committed(broker.address, "sql-push", topic) == sent, 10, "skipped ones count as done")
    assert sorted(got) == sorted(wanted)  # once each


def test_a_bad_expression_is_refused_with_its_column(broker, topic, official, rmq):
    """The simple consumer does not wait for the answer to its settings: its receive is refused
    (ILLEGAL_FILTER_EXPRESSION) with the broker's message."""
    consumer = official(rmq.SimpleConsumer(_config(rmq, broker), "sql-bad", {topic: _sql(rmq, "amount >")},
                                           await_duration=2))
    with pytest.raises(Exception) as caught:
        consumer.receive(16, 15)
    assert 'SQL92 expression "amount >" at column 9: expected a value' in str(caught.value)
