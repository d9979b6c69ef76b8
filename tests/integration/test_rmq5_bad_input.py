"""Bad input through RocketMQ 5's protocol: each gets the code the RocketMQ proxy answers with, and
changes nothing (no message stored, no topic created, the broker keeps serving)."""

from __future__ import annotations

import time

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from rmq5lib import Rmq5Stub, message, resource

from tidemark.client import Admin
from tidemark.rmq5.v2 import messaging_pb2 as pb


@pytest.fixture(scope="module")
def stub(module_broker):
    with Admin(brokers=module_broker.address) as admin:
        admin.create_topic("V2Bad", 2)
    channel = grpc.insecure_channel(module_broker.address)
    yield Rmq5Stub(channel)
    channel.close()


def in_namespace(namespace: str, topic: str) -> pb.Message:
    m = message(topic, b"x")
    m.topic.resource_namespace = namespace
    return m


def _stored(address: str) -> int:
    with Admin(brokers=address) as admin:
        return sum(s.max_offset for s in admin.topic_stats("V2Bad"))


@pytest.mark.parametrize("bad, code, words", [
    (message("NoSuchTopic", b"x"), pb.TOPIC_NOT_FOUND, "does not exist"),
    (message("V2Bad", b""), pb.MESSAGE_BODY_EMPTY, "empty"),
    (message("V2Bad", b"x" * (4 * 1024 * 1024 + 1)), pb.MESSAGE_BODY_TOO_LARGE, "at most"),
    (message("V2Bad", b"x", message_id=""), pb.ILLEGAL_MESSAGE_ID, "message_id"),
    (message("V2Bad", b"x", message_type=pb.FIFO), pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "message group"),
    (message("V2Bad", b"x", message_group="g" * 65, message_type=pb.FIFO), pb.ILLEGAL_MESSAGE_GROUP, "64"),
    (message("V2Bad", b"x", message_type=pb.PRIORITY), pb.UNSUPPORTED, "not supported"),
    (message("V2Bad", b"x", message_type=pb.TRANSACTION, message_group="g"), pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
     "TRANSACTION message must not carry a message group"),
    (message("V2Bad", b"x", tag="a|b"), pb.ILLEGAL_MESSAGE_TAG, "'|'"),
    (message("V2Bad", b"x", message_type=pb.DELAY, delivery_timestamp=Timestamp(seconds=int(time.time()) + 2 * 86400)),
     pb.ILLEGAL_DELIVERY_TIME, "ahead"),
    (message("V2Bad", b"x", message_type=pb.DELAY), pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "delivery timestamp"),
    (in_namespace("bad%ns", "V2Bad"), pb.BAD_REQUEST, "topic 'V2Bad': namespace 'bad%ns' may only contain letters"),
    (in_namespace("n" * 65, "V2Bad"), pb.BAD_REQUEST, "is 65 characters; at most 64 allowed"),
    (in_namespace("ns", "a%V2Bad"), pb.ILLEGAL_TOPIC, "topic name 'a%V2Bad' in namespace 'ns' must not contain '%'"),
    (in_namespace("ns", "V2Bad"), pb.TOPIC_NOT_FOUND, "ns%V2Bad"),  # another topic than V2Bad
])
def test_a_bad_send_is_refused_with_the_proxys_code(module_broker, stub, bad, code, words):
    before = _stored(module_broker.address)
    answer = stub.SendMessage(pb.SendMessageRequest(messages=[bad]), timeout=30)
    assert answer.status.code == code, answer.status
    assert words in answer.status.message
    assert _stored(module_broker.address) == before


def test_a_reserved_property_key_and_mixed_topics_are_refused(module_broker, stub):
    before = _stored(module_broker.address)
    m = message("V2Bad", b"x")
    m.user_properties["UNIQ_KEY"] = "forged"
    assert stub.SendMessage(pb.SendMessageRequest(messages=[m])).status.code == pb.ILLEGAL_MESSAGE_PROPERTY_KEY
    mixed = pb.SendMessageRequest(messages=[message("V2Bad", b"x"), message("Other", b"y")])
    assert stub.SendMessage(mixed).status.code == pb.MESSAGE_CORRUPTED
    assert _stored(module_broker.address) == before


def test_query_route_of_an_unknown_topic(stub):
    answer = stub.QueryRoute(pb.QueryRouteRequest(topic=resource("NoSuchTopic")))
    assert answer.status.code == pb.TOPIC_NOT_FOUND and not answer.message_queues


