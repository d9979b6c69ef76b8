"""Transactional messages against real brokers: commit, rollback, checks, and kill -9 at every step."""

from __future__ import annotations

import json
import threading

import pytest
from workload import stored_messages, wait_until

from tidemark.client import Admin, LocalTransactionState, Message, TransactionProducer

COMMIT, ROLLBACK, UNKNOW = (LocalTransactionState.COMMIT_MESSAGE, LocalTransactionState.ROLLBACK_MESSAGE,
                            LocalTransactionState.UNKNOW)
# Checks every 300 ms; up to 100 of them, so a producer whose watch reconnects slowly after a broker restart
# (gRPC's reconnect backoff) is still asked before the half is rolled back (checks count with no producer).
FAST_CHECKS = ("--transaction-timeout-ms", "300", "--transaction-check-interval-ms", "300",
               "--transaction-check-max", "100")


def visible(address: str, topic: str) -> list[bytes]:
    """The bodies consumers can read on the topic."""
    return [m.body for m in stored_messages(address, topic)]


def open_halves(address: str) -> list:
    with Admin(brokers=address) as admin:
        return admin.list_transactions()


class Checks:
    """A check_local_transaction answering from a table, as an application answers from its database."""

    def __init__(self, answer: LocalTransactionState) -> None:
        self.answer = answer
        self.asked: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, msg) -> LocalTransactionState:
        with self._lock:
            self.asked.append(msg.keys)
        return self.answer


@pytest.fixture
def fast_broker(broker_factory):
    b = broker_factory(args=FAST_CHECKS)
    with Admin(brokers=b.address) as admin:
        admin.create_topic("Orders", 2)
    return b


def producer(broker, checks, group="orders", **kw) -> TransactionProducer:
    return TransactionProducer(brokers=broker.address, producer_group=group, check_local_transaction=checks,
                               topics=["Orders"], **kw).start()


def test_commit_and_rollback_decide_what_consumers_see(fast_broker):
    checks = Checks(UNKNOW)
    with producer(fast_broker, checks) as p:
        committed = p.send_message_in_transaction(Message("Orders", b"paid", keys="o1"), lambda m, a: COMMIT)
        rolled = p.send_message_in_transaction(Message("Orders", b"cancelled", keys="o2"), lambda m, a: ROLLBACK)
        assert committed.local_transaction_state is COMMIT and committed.transaction_id == committed.msg_id
        assert rolled.local_transaction_state is ROLLBACK
        assert visible(fast_broker.address, "Orders") == [b"paid"]
        assert open_halves(fast_broker.address) == []
    assert checks.asked == [], "ended transactions are never checked"


def test_an_unknown_transaction_is_checked_and_committed(fast_broker):
    checks = Checks(COMMIT)
    with producer(fast_broker, checks) as p:
        result = p.send_message_in_transaction(Message("Orders", b"later", keys="o3"), lambda m, a: UNKNOW)
        assert result.local_transaction_state is UNKNOW
        assert visible(fast_broker.address, "Orders") == []
        wait_until(lambda: visible(fast_broker.address, "Orders") == [b"later"], 15, "committed by its check")
    assert checks.asked[0] == "o3"


def test_a_check_goes_to_another_producer_of_the_group_when_the_sender_died(fast_broker):
    sender_checks, survivor_checks = Checks(UNKNOW), Checks(ROLLBACK)
    survivor = producer(fast_broker, survivor_checks)  # the same client id as the sender's: one process
    try:
        sender = producer(fast_broker, sender_checks)
        sender.send_message_in_transaction(Message("Orders", b"orphan", keys="o4"), lambda m, a: UNKNOW)
        sender.shutdown()  # gone before any check
        wait_until(lambda: open_halves(fast_broker.address) == [], 15, "rolled back through the survivor")
    finally:
        survivor.shutdown()
    assert survivor_checks.asked and set(survivor_checks.asked) == {"o4"}
    assert visible(fast_broker.address, "Orders") == []


