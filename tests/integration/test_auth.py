"""Authentication and authorization enforced on every RPC (a real broker started with --auth).

Each RPC is called the way a client would (every name valid) but with no credentials, a wrong secret,
a replayed header, a user without rules and a user whose Deny rule overrides an Allow: each gets its
specific status and leaves topics, messages, groups, offsets, locks and members exactly as they were.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from rpc_fuzzlib import (
    CLIENT_IDS,
    GROUPS,
    TOPICS,
    methods,
    name_field_paths,
    set_path,
    snapshot,
    valid_name,
)
from test_rmq5_inflight import give_up, receive, receive_again
from test_rpc_fuzz import BASELINES, seed

from tests.brokerproc import BrokerProcess, BrokerStubs
from tests.rmq5lib import Rmq5Stub
from tidemark.broker.services.access import NEEDS
from tidemark.client import (
    Admin,
    FailedPreconditionError,
    Message,
    MessageQueue,
    PermissionDeniedError,
    Producer,
    PullConsumer,
    UnauthenticatedError,
)
from tidemark.client.journey import trace_message
from tidemark.common.auth import Credentials, signed_metadata
from tidemark.v1 import admin_pb2, common_pb2, membership_pb2, messaging_pb2, offsets_pb2

ROOT = Credentials("root", "root-secret-1")
METHODS = methods(include_auth_only=True)


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("auth") / "data", args=(
        "--auth", "--init-user", f"{ROOT.access_key}:{ROOT.secret_key}", "--lock-expiry-ms", "3600000",
        "--watch-grace-ms", "3600000", "--max-long-polling-ms", "200")).start()
    with Admin(brokers=broker.address, credentials=ROOT) as admin:
        admin.create_user("nobody", "nobody-secret")  # a user without any rule
        admin.create_user("denied", "denied-secret")  # allowed everything, then denied the seeded names
        for resource in ("Topic:*", "Group:*", "Cluster"):
            admin.create_acl("denied", resource, ["All"], "Allow")
        for resource in (f"Topic:{TOPICS[0]}", f"Group:{GROUPS[0]}", "Cluster"):
            admin.create_acl("denied", resource, ["All"], "Deny")
    root = BrokerStubs(broker.address, ROOT)
    seed(root)
    yield broker, root
    root.channel.close()
    broker.stop()


def _request(method):
    request = method.input_type()
    for path in name_field_paths(method.input_type.DESCRIPTOR):
        set_path(request, path, valid_name(path[-1]))
    BASELINES.get(method.name, lambda r: None)(request)
    if method.name == "Fetch":
        request.open.credit_messages, request.open.credit_bytes = 10, 1 << 20
    if method.name in ("CreateUser", "UpdateUser", "DeleteUser", "CreateAcl", "DeleteAcl"):
        for field, value in (("name", "eve"), ("user", "eve"), ("secret_key", "eve-secret-1"),
                             ("resource", "Topic:x"), ("decision", "Allow")):
            if field in method.input_type.DESCRIPTOR.fields_by_name:
                setattr(request, field, value)
    return request


def _status(address: str, method, request, metadata) -> grpc.StatusCode:
    with grpc.insecure_channel(address) as channel:
        def identity(b):
            return b
        payload = request.SerializeToString()
        try:
            if method.client_streaming:
                call = (channel.stream_stream if method.server_streaming else channel.stream_unary)(
                    method.path, request_serializer=identity, response_deserializer=identity)
                result = call(iter([payload]), timeout=3, metadata=metadata)
                if method.server_streaming:
                    for _ in result:
                        pass
            elif method.server_streaming:
                for _ in channel.unary_stream(method.path, request_serializer=identity,
                                              response_deserializer=identity)(payload, timeout=1, metadata=metadata):
                    pass
            else:
                channel.unary_unary(method.path, request_serializer=identity,
                                    response_deserializer=identity)(payload, timeout=3, metadata=metadata)
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def test_every_method_says_what_it_needs():
    assert {m.name for m in METHODS} <= set(NEEDS)


CASES = {
    "no credentials": (lambda: (), grpc.StatusCode.UNAUTHENTICATED),
    "wrong secret": (lambda: signed_metadata(Credentials("root", "not-the-secret")), grpc.StatusCode.UNAUTHENTICATED),
    "unknown user": (lambda: signed_metadata(Credentials("mallory", "whatever-1")), grpc.StatusCode.UNAUTHENTICATED),
    "replayed header": (lambda: signed_metadata(ROOT, now=time.time() - 3600), grpc.StatusCode.UNAUTHENTICATED),
    "no rule": (lambda: signed_metadata(Credentials("nobody", "nobody-secret")), grpc.StatusCode.PERMISSION_DENIED),
    "deny over allow": (lambda: signed_metadata(Credentials("denied", "denied-secret")),
                        grpc.StatusCode.PERMISSION_DENIED),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rpc_refuses_without_the_right_credentials_and_changes_nothing(secured, case):
    broker, root = secured
    metadata, expected = CASES[case]
    before = snapshot(root)
    wrong = {}
    for method in METHODS:
        if method.name == "GetBrokerInfo" and expected is grpc.StatusCode.PERMISSION_DENIED:
            continue  # any authenticated user may ask who the broker is: clients need it to route
        code = _status(broker.address, method, _request(method), metadata())
        if code is not expected:
            wrong[method.name] = code.name
    assert wrong == {}
    assert snapshot(root) == before
    assert "root-secret-1" not in broker.log_text() and "nobody-secret" not in broker.log_text()


def test_a_refusal_names_the_user_the_action_and_the_resource(secured):
    broker, _root = secured
    creds = Credentials("nobody", "nobody-secret")
    with pytest.raises(grpc.RpcError) as refused:
        BrokerStubs(broker.address, creds).messaging.SendMessage(
            messaging_pb2.SendMessageRequest(topic=TOPICS[0], messages=[{"body": b"x"}]), timeout=5)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details().startswith(f"user 'nobody' may not Pub on Topic:{TOPICS[0]}")
    with pytest.raises(grpc.RpcError) as unauthenticated:
        BrokerStubs(broker.address).admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=5)
    assert unauthenticated.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "no credentials" in unauthenticated.value.details()


def test_sub_on_the_topic_but_not_the_group_cannot_commit_and_pub_only_cannot_pull(secured):
    broker, _root = secured
    with Admin(brokers=broker.address, credentials=ROOT) as admin:
        admin.create_topic("Orders", 1)
        admin.create_user("reader", "reader-secret")
        admin.create_acl("reader", "Topic:Orders", ["Sub"], "Allow")
        admin.create_acl("reader", "Group:readers", ["Sub"], "Allow")
        admin.create_user("writer", "writer-secret")
        admin.create_acl("writer", "Topic:Orders", ["Pub"], "Allow")
    with Producer(brokers=broker.address, credentials=("writer", "writer-secret")) as producer:
        producer.send(Message("Orders", b"one"))
    reader = BrokerStubs(broker.address, Credentials("reader", "reader-secret"))
    commit = offsets_pb2.OffsetCommit(group="billing", topic="Orders", queue_id=0, offset=1)
    with pytest.raises(grpc.RpcError) as refused:
        reader.offsets.UpdateConsumerOffset(offsets_pb2.UpdateConsumerOffsetRequest(commit=commit), timeout=5)
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "Sub on Group:billing" in refused.value.details()
    commit.group = "readers"
    reader.offsets.UpdateConsumerOffset(offsets_pb2.UpdateConsumerOffsetRequest(commit=commit), timeout=5)
    # A consumer whose user may only publish gets nothing (its heartbeats and rebalances are refused and
    # logged, and it keeps retrying, as RocketMQ's does); a raw pull says why.
    consumer = PullConsumer(group="writers", brokers=broker.address, credentials=("writer", "writer-secret"),
                            consume_from_where="CONSUME_FROM_FIRST_OFFSET")
    consumer.subscribe("Orders")
    try:
        consumer.start()
        assert consumer.poll(timeout=2) == []
    finally:
        consumer.shutdown()
    writer = BrokerStubs(broker.address, Credentials("writer", "writer-secret"))
    with pytest.raises(grpc.RpcError) as no_pull:
        writer.messaging.PullMessage(messaging_pb2.PullMessageRequest(group="writers", topic="Orders", queue_id=0,
                                                                      max_msg_nums=1), timeout=5)
    assert no_pull.value.code() is grpc.StatusCode.PERMISSION_DENIED


def test_deliveries_name_only_the_groups_whose_readers_the_caller_may_see(secured):
    """A queue's delivery records name every group reading it and their clients (host and pid): Get on the
    topic alone shows none of them, Get on a group shows that group's."""
    broker, root = secured
    with Admin(brokers=broker.address, credentials=ROOT) as admin:
        admin.create_topic("Traced", 1)
        for user in ("topic-only", "tracer"):
            admin.create_user(user, f"{user}-secret")
            admin.create_acl(user, "Topic:Traced", ["Get"], "Allow")
        admin.create_acl("tracer", "Group:mine", ["Get"], "Allow")
    root.messaging.SendMessage(messaging_pb2.SendMessageRequest(topic="Traced", queue_id=0,
                                                                messages=[{"body": b"x"}]), timeout=5)
    for group in ("mine", "theirs"):
        root.messaging.PullMessage(messaging_pb2.PullMessageRequest(
            group=group, topic="Traced", queue_id=0, max_msg_nums=1,
            fence=common_pb2.CommitFence(client_id=f"10.0.0.1@{group}")), timeout=5)

    def seen(user: str, secret: str) -> list[tuple[str, str]]:
        with Admin(brokers=broker.address, credentials=(user, secret)) as admin:
            return [(d.group, d.client_id) for d in admin.deliveries(MessageQueue("Traced", broker.broker_name, 0), 0)]

    assert seen(ROOT.access_key, ROOT.secret_key) == [("mine", "10.0.0.1@mine"), ("theirs", "10.0.0.1@theirs")]
    assert seen("topic-only", "topic-only-secret") == []
    assert seen("tracer", "tracer-secret") == [("mine", "10.0.0.1@mine")]