def test_route_lists_every_queue_with_this_broker_as_endpoint(module_broker, stub):
    host, port = module_broker.address.rsplit(":", 1)
    endpoints = pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=host, port=int(port))])
    answer = stub.QueryRoute(pb.QueryRouteRequest(topic=resource("V2Bad"), endpoints=endpoints))
    assert answer.status.code == pb.OK
    assert [(q.id, q.permission) for q in answer.message_queues] == [(0, pb.READ_WRITE), (1, pb.READ_WRITE)]
    assert {q.broker.endpoints.addresses[0].port for q in answer.message_queues} == {int(port)}
    assert set(answer.message_queues[0].accept_message_types) == {pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION}


def test_a_call_without_a_client_id_is_refused(stub):
    answer = stub.Heartbeat(pb.HeartbeatRequest(client_type=pb.PRODUCER), metadata=())
    assert answer.status.code == pb.CLIENT_ID_REQUIRED


def test_telemetry_must_start_with_settings(stub):
    stream = stub.Telemetry(iter([pb.TelemetryCommand(verify_message_result=pb.VerifyMessageResult(nonce="n"))]))
    with pytest.raises(grpc.RpcError) as e:
        list(stream)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "settings" in e.value.details()


def test_telemetry_garbage_is_invalid_argument_and_the_broker_keeps_serving(module_broker, stub):
    channel = grpc.insecure_channel(module_broker.address)
    raw = channel.stream_stream("/apache.rocketmq.v2.MessagingService/Telemetry")
    with pytest.raises(grpc.RpcError) as e:
        list(raw(iter([b"\x0a\x05ab"]), metadata=stub.metadata(), timeout=10))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()
    assert stub.QueryRoute(pb.QueryRouteRequest(topic=resource("V2Bad"))).status.code == pb.OK


def test_producer_settings_are_answered_with_the_effective_ones(stub):
    settings = pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[resource("V2Bad")]))
    [answer] = list(stub.Telemetry(iter([pb.TelemetryCommand(settings=settings)])))
    assert answer.status.code == pb.OK
    s = answer.settings
    assert s.publishing.max_body_size == 4 * 1024 * 1024 and s.publishing.validate_message_type
    assert s.backoff_policy.max_attempts == 3 and s.backoff_policy.HasField("exponential_backoff")
    assert not s.metric.on


def test_consumer_settings_carry_the_groups_retry_policy(module_broker, stub):
    settings = pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
        group=resource("v2-bad-group"),
        subscriptions=[pb.SubscriptionEntry(topic=resource("V2Bad"),
                                            expression=pb.FilterExpression(type=pb.TAG, expression="*"))]))
    [answer] = list(stub.Telemetry(iter([pb.TelemetryCommand(settings=settings)])))
    s = answer.settings
    assert s.backoff_policy.max_attempts == 17 and s.backoff_policy.customized_backoff.next[0].seconds == 10
    assert s.subscription.receive_batch_size == 32 and s.subscription.long_polling_timeout.seconds == 20
    with Admin(brokers=module_broker.address) as admin:
        assert any(m.client_id == stub.client_id for m in admin.describe_group("v2-bad-group").members)


def test_bad_sql_filters_and_unknown_client_types_end_the_stream(stub):
    sql = pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
        group=resource("v2-bad-sql"),
        subscriptions=[pb.SubscriptionEntry(topic=resource("V2Bad"),
                                            expression=pb.FilterExpression(type=pb.SQL, expression="a >"))]))
    for settings, words in ((sql, 'SQL92 expression "a >" at column 4: expected a value'),
                            (pb.Settings(client_type=pb.PULL_CONSUMER), "PULL_CONSUMER")):
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Telemetry(iter([pb.TelemetryCommand(settings=settings)])))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in e.value.details()


def test_ending_a_transaction_the_broker_never_gave_out_is_refused(stub):
    for transaction_id, code, words in (("not-a-number", pb.INVALID_TRANSACTION_ID, "not given by this broker"),
                                        ("424242", pb.NOT_FOUND, "no transaction at half offset 424242")):
        answer = stub.EndTransaction(pb.EndTransactionRequest(topic=resource("V2Bad"), message_id="m",
                                                              transaction_id=transaction_id, resolution=pb.COMMIT))
        assert answer.status.code == code and words in answer.status.message, answer


