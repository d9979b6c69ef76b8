"""The official Python client with a namespace (`ClientConfiguration(..., namespace=NS)`): everything works as
without one, two namespaces with the same topic and group names never meet (messages, offsets, retries,
dead letters, transaction checks), messages come back with the bare topic and the namespace, and the
broker stores the names as RocketMQ does, `NS%name` (common/namespaces.py)."""

from __future__ import annotations

import threading
import time

import pytest
from brokerproc import BrokerProcess
from workload import stored_messages, wait_until

from tidemark.client import Admin, NotFoundError

A, B = "tenant-a", "tenant-b"


def _config(rmq, broker, namespace: str, credentials=("", "")):
    return rmq.ClientConfiguration(broker.address, rmq.Credentials(*credentials), namespace=namespace)


def _message(rmq, topic: str, body: bytes, **fields):
    m = rmq.Message()
    m.topic, m.body = topic, body
    for name, value in fields.items():
        setattr(m, name, value)
    return m


def _committed(address: str, namespace: str, group: str, topic: str) -> int:
    with Admin(brokers=address, namespace=namespace) as admin:
        return sum(max(s.consumer_offset, 0) for s in admin.consume_stats(group, topic))


def _receive_all(consumer, want: int, seconds: float = 30) -> list:
    got: list = []
    deadline = time.monotonic() + seconds
    while len(got) < want and time.monotonic() < deadline:
        for m in consumer.receive(16, 15):
            got.append(m)
            consumer.ack(m)
    return got


def test_two_namespaces_with_the_same_names_never_meet(broker, official, rmq):
    for ns in (A, B):
        with Admin(brokers=broker.address, namespace=ns) as admin:
            admin.create_topic("Orders", 2)
    for ns, count in ((A, 5), (B, 3)):
        producer = official(rmq.Producer(_config(rmq, broker, ns), ("Orders",)))
        for i in range(count):
            producer.send(_message(rmq, "Orders", f"{ns}-{i}".encode(), tag="T"))
    got = {}
    for ns, count in ((A, 5), (B, 3)):
        consumer = official(rmq.SimpleConsumer(_config(rmq, broker, ns), "workers",
                                               {"Orders": rmq.FilterExpression("T")}, await_duration=2))
        got[ns] = _receive_all(consumer, count)
        assert consumer.receive(16, 15) == [], f"{ns}'s consumer sees only its own namespace's messages"
    for ns, count in ((A, 5), (B, 3)):
        assert sorted(m.body for m in got[ns]) == [f"{ns}-{i}".encode() for i in range(count)]
        # What the client compares with its subscriptions and sends back in its acks: the bare topic.
        assert {(m.topic, m.namespace) for m in got[ns]} == {("Orders", ns)}
        wait_until(lambda ns=ns, count=count: _committed(broker.address, ns, "workers", "Orders") == count, 10,
                   f"{ns}'s group committed its own messages")
    with Admin(brokers=broker.address) as admin:
        topics = admin.list_topics()
        groups = {g.group for g in admin.list_groups()}
    assert {"tenant-a%Orders", "tenant-b%Orders"} <= set(topics) and "Orders" not in topics
    assert {"tenant-a%workers", "tenant-b%workers"} <= groups and "workers" not in groups