def test_a_transaction_nobody_decides_is_rolled_back_after_the_maximum_checks(broker_factory, monkeypatch, capsys):
    from tidemark.client.cli import main as cli

    fast_broker = broker_factory(args=(*FAST_CHECKS, "--transaction-check-max", "3"))
    with Admin(brokers=fast_broker.address) as admin:
        admin.create_topic("Orders", 2)
    checks = Checks(UNKNOW)
    with producer(fast_broker, checks) as p:
        p.send_message_in_transaction(Message("Orders", b"limbo", keys="o5"), lambda m, a: UNKNOW)
        wait_until(lambda: any(h.checks >= 1 for h in open_halves(fast_broker.address)), 15, "a check sent")
        monkeypatch.setattr(cli, "setup_logging", lambda *a, **k: None)
        assert cli.main(["transaction", "list", "--broker", fast_broker.address, "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert (row["group"], row["topic"], row["max_checks"]) == ("orders", "Orders", 3) and row["checks"] >= 1
        wait_until(lambda: open_halves(fast_broker.address) == [], 15, "discarded after 3 checks")
    assert len(checks.asked) == 3
    assert visible(fast_broker.address, "Orders") == []
    assert "event=transaction_discarded" in fast_broker.log_text()


@pytest.mark.parametrize("decision", [COMMIT, ROLLBACK])
def test_kill_between_the_half_message_and_its_end_is_decided_by_a_check(fast_broker, decision):
    checks = Checks(decision)

    def local_transaction(msg, arg):
        fast_broker.kill()  # kill -9 with the half message stored and no end sent
        return decision

    with producer(fast_broker, checks) as p:
        p.send_message_in_transaction(Message("Orders", b"crash", keys="o6"), local_transaction)
        fast_broker.start()
        wait_until(lambda: open_halves(fast_broker.address) == [], 40, "decided by a check after the restart")
    assert checks.asked, "decided by the producer's answer, not by the check limit"
    assert visible(fast_broker.address, "Orders") == ([b"crash"] if decision is COMMIT else [])


def test_kill_between_the_op_record_and_the_message_still_commits_exactly_once(broker_factory):
    b = broker_factory(args=FAST_CHECKS, env={"TIDEMARK_CRASH_POINT": "transaction-op-stored"})
    with Admin(brokers=b.address) as admin:
        admin.create_topic("Orders", 2)
    checks = Checks(COMMIT)
    with producer(b, checks) as p:
        p.send_message_in_transaction(Message("Orders", b"torn", keys="o7"), lambda m, a: COMMIT)
        wait_until(lambda: b.proc.poll() is not None, 10, "the broker died at the crash point")
        b.proc = None
        b.env = {}
        b.start()
        assert "event=transaction_restored" in b.log_text()
        assert visible(b.address, "Orders") == [b"torn"]
        assert open_halves(b.address) == []
        b.kill()
        b.start()  # the restored message is found where its op says: not put again
        assert visible(b.address, "Orders") == [b"torn"]
    assert checks.asked == []


def test_a_retried_half_message_is_stored_once_and_commits_once(fast_broker, monkeypatch):
    """Regression (issue 27, found by the fault checker under connection resets): a half message whose
    answer was lost was sent again and stored twice; the producer committed the second, and the check of
    the first, answered from the application's state, committed it too: two copies on the topic. The
    broker answers a retried half (same producer group, same message id) with the half it holds."""
    from tidemark.client.errors import UnavailableError
    from tidemark.client.remoting.connection import BrokerConnection

    original = BrokerConnection.send
    calls: list[int] = []

    async def send(self, topic, messages, **kw):
        calls.append(len(messages))
        results = await original(self, topic, messages, **kw)
        if len(calls) == 1:
            raise UnavailableError("Socket closed (the answer to the half message was lost)")
        return results

    monkeypatch.setattr(BrokerConnection, "send", send)
    checks = Checks(COMMIT)  # the application committed it: a check of any copy says so
    with producer(fast_broker, checks) as p:
        result = p.send_message_in_transaction(Message("Orders", b"once", keys="o-1"), lambda m, a: COMMIT)
        assert result.local_transaction_state is COMMIT and len(calls) == 2
        wait_until(lambda: not open_halves(fast_broker.address), 15, "no half message left open")
    assert visible(fast_broker.address, "Orders") == [b"once"]
    assert checks.asked == [], "nothing was left for a check to decide"


def test_a_half_retried_after_a_check_committed_its_first_copy_is_not_stored_again(fast_broker, monkeypatch):
    """Regression (issue 27, long run, partition seeds 9200 and 9212: a transaction committed twice). The
    answer to a half was lost; before the producer's retry arrived, the check of that half (answered from
    the application's state) had committed it, so the broker no longer held it open and stored the retry
    as a second half, which the producer then committed too."""
    import asyncio

    from tidemark.client.errors import UnavailableError
    from tidemark.client.remoting.connection import BrokerConnection
    from tidemark.common.protocol import PropertyKey

    original = BrokerConnection.send
    calls: list[int] = []

    async def send(self, topic, messages, **kw):
        calls.append(len(messages))
        results = await original(self, topic, messages, **kw)
        if len(calls) == 1:  # the answer is lost, and the retry waits until a check committed the half
            await asyncio.to_thread(wait_until, lambda: visible(fast_broker.address, "Orders") == [b"once"], 15,
                                    "the check to commit the first half")
            raise UnavailableError("Socket closed (the answer to the half message was lost)")
        return results

    monkeypatch.setattr(BrokerConnection, "send", send)
    checks = Checks(COMMIT)
    with producer(fast_broker, checks) as p:
        result = p.send_message_in_transaction(Message("Orders", b"once", keys="o-1"), lambda m, a: COMMIT)
        # (Checked at least once, the first copy: a check whose answer takes longer than the 300 ms interval, on
        # a loaded machine, is asked again, as RocketMQ asks about an open half every interval until it ends.)
        assert result.local_transaction_state is COMMIT and len(calls) == 2 and set(checks.asked) == {"o-1"}
        assert not open_halves(fast_broker.address)
    assert visible(fast_broker.address, "Orders") == [b"once"]
    # A new transaction that reuses the message id (another body) is a new one, stored and committed.
    with producer(fast_broker, checks) as p:
        again = p.send_message_in_transaction(Message("Orders", b"twice", keys="o-1", properties={
            PropertyKey.UNIQ_KEY: result.msg_id}), lambda m, a: COMMIT)
        assert again.msg_id == result.msg_id
    wait_until(lambda: sorted(visible(fast_broker.address, "Orders")) == [b"once", b"twice"], 15,
               "the new transaction with the reused message id")


def test_a_half_sent_again_while_its_first_send_waits_for_fsync_is_stored_once(broker_factory):
    """Regression (issue 27, long run, kill seed 8017: a transaction committed twice). Under flush sync a
    half message was registered as open only after its fsync; a retry arriving meanwhile (its first
    answer lost to a reset) found nothing and was stored again, and the check of the second copy
    committed it too. A half is open from the moment it is in the log."""
    from concurrent.futures import ThreadPoolExecutor

    from tidemark.client import Producer
    from tidemark.common.protocol import PropertyKey

    b = broker_factory(args=(*FAST_CHECKS, "--flush", "sync"))
    with Admin(brokers=b.address) as admin:
        admin.create_topic("Orders", 4)
    half = Message("Orders", b"once", keys="o-1", properties={
        PropertyKey.TRANSACTION_PREPARED: "true", PropertyKey.PRODUCER_GROUP: "orders",
        PropertyKey.UNIQ_KEY: "7A84E33DDD08000001A21DFBE9C30056"})
    with Producer(brokers=b.address) as p, ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: p.send(half), range(6)))  # the same half, six times at once
    assert len({(r.message_queue.queue_id, r.queue_offset) for r in results}) == 1, results
    assert [h.msg_id for h in open_halves(b.address)] == ["7A84E33DDD08000001A21DFBE9C30056"]


