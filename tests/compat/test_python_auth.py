"""The official Python client against a broker started with --auth: it signs its calls the way
Tidemark's own clients do (RocketMQ 5's MQv2-HMAC-SHA1 header), and the ACLs apply to it; a refusal
reaches the application as the client's own ForbiddenException / UnauthorizedException, because the
broker answers it in the response's status, as the RocketMQ proxy does."""

from __future__ import annotations

import pytest
from brokerproc import BrokerProcess

from tidemark.client import Admin

ROOT = ("root", "root-secret-1")
WRITER = ("writer", "writer-secret-1")
READER = ("reader", "reader-secret-1")


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("v2auth") / "data",
                           args=("--auth", "--init-user", ":".join(ROOT))).start()
    with Admin(brokers=broker.address, credentials=ROOT) as admin:
        admin.create_topic("Secure", 2)
        admin.create_user(*WRITER)
        admin.create_user(*READER)
        admin.create_acl(WRITER[0], "Topic:Secure", ["Pub"], "Allow")
        admin.create_acl(READER[0], "Topic:Secure", ["Sub"], "Allow")
        admin.create_acl(READER[0], "Group:secure-readers", ["Sub"], "Allow")
    yield broker
    broker.kill()


def _config(rmq, broker, credentials):
    return rmq.ClientConfiguration(broker.address, rmq.Credentials(*credentials))


def _message(rmq, body: bytes):
    m = rmq.Message()
    m.topic, m.body = "Secure", body
    return m


def test_allowed_users_send_and_receive(secured, official, rmq):
    producer = official(rmq.Producer(_config(rmq, secured, WRITER), ("Secure",)))
    receipt = producer.send(_message(rmq, b"signed"))
    consumer = official(rmq.SimpleConsumer(_config(rmq, secured, READER), "secure-readers",
                                           {"Secure": rmq.FilterExpression()}, await_duration=5))
    got = []
    while not got:
        got = consumer.receive(16, 15)
    assert [m.message_id for m in got] == [receipt.message_id]
    consumer.ack(got[0])


def test_a_user_without_pub_gets_forbidden(secured, official, rmq):
    from rocketmq.v5.exception import ForbiddenException

    producer = official(rmq.Producer(_config(rmq, secured, READER), ("Secure",)))
    with pytest.raises(ForbiddenException, match="Pub on Topic:Secure"):
        producer.send(_message(rmq, b"not allowed"))
    with Admin(brokers=secured.address, credentials=ROOT) as admin:
        assert not any(m.body == b"not allowed" for mq in admin.fetch_message_queues("Secure")
                       for m in admin.pull(mq, 0, max_nums=100).messages)


def test_a_consumer_of_another_group_gets_forbidden(secured, official, rmq):
    from rocketmq.v5.exception import ForbiddenException

    consumer = official(rmq.SimpleConsumer(_config(rmq, secured, READER), "other-group",
                                           {"Secure": rmq.FilterExpression()}, await_duration=1))
    with pytest.raises(ForbiddenException, match="Group:other-group"):
        consumer.receive(16, 15)


def test_a_wrong_secret_is_unauthorized(secured, official, rmq):
    producer = rmq.Producer(_config(rmq, secured, (WRITER[0], "wrong-secret")), ("Secure",))
    with pytest.raises(Exception, match="(?i)unauthori|invalid access key|route"):
        official(producer)
        producer.send(_message(rmq, b"x"))