def test_a_bad_namespace_is_refused_and_stores_nothing(broker, official, rmq, caplog):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Orders", 1)
        before = admin.list_topics(include_system=True)
    producer = official(rmq.Producer(_config(rmq, broker, "bad%ns"), ("Orders",)))
    with pytest.raises(Exception, match="route"):  # the client's words: it reports the refusal in its log
        producer.send(_message(rmq, "Orders", b"x"))
    # The broker's answer, as the client logged it: BAD_REQUEST (40000) naming the namespace.
    assert any("40000" in r.getMessage() and "namespace 'bad%ns' may only contain" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert stored_messages(broker.address, "Orders") == []
    with Admin(brokers=broker.address) as admin:
        assert admin.list_topics(include_system=True) == before


@pytest.fixture
def fast_retry_broker(broker_factory):
    """Retries after 1 s, 2 s, 3 s... (delay levels 3 on), so a push consumer's nacks take seconds."""
    return broker_factory(args=("--delay-levels", "1s 1s 1s 2s 3s 4s 5s"))


def test_each_namespaces_retries_and_dead_letters_stay_its_own(fast_retry_broker, official, rmq):
    broker = fast_retry_broker
    for ns in (A, B):
        with Admin(brokers=broker.address, namespace=ns) as admin:
            admin.create_topic("Jobs", 2)
            admin.update_group_config("jobs", retry_max_times=2)  # three attempts in all
    attempts: dict[str, list[tuple[int, str, str]]] = {A: [], B: []}
    done = threading.Event()

    def listener(ns: str, fail: bool):
        class Listener(rmq.MessageListener):
            def consume(self, message):
                attempts[ns].append((message.delivery_attempt, message.topic, message.namespace))
                if not fail:
                    done.set()
                return rmq.ConsumeResult.FAILURE if fail else rmq.ConsumeResult.SUCCESS
        return Listener()

    # Same topic and group names: tenant-a's consumer fails every delivery, tenant-b's takes its message.
    for ns in (A, B):
        official(rmq.PushConsumer(_config(rmq, broker, ns), "jobs", listener(ns, fail=ns == A),
                                  {"Jobs": rmq.FilterExpression()}))
        official(rmq.Producer(_config(rmq, broker, ns), ("Jobs",))).send(_message(rmq, "Jobs", ns.encode()))

    def dead(ns: str) -> list:
        with Admin(brokers=broker.address, namespace=ns) as admin:
            try:
                return admin.dead_letters("jobs")
            except NotFoundError:
                return []  # no DLQ yet

    wait_until(lambda: len(dead(A)) == 1, 60, "tenant-a's message dead-lettered")
    assert done.wait(30)
    assert [m.body for m in dead(A)] == [A.encode()] and dead(B) == []
    assert attempts[A] == [(1, "Jobs", A), (2, "Jobs", A), (3, "Jobs", A)]
    assert attempts[B] == [(1, "Jobs", B)]
    with Admin(brokers=broker.address) as admin:
        system = set(admin.list_topics(include_system=True))
    assert "%DLQ%tenant-a%jobs" in system and "%DLQ%tenant-b%jobs" not in system and "%DLQ%jobs" not in system
    for ns in (A, B):
        wait_until(lambda ns=ns: _committed(broker.address, ns, "jobs", "Jobs") == 1, 20, f"{ns}'s message done")


def test_fifo_in_a_namespace_keeps_each_message_groups_order(broker, official, rmq):
    with Admin(brokers=broker.address, namespace=A) as admin:
        admin.create_topic("Fifo", 2)
        admin.update_group_config("fifo-group", consume_orderly=True)
    producer = official(rmq.Producer(_config(rmq, broker, A), ("Fifo",)))
    for n in range(10):
        for group in ("a", "b"):
            producer.send(_message(rmq, "Fifo", f"{group}-{n}".encode(), message_group=group))
    consumer = official(rmq.SimpleConsumer(_config(rmq, broker, A), "fifo-group", {"Fifo": rmq.FilterExpression()},
                                           await_duration=2))
    got = _receive_all(consumer, 20)
    for group in ("a", "b"):
        assert [m.body for m in got if m.message_group == group] == [f"{group}-{n}".encode() for n in range(10)]
    assert {(m.topic, m.namespace) for m in got} == {("Fifo", A)}


@pytest.fixture
def fast_transaction_broker(broker_factory):
    return broker_factory(args=("--transaction-timeout-ms", "300", "--transaction-check-interval-ms", "300"))


def test_transactions_in_a_namespace_are_checked_by_its_own_producers(fast_transaction_broker, official, rmq):
    broker = fast_transaction_broker
    for ns in (A, B):
        with Admin(brokers=broker.address, namespace=ns) as admin:
            admin.create_topic("Payments", 2)
    checked: dict[str, list[tuple[str, str, str]]] = {A: [], B: []}

    def checker(ns: str):
        class Checker(rmq.TransactionChecker):
            def check(self, message):
                checked[ns].append((next(iter(message.keys), ""), message.topic, message.namespace))
                return rmq.TransactionResolution.COMMIT
        return Checker()

    producers = {ns: official(rmq.Producer(_config(rmq, broker, ns), ("Payments",), checker(ns))) for ns in (A, B)}
    transaction = producers[A].begin_transaction()
    producers[A].send(_message(rmq, "Payments", b"kept", keys="p1"), transaction)
    transaction.commit()
    producers[A].send(_message(rmq, "Payments", b"orphan", keys="p2"), producers[A].begin_transaction())
    wait_until(lambda: sorted(m.body for m in stored_messages(broker.address, "tenant-a%Payments"))
               == [b"kept", b"orphan"], 20, "the orphan committed after tenant-a's check",
               details=lambda: f"checked {checked}")
    # Only tenant-a's producer was asked, with the bare topic and its namespace.
    assert checked[A][0] == ("p2", "Payments", A) and checked[B] == []
    assert stored_messages(broker.address, "tenant-b%Payments") == []


ROOT = ("root", "root-secret-1")
TENANT = ("tenant-a-app", "tenant-a-secret-1")


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("nsauth") / "data",
                           args=("--auth", "--init-user", ":".join(ROOT))).start()
    with Admin(brokers=broker.address, credentials=ROOT) as admin:
        for ns in (A, B):
            admin.create_topic(f"{ns}%Secure", 2)
        admin.create_user(*TENANT)
        # One namespace, granted whole: every topic and group whose stored name starts with "tenant-a%".
        admin.create_acl(TENANT[0], f"Topic:{A}%*", ["Pub", "Sub"], "Allow")
        admin.create_acl(TENANT[0], f"Group:{A}%*", ["Sub"], "Allow")
    yield broker
    broker.kill()


def test_an_acl_on_a_namespace_prefix_grants_that_namespace_only(secured, official, rmq, caplog):
    producer = official(rmq.Producer(_config(rmq, secured, A, TENANT), ("Secure",)))
    receipt = producer.send(_message(rmq, "Secure", b"allowed"))
    consumer = official(rmq.SimpleConsumer(_config(rmq, secured, A, TENANT), "readers",
                                           {"Secure": rmq.FilterExpression()}, await_duration=2))
    assert [m.message_id for m in _receive_all(consumer, 1)] == [receipt.message_id]
    other = official(rmq.Producer(_config(rmq, secured, B, TENANT), ("Secure",)))
    with pytest.raises(Exception, match="route"):  # refused at its route lookup: the client logs why
        other.send(_message(rmq, "Secure", b"refused"))
    assert any("40300" in r.getMessage() and "on Topic:tenant-b%Secure" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    with Admin(brokers=secured.address, credentials=ROOT) as admin:
        assert not any(m.body == b"refused" for mq in admin.fetch_message_queues(f"{B}%Secure")
                       for m in admin.pull(mq, 0, max_nums=100).messages)