def test_users_and_acls_are_managed_by_super_users_only(secured):
    broker, _root = secured
    with Admin(brokers=broker.address, credentials=("denied", "denied-secret")) as admin:
        with pytest.raises(PermissionDeniedError, match="not a super user"):
            admin.create_user("eve", "eve-secret-1", super_user=True)
    with pytest.raises(UnauthenticatedError, match="invalid access key or signature"):
        with Admin(brokers=broker.address, credentials=("root", "wrong-secret")) as admin:
            admin.list_users()
    with Admin(brokers=broker.address, credentials=ROOT) as admin:
        assert "eve" not in {u.name for u in admin.list_users()}
        with pytest.raises(FailedPreconditionError):
            admin.delete_user("root")  # the last super user stays


def test_streams_are_authorised_per_message(secured):
    broker, _root = secured
    denied = BrokerStubs(broker.address, Credentials("denied", "denied-secret"))
    with pytest.raises(grpc.RpcError) as watch:
        for _ in denied.membership.WatchConsumerIds(membership_pb2.WatchConsumerIdsRequest(
                group=GROUPS[0], client_id=CLIENT_IDS[1]), timeout=3):
            pass
    assert watch.value.code() is grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as fetch:
        list(denied.messaging.Fetch(iter([messaging_pb2.FetchRequest(open=messaging_pb2.FetchOpen(
            handle=1, group="other", topic=TOPICS[0], queue_id=0, credit_messages=1, credit_bytes=1024))]),
            timeout=3))
    assert fetch.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert f"Sub on Topic:{TOPICS[0]}" in fetch.value.details()