def test_forged_and_foreign_receipt_handles_are_invalid(stub):
    group, topic = resource("v2-bad-acks"), resource("V2Bad")
    for handle, words in (("not-a-handle", "forged"), ("v1.AAAA.BBBB", "forged"), ("", "forged")):
        answer = stub.AckMessage(pb.AckMessageRequest(group=group, topic=topic, entries=[
            pb.AckMessageEntry(message_id="m", receipt_handle=handle)]))
        assert answer.status.code == pb.INVALID_RECEIPT_HANDLE and words in answer.status.message, answer
        changed = stub.ChangeInvisibleDuration(pb.ChangeInvisibleDurationRequest(
            group=group, topic=topic, receipt_handle=handle, message_id="m"))
        assert changed.status.code == pb.INVALID_RECEIPT_HANDLE


def test_receive_refuses_a_bad_invisible_time_and_an_unknown_topic(stub):
    from google.protobuf.duration_pb2 import Duration

    def receive(topic: str, **fields):
        return list(stub.ReceiveMessage(pb.ReceiveMessageRequest(
            group=resource("v2-bad-receive"), message_queue=pb.MessageQueue(topic=resource(topic)), batch_size=1,
            long_polling_timeout=Duration(nanos=100_000_000), **fields)))

    short = receive("V2Bad", invisible_duration=Duration(seconds=1))
    assert short[0].status.code == pb.ILLEGAL_INVISIBLE_TIME and short[-1].HasField("delivery_timestamp")
    assert receive("V2Bad")[0].status.code == pb.ILLEGAL_INVISIBLE_TIME  # neither a time nor auto-renew
    assert receive("NoSuchTopic", invisible_duration=Duration(seconds=30))[0].status.code == pb.TOPIC_NOT_FOUND
    nothing = receive("V2Bad", invisible_duration=Duration(seconds=30))
    assert nothing[0].status.code == pb.MESSAGE_NOT_FOUND


def test_a_bad_namespace_is_refused_by_every_method_and_creates_nothing(module_broker, stub):
    from google.protobuf.duration_pb2 import Duration

    with Admin(brokers=module_broker.address) as admin:
        topics, groups = admin.list_topics(include_system=True), admin.list_groups()
    bad = pb.Resource(name="V2Bad", resource_namespace="bad%ns")
    why = "namespace 'bad%ns' may only contain letters, digits, '_' and '-'"
    for answer in (stub.QueryRoute(pb.QueryRouteRequest(topic=bad)),
                   stub.Heartbeat(pb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER, group=bad)),
                   stub.QueryAssignment(pb.QueryAssignmentRequest(topic=resource("V2Bad"), group=bad)),
                   stub.EndTransaction(pb.EndTransactionRequest(topic=bad, message_id="m", transaction_id="1",
                                                                resolution=pb.COMMIT))):
        assert answer.status.code == pb.BAD_REQUEST and why in answer.status.message, answer
    [status, _] = list(stub.ReceiveMessage(pb.ReceiveMessageRequest(
        group=bad, message_queue=pb.MessageQueue(topic=resource("V2Bad")), batch_size=1,
        invisible_duration=Duration(seconds=30), long_polling_timeout=Duration(nanos=100_000_000))))
    assert status.status.code == pb.BAD_REQUEST and f"group 'V2Bad': {why}" in status.status.message
    settings = pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=pb.Subscription(
        group=bad, subscriptions=[pb.SubscriptionEntry(topic=resource("V2Bad"))]))
    with pytest.raises(grpc.RpcError) as e:
        list(stub.Telemetry(iter([pb.TelemetryCommand(settings=settings)])))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and why in e.value.details()
    with Admin(brokers=module_broker.address) as admin:
        assert admin.list_topics(include_system=True) == topics and admin.list_groups() == groups


def test_a_route_in_a_namespace_is_answered_with_the_namespace_and_the_bare_name(module_broker, stub):
    with Admin(brokers=module_broker.address, namespace="ns-route") as admin:
        admin.create_topic("V2Bad", 1)  # stored as ns-route%V2Bad
    answer = stub.QueryRoute(pb.QueryRouteRequest(topic=pb.Resource(name="V2Bad", resource_namespace="ns-route")))
    assert answer.status.code == pb.OK
    assert [(q.topic.name, q.topic.resource_namespace) for q in answer.message_queues] == [("V2Bad", "ns-route")]
