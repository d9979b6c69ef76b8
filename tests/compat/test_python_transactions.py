"""The official Python client's transactional messages against a Tidemark broker: commit, rollback, and a
half message left open that the broker resolves by asking the producer (RecoverOrphanedTransactionCommand)."""

from __future__ import annotations

import threading

import pytest
from workload import stored_messages, wait_until

from tidemark.client import Admin


def visible(address: str, topic: str) -> list[bytes]:
    return [m.body for m in stored_messages(address, topic)]


@pytest.fixture
def fast_broker(broker_factory):
    b = broker_factory(args=("--transaction-timeout-ms", "300", "--transaction-check-interval-ms", "300"))
    with Admin(brokers=b.address) as admin:
        admin.create_topic("Payments", 2)
    return b


def checker(rmq, resolution):
    class Checker(rmq.TransactionChecker):
        def __init__(self) -> None:
            self.checked: list[str] = []
            self.lock = threading.Lock()

        def check(self, message):
            with self.lock:
                self.checked.append(next(iter(message.keys), ""))
            return resolution
    return Checker()


def half(rmq, body: bytes, key: str):
    m = rmq.Message()
    m.topic = "Payments"
    m.body = body
    m.keys = key
    return m


def test_official_transactions_commit_and_roll_back(fast_broker, official, rmq):
    check = checker(rmq, rmq.TransactionResolution.ROLLBACK)
    producer = official(rmq.Producer(rmq.ClientConfiguration(fast_broker.address, rmq.Credentials()), ("Payments",),
                                     check))
    for body, key, end in ((b"kept", "p1", "commit"), (b"dropped", "p2", "rollback")):
        transaction = producer.begin_transaction()
        receipt = producer.send(half(rmq, body, key), transaction)
        assert receipt.transaction_id, "a half message's receipt carries its transaction id"
        assert visible(fast_broker.address, "Payments") == ([b"kept"] if key == "p2" else [])
        getattr(transaction, end)()
    assert visible(fast_broker.address, "Payments") == [b"kept"]
    with Admin(brokers=fast_broker.address) as admin:
        assert admin.list_transactions() == []
    assert check.checked == []


def test_an_orphaned_half_message_is_committed_through_the_producers_checker(fast_broker, official, rmq):
    check = checker(rmq, rmq.TransactionResolution.COMMIT)
    producer = official(rmq.Producer(rmq.ClientConfiguration(fast_broker.address, rmq.Credentials()), ("Payments",),
                                     check))
    producer.send(half(rmq, b"orphan", "p3"), producer.begin_transaction())  # never ended by the sender
    wait_until(lambda: visible(fast_broker.address, "Payments") == [b"orphan"], 20,
               "committed after the broker's check", details=lambda: f"checked {check.checked}")
    assert check.checked[0] == "p3"