def test_an_unknown_access_key_and_a_wrong_secret_get_the_same_answer(secured):
    broker, _root = secured
    answers = set()
    for creds in (Credentials("root", "not-the-secret"), Credentials("no-such-user", "whatever-1")):
        with pytest.raises(grpc.RpcError) as refused:
            BrokerStubs(broker.address, creds).admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=5)
        answers.add((refused.value.code(), refused.value.details()))
    assert answers == {(grpc.StatusCode.UNAUTHENTICATED, "invalid access key or signature")}


def test_no_way_around_a_topic_rule(secured):
    """A send-back cannot copy another topic's message into the caller's retry topic; the schedule topic
    (every topic's delayed messages) is super users' only; a group's rights do not extend to deleting
    its retry topic."""
    broker, root = secured
    with Admin(brokers=broker.address, credentials=ROOT) as admin:
        admin.create_topic("Secret", 1)
        admin.create_user("mallory", "mallory-secret")
        admin.create_acl("mallory", "Group:mine", ["Sub"], "Allow")
        admin.create_acl("mallory", "Topic:*", ["All"], "Allow")
        admin.create_acl("mallory", "Topic:Secret", ["All"], "Deny")
    sent = root.messaging.SendMessage(messaging_pb2.SendMessageRequest(
        topic="Secret", queue_id=0, messages=[{"body": b"TOP-SECRET"}]), timeout=5).results[0]
    root.messaging.SendMessage(messaging_pb2.SendMessageRequest(
        topic="Secret", queue_id=0, messages=[{"body": b"LATER", "delay_level": 3}]), timeout=5)
    mallory = BrokerStubs(broker.address, Credentials("mallory", "mallory-secret"))
    before = snapshot(root)
    refusals = {}
    for name, call in {
        "send back": lambda: mallory.messaging.ConsumerSendMsgBack(messaging_pb2.ConsumerSendMsgBackRequest(
            group="mine", commit_log_offset=sent.commit_log_offset, msg_id=sent.msg_id), timeout=5),
        "schedule topic": lambda: mallory.messaging.ViewMessage(messaging_pb2.ViewMessageRequest(
            topic="SCHEDULE_TOPIC_XXXX", queue_id=2, queue_offset=0), timeout=5),
        "retry topic admin": lambda: mallory.admin.DeleteTopic(admin_pb2.DeleteTopicRequest(
            name="%RETRY%mine"), timeout=5),
    }.items():
        with pytest.raises(grpc.RpcError) as refused:
            call()
        refusals[name] = refused.value.code()
    assert set(refusals.values()) == {grpc.StatusCode.PERMISSION_DENIED}, refusals
    assert snapshot(root) == before