def test_a_committed_message_sent_back_by_the_consumer_itself_is_a_plain_retry(fast_broker):
    """The committed copy carries TRAN_MSG=true (as RocketMQ's stored copy does). When the broker cannot
    take a consumer's send-back, the consumer sends a copy to the retry topic itself; that copy must not
    be a half message, which the broker refuses on a retry topic: the message was consumed locally again
    instead of being retried."""
    import asyncio

    from tidemark.client.consumer.send_back import SendBackService
    from tidemark.client.remoting.cluster import BrokerCluster
    from tidemark.common.protocol import PropertyKey

    with producer(fast_broker, Checks(UNKNOW)) as p:
        p.send_message_in_transaction(Message("Orders", b"paid", keys="o1"), lambda m, a: COMMIT)
    [committed] = stored_messages(fast_broker.address, "Orders")
    assert committed.properties[PropertyKey.TRANSACTION_PREPARED] == "true"
    committed.commit_log_offset += 1 << 30  # nothing there: the broker's send-back fails, the fallback runs

    async def send_back() -> tuple[bool, int]:
        cluster = BrokerCluster([fast_broker.address])
        try:
            service = SendBackService(cluster=cluster, group="billing", client_id="c1", max_reconsume_times=0)
            return await service.send_back(committed, delay_level=1), service.fallback_sends
        finally:
            await cluster.close()

    assert asyncio.run(send_back()) == (True, 1)
    wait_until(lambda: visible(fast_broker.address, "%RETRY%billing") == [b"paid"], 30, "the retry, after 1 s")
    [retry] = stored_messages(fast_broker.address, "%RETRY%billing")
    assert PropertyKey.TRANSACTION_PREPARED not in retry.properties and retry.reconsume_times == 1
    assert open_halves(fast_broker.address) == []
