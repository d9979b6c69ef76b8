"""Tidemark's own client and CLI with `namespace=` / `--namespace`: names are stored as RocketMQ stores them
(`NS%name`, `%RETRY%NS%group`, `%DLQ%NS%group`), two namespaces with the same names never meet, and what
the client hands back (messages, queues, send results) carries the bare names."""

from __future__ import annotations

import json
import threading

import pytest
from test_cli import fails, ok, table_rows
from workload import stored_messages, wait_until

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    InvalidArgumentError,
    LocalTransactionState,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PushConsumer,
    TransactionProducer,
)

A, B = "tenant-a", "tenant-b"


def _topics(address: str, namespace: str, *names: str) -> None:
    with Admin(brokers=address, namespace=namespace) as admin:
        for name in names:
            admin.create_topic(name, 2)


def test_producers_and_push_consumers_of_two_namespaces_never_meet(broker):
    for ns in (A, B):
        _topics(broker.address, ns, "Orders")
    sent = {}
    for ns, count in ((A, 4), (B, 3)):
        with Producer(brokers=broker.address, namespace=ns) as producer:
            results = [producer.send(Message("Orders", f"{ns}-{i}".encode())) for i in range(count)]
            results.append(producer.send_async(Message("Orders", f"{ns}-async".encode())).result(10))
            assert {r.message_queue.topic for r in results} == {"Orders"}, "send results carry the bare topic"
            assert {q.topic for q in producer.fetch_publish_message_queues("Orders")} == {"Orders"}
        sent[ns] = {r.msg_id for r in results}
    got: dict[str, dict[str, tuple[str, str, int]]] = {A: {}, B: {}}
    failed_once: set[str] = set()
    lock = threading.Lock()

    def listener(ns: str):
        def consume(msgs, context):
            with lock:
                for m in msgs:
                    got[ns][m.msg_id] = (m.topic, context.message_queue.topic, m.reconsume_times)
                if ns == A and msgs[0].msg_id not in failed_once:  # one trip through %RETRY%tenant-a%workers
                    failed_once.add(msgs[0].msg_id)
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        return consume

    consumers = []
    for ns in (A, B):
        c = PushConsumer(brokers=broker.address, namespace=ns, group="workers",
                         consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        c.subscribe("Orders")
        c.register_message_listener(listener(ns))
        consumers.append(c.start())
    try:
        wait_until(lambda: set(got[A]) == sent[A] and set(got[B]) == sent[B]
                   and any(t[2] for t in got[A].values()), 60, "each namespace's messages, one retried",
                   details=lambda: f"{got}")
        assert {q.topic for c in consumers for q in c.owned_queues()} == {"Orders", "%RETRY%workers"}
    finally:
        for c in consumers:
            c.shutdown()
    for ns in (A, B):
        # The listener sees the bare topic, a retried message too (its stored topic is %RETRY%NS%workers).
        assert {(t[0], t[1]) for t in got[ns].values()} <= {("Orders", "Orders"), ("Orders", "%RETRY%workers")}
    with Admin(brokers=broker.address) as admin:
        topics = set(admin.list_topics(include_system=True))
        groups = {g.group for g in admin.list_groups()}
    assert {"tenant-a%Orders", "tenant-b%Orders", "%RETRY%tenant-a%workers"} <= topics
    assert "Orders" not in topics and "%RETRY%workers" not in topics
    assert {"tenant-a%workers", "tenant-b%workers"} <= groups
    for ns, count in ((A, 5), (B, 4)):
        with Admin(brokers=broker.address, namespace=ns) as admin:
            assert sum(s.consumer_offset for s in admin.consume_stats("workers", "Orders")) == count


def test_a_pull_consumer_in_a_namespace_names_and_gets_bare_queues(broker):
    _topics(broker.address, A, "Orders")
    with Producer(brokers=broker.address, namespace=A) as producer:
        producer.send(Message("Orders", b"x"), queue=producer.fetch_publish_message_queue("Orders", 0))
    with Producer(brokers=broker.address, namespace=A) as producer:
        mq = producer.fetch_publish_message_queue("Orders", 0)
    consumer = PullConsumer(brokers=broker.address, namespace=A, group="pullers", auto_commit=False)
    consumer.assign([mq])
    consumer.start()
    try:
        assert consumer.assignment() == {mq} and mq.topic == "Orders"
        assert {q.topic for q in consumer.fetch_message_queues("Orders")} == {"Orders"}
        consumer.seek_to_begin(mq)
        msgs = []
        wait_until(lambda: msgs.extend(consumer.poll(0.5)) or msgs, 20, "the message polled")
        assert [(m.topic, m.body) for m in msgs] == [("Orders", b"x")] and msgs[0].message_queue == mq
        consumer.commit({msgs[0].message_queue: msgs[0].queue_offset + 1})
        assert consumer.committed(mq) == 1
    finally:
        consumer.shutdown()
    stored = MessageQueue("tenant-a%Orders", mq.broker_name, 0)
    with Admin(brokers=broker.address) as admin:
        assert admin.committed("tenant-a%pullers", stored) == 1
    with Admin(brokers=broker.address, namespace=A) as admin:
        # Admin wraps the names it is given and answers with stored ones, which it takes back as they are.
        assert admin.committed("pullers", mq) == admin.committed("pullers", stored) == 1
        assert admin.fetch_message_queues("Orders")[0].topic == "tenant-a%Orders"


@pytest.fixture
def fast_transaction_broker(broker_factory):
    return broker_factory(args=("--transaction-timeout-ms", "300", "--transaction-check-interval-ms", "300"))


def test_a_transaction_producer_in_a_namespace_is_checked_with_bare_names(fast_transaction_broker):
    broker = fast_transaction_broker
    for ns in (A, B):
        _topics(broker.address, ns, "Payments")
    checked: dict[str, list[str]] = {A: [], B: []}

    def checker(ns: str):
        def check(msg) -> LocalTransactionState:
            checked[ns].append(msg.topic)
            return LocalTransactionState.COMMIT_MESSAGE
        return check

    producers = {ns: TransactionProducer(brokers=broker.address, namespace=ns, producer_group="payers",
                                         topics=["Payments"], check_local_transaction=checker(ns)).start()
                 for ns in (A, B)}
    try:
        assert producers[A].settings.producer_group == "tenant-a%payers"
        result = producers[A].send_message_in_transaction(Message("Payments", b"orphan"),
                                                          lambda msg, arg: LocalTransactionState.UNKNOW)
        assert result.message_queue.topic == "Payments"
        wait_until(lambda: [m.body for m in stored_messages(broker.address, "tenant-a%Payments")] == [b"orphan"],
                   20, "the orphan committed through tenant-a's check", details=lambda: f"{checked}")
    finally:
        for p in producers.values():
            p.shutdown()
    assert checked[A] and set(checked[A]) == {"Payments"} and checked[B] == []


def test_bad_namespaces_and_names_are_refused_before_anything_is_sent(broker):
    with pytest.raises(InvalidArgumentError, match="namespace 'a%b' may only contain"):
        Producer(brokers=broker.address, namespace="a%b")
    with pytest.raises(InvalidArgumentError, match="at most 64 allowed"):
        Admin(brokers=broker.address, namespace="n" * 65)
    with pytest.raises(InvalidArgumentError, match="group name 'x%g' in namespace 'tenant-a' must not contain '%'"):
        PushConsumer(brokers=broker.address, namespace=A, group="x%g")
    _topics(broker.address, A, "Orders")
    with Producer(brokers=broker.address, namespace=A) as producer:
        with pytest.raises(InvalidArgumentError, match="topic name 'tenant-b%Orders' in namespace 'tenant-a'"):
            producer.send(Message("tenant-b%Orders", b"elsewhere"))
        with pytest.raises(InvalidArgumentError, match="must not contain '%'"):
            producer.send_async(Message("x%y", b"x")).result(10)
    assert stored_messages(broker.address, "tenant-a%Orders") == []


def test_the_cli_names_topics_and_groups_in_a_namespace(broker):
    addr = broker.address
    for ns in (A, B):
        created = table_rows(ok("topic", "create", "Orders", "--queues", "1", "--namespace", ns, broker=addr))
        assert {r["TOPIC"] for r in created} == {f"{ns}%Orders"}  # Admin's answers show the stored names
    ok("send", "Orders", "--body", "hello-a", "--namespace", A, broker=addr)
    ok("send", "Orders", "--count", "2", "--size", "3", "--namespace", B, broker=addr)
    lines = ok("consume", "Orders", "--group", "readers", "--from-where", "first", "--count", "1", "--json",
               "--namespace", A, broker=addr).splitlines()
    assert [(json.loads(x)["topic"], json.loads(x)["body"]) for x in lines] == [("Orders", "hello-a")]
    plain = ok("consume", "Orders", "--count", "2", "--json", "--namespace", B, broker=addr).splitlines()
    assert [json.loads(x)["topic"] for x in plain] == ["Orders", "Orders"]
    progress = json.loads(ok("group", "progress", "readers", "--namespace", A, "--json", broker=addr))
    assert {(r["topic"], r["consumer_offset"]) for r in progress} == {("tenant-a%Orders", 1), ("%RETRY%tenant-a%readers", 0)}
    listed = json.loads(ok("topic", "list", "--namespace", A, "--json", broker=addr))
    assert [r["topic"] for r in listed] == ["tenant-a%Orders"]
    groups = json.loads(ok("group", "list", "--namespace", A, "--json", broker=addr))
    assert [g["group"] for g in groups] == ["tenant-a%readers"]
    assert json.loads(ok("group", "list", "--namespace", B, "--json", broker=addr)) == []
    err = fails(1, "topic", "describe", "Orders", "--namespace", "bad%ns", broker=addr)
    assert "namespace 'bad%ns' may only contain letters" in err
    err = fails(1, "send", "Orders", "--body", "x", "--namespace", "n" * 65, broker=addr)
    assert "at most 64 allowed" in err
    with Admin(brokers=addr) as admin:
        assert [m.body for m in stored_messages(addr, "tenant-a%Orders")] == [b"hello-a"]
        assert "n" * 65 + "%Orders" not in admin.list_topics()