def test_a_revoked_rule_stops_an_open_stream_at_its_next_message(secured):
    broker, root = secured
    with Admin(brokers=broker.address, credentials=ROOT) as admin:
        admin.create_topic("Live", 1)
        admin.create_user("streamer", "streamer-secret")
        admin.create_acl("streamer", "Topic:Live", ["Pub"], "Allow")
    from tidemark.common.records import RecordBatchBuilder, encode_properties

    def batch() -> bytes:
        builder = RecordBatchBuilder("Live")
        builder.append(b"x", encode_properties({"UNIQ_KEY": "k"}))
        return bytes(builder.buffer)

    revoked = threading.Event()
    answered = threading.Event()

    def requests():
        yield messaging_pb2.ProduceRequest(request_id=1, topic="Live", queue_id=0, count=1, records=batch())
        answered.wait(10)
        revoked.wait(10)
        yield messaging_pb2.ProduceRequest(request_id=2, topic="Live", queue_id=0, count=1, records=batch())

    streamer = BrokerStubs(broker.address, Credentials("streamer", "streamer-secret"))
    responses = streamer.messaging.Produce(requests(), timeout=20)
    first = next(responses)
    assert first.code == 0
    answered.set()
    with Admin(brokers=broker.address, credentials=ROOT) as admin:
        admin.delete_acl("streamer", "Topic:Live")
    revoked.set()
    with pytest.raises(grpc.RpcError) as ended:
        list(responses)
    assert ended.value.code() is grpc.StatusCode.PERMISSION_DENIED
    with Admin(brokers=broker.address, credentials=ROOT) as admin:
        assert admin.offsets(admin.fetch_message_queues("Live")) and \
            next(iter(admin.offsets(admin.fetch_message_queues("Live")).values()))[1] == 1  # one stored


def test_users_and_acls_cannot_be_managed_on_a_broker_without_auth(broker):
    with Admin(brokers=broker.address) as admin:
        with pytest.raises(FailedPreconditionError, match="only on a broker started with --auth"):
            admin.create_user("eve", "eve-secret-1", super_user=True)


class _SignedRmq5Stub(Rmq5Stub):
    """A RocketMQ 5 client signing its calls as `credentials`."""

    def __init__(self, channel: grpc.Channel, credentials: Credentials) -> None:
        super().__init__(channel)
        self._credentials = credentials

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (*super().metadata(), *signed_metadata(self._credentials))


def test_a_pop_groups_retries_are_its_own(secured):
    """A pop group G keeps its expired deliveries of topic T in %RETRY%G_T: rights on Group:G reach them (the
    rules read it as G's, not as the retry topic of a group named G_T), so a user with Get on the topic and on
    the group sees the whole journey, retried step included; rights on another group do not reach them."""
    broker, _ = secured
    group, topic = "popper", "PopTraced"
    with Admin(brokers=broker.address, credentials=ROOT) as admin:
        admin.create_topic(topic, 1)
        for user in ("tracer-pop", "outsider"):
            admin.create_user(user, f"{user}-secret")
            admin.create_acl(user, f"Topic:{topic}", ["Get"], "Allow")
            admin.create_acl(user, "Cluster", ["List"], "Allow")
        admin.create_acl("tracer-pop", f"Group:{group}", ["Get"], "Allow")
        admin.create_acl("outsider", "Group:popper_other", ["Get"], "Allow")
    with Producer(brokers=broker.address, credentials=ROOT) as producer:
        msg_id = producer.send(Message(topic, b"once")).msg_id
    channel = grpc.insecure_channel(broker.address)
    try:
        stub = _SignedRmq5Stub(channel, ROOT)
        [m] = receive(stub, group, topic, 1)
        give_up(stub, group, topic, m)
        receive_again(stub, group, topic)
    finally:
        channel.close()
    with Admin(brokers=broker.address, credentials=("tracer-pop", "tracer-pop-secret")) as admin:
        steps = [(s.step, s.topic) for s in trace_message(admin, msg_id, topic).steps if s.group == group]
    assert ("retried", f"%RETRY%{group}_{topic}") in steps, steps
    with Admin(brokers=broker.address, credentials=("outsider", "outsider-secret")) as admin:
        with pytest.raises(PermissionDeniedError, match=f"Group:{group}"):
            admin.query_message_by_id(msg_id, f"%RETRY%{group}_{topic}")
