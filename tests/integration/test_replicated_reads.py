"""Readers of a master see only what a replica holds (Kafka's high watermark), so a failover never makes
a consumer skip a message.

Found by the fault checker (tests/faults, the failover scenario): a consumer read a record the master had
stored but no replica had copied (a send that timed out); the master was killed, its replica promoted, and
the next acknowledged message went to the same queue offset, which the consumer had already passed: that
message never reached its group.
"""

from __future__ import annotations

import pytest
from faults.proxy import FaultProxy
from workload import create_topic, wait_until

from tidemark.client import (
    Admin,
    Message,
    MessageQueue,
    Producer,
    RequestTimeoutError,
    UnavailableError,
)

TOPIC = "Watermark"
QUEUE = MessageQueue(TOPIC, "broker-a", 0)
REPLICA_ID = 1  # every test's replica


def readable(address: str, offset: int) -> list[bytes]:
    """What a reader gets from offset on (one pull, no wait)."""
    with Admin(brokers=address) as admin:
        return [m.body for m in admin.pull(QUEUE, offset, max_nums=64).messages]


@pytest.fixture
def pair(broker_factory):
    """(master, replica, link): the replica copies the master through a fault proxy (`link`), whose
    blackhole holds what the master sends and drops it if the master dies meanwhile."""
    links = []

    def make(replication: str, timeout_ms: int | None = None):
        # Async: a long timeout keeps a silent replica in sync (its reads bounded) for the whole test; sync:
        # a short one keeps the send that waits for it short.
        timeout_ms = timeout_ms or (1000 if replication == "sync" else 10_000)
        master = broker_factory("broker-a", args=("--replication", replication, "--replication-timeout-ms",
                                                  str(timeout_ms)))
        link = FaultProxy(master.address, name="replica-link")
        links.append(link)
        replica = broker_factory("broker-a", args=("--broker-id", str(REPLICA_ID), "--master", link.address))
        with Admin(brokers=master.address) as admin:
            admin.create_topic(TOPIC, 1)
        return master, replica, link

    yield make
    for link in links:
        link.close()


def send(address: str, body: bytes, **kw) -> int:
    with Producer(brokers=address, retry_times_when_send_failed=0, **kw) as producer:
        return producer.send(Message(TOPIC, body), queue=QUEUE).queue_offset


@pytest.mark.parametrize("replication", ["sync", "async"])
def test_a_record_no_replica_holds_is_not_read_and_a_failover_skips_nothing(pair, replication):
    master, replica, link = pair(replication)
    base = warm_up(master)
    with Admin(brokers=master.address) as admin:
        log_end = admin.broker_status_at(master.address).commit_log_max_offset

    link.blackhole(True)  # the replica stays connected and gets nothing
    try:
        if replication == "sync":
            with pytest.raises(RequestTimeoutError):  # stored on the master, no replica has it
                send(master.address, b"in-doubt")
        else:
            assert send(master.address, b"not-copied") == base  # acknowledged at once, copied later
        with Admin(brokers=master.address) as admin:
            # The master stored it (its commit log grew), and readers do not see it (the max offset they
            # are told of stays where the replica is).
            assert admin.broker_status_at(master.address).commit_log_max_offset > log_end
            assert admin.max_offset(QUEUE) == base
        assert readable(master.address, base) == [], "a reader saw a record no replica holds"
        master.kill()  # ... and the master is gone before the replica got it: the held bytes are dropped (as a
        link.reset()   # dead machine's would be; a killed process's kernel would still send them)
    finally:
        link.heal()

    with Admin(brokers=replica.address) as admin:
        admin.promote(replica.address)
    assert send(replica.address, b"after-failover") == base, "the promoted replica reuses the offset"
    assert readable(replica.address, base) == [b"after-failover"]


@pytest.mark.parametrize("replication", ["sync", "async"])
def test_what_the_replica_acknowledges_becomes_readable(pair, replication):
    master, replica, link = pair(replication)
    base = warm_up(master)
    link.blackhole(True)
    try:
        try:
            send(master.address, b"second")
        except RequestTimeoutError:
            assert replication == "sync"
        assert readable(master.address, base) == []
    finally:
        link.heal()
    # The replica catches up: what it acknowledges is readable.
    wait_until(lambda: readable(master.address, base) == [b"second"], 15, "the copied message readable")


def test_async_reads_are_not_held_by_a_replica_that_fell_behind(pair):
    """With async replication a replica that stops acknowledging no longer bounds reads once it is out of
    sync (its lag past max(replication timeout, 2 s)): the master's consumers go on."""
    master, _, link = pair("async", 1000)  # out of sync after max(1 s, two heartbeats)
    base = warm_up(master)
    link.blackhole(True)
    try:
        assert send(master.address, b"second") == base
        wait_until(lambda: readable(master.address, base) == [b"second"], 15,
                   "reads unbounded once the replica is out of sync")
    finally:
        link.heal()


def warm_up(master) -> int:
    """Until the replica is in sync: a send acknowledged, readable, and the master counting the replica
    in sync; the queue offset of the next send."""
    acked: list[int] = []
    wait_until(lambda: acked.append(_try_send(master.address, b"warm-up")) or acked[-1] is not None, 30,
               "a send acknowledged")
    wait_until(lambda: len(readable(master.address, 0)) > acked[-1], 10, "what was sent readable")
    end = len(readable(master.address, 0))
    with Admin(brokers=master.address) as admin:
        assert admin.max_offset(QUEUE) == end
        # Async reads are bounded only while the master counts a replica in sync (readable above proves
        # nothing before a replica connected): what each test blackholes must be a replica that holds
        # everything and said so. Connected, or level with the master by its own log, is not that: its
        # acknowledgement may still be on the way (and then held by the blackhole).
        wait_until(lambda: REPLICA_ID in admin.broker_status_at(master.address).in_sync_replicas, 15,
                   "the master to count the replica in sync")
    return end


def _try_send(address: str, body: bytes) -> int | None:
    try:
        return send(address, body)
    except Exception:
        return None


def test_a_promoted_replica_knows_every_producer_sequence_and_answers_a_retry_as_a_duplicate(pair):
    """Found by the fault checker (failover scenario, idempotence on): a batch the master stored and
    replicated, whose answer the producer never got, was stored again by the promoted replica (it did not
    know the producer id: UnknownProducerError, a new id, a second copy). The replica now holds the
    producer table from the replication stream, so the same sequence is a duplicate there."""
    from brokerproc import BrokerStubs

    from tidemark.common.records import RecordBatchBuilder, encode_properties
    from tidemark.v1 import messaging_pb2

    master, replica, _ = pair("sync")
    base = warm_up(master)

    def produce(address: str, producer_id: int, seq: int, body: bytes):
        builder = RecordBatchBuilder(TOPIC)
        builder.append(body, encode_properties({"UNIQ_KEY": body.hex()}))
        with BrokerStubs(address) as stubs:
            [answer] = stubs.messaging.Produce(iter([messaging_pb2.ProduceRequest(
                request_id=1, topic=TOPIC, queue_id=0, count=1, records=bytes(builder.buffer), producer_id=producer_id,
                producer_epoch=0, base_sequence=seq)]), timeout=10)
        return answer

    with BrokerStubs(master.address) as stubs:
        producer_id = stubs.messaging.InitProducer(messaging_pb2.InitProducerRequest(topic=TOPIC), timeout=10).producer_id
    assert produce(master.address, producer_id, 0, b"seq-0").code == 0
    stored = produce(master.address, producer_id, 1, b"seq-1")  # answered; say the answer was lost
    assert stored.code == 0 and stored.first_queue_offset == base + 1
    master.kill()
    with Admin(brokers=replica.address) as admin:
        admin.promote(replica.address)
    again = produce(replica.address, producer_id, 1, b"seq-1")
    assert again.code == 0 and again.duplicate and again.first_queue_offset == base + 1, again
    assert produce(replica.address, producer_id, 2, b"seq-2").first_queue_offset == base + 2
    assert readable(replica.address, base) == [b"seq-0", b"seq-1", b"seq-2"]


def test_a_replica_takes_each_commit_within_milliseconds_not_at_the_next_mirror(pair):
    """Found by the fault checker (failover scenario): offsets mirrored every second moved back by up to a
    second of commits when the replica was promoted (or read while the master was away). Commits reach the
    replica on the replication stream: each one is there well before the next one-second mirror (ten in a
    row within 500 ms each: the mirror alone would do that about once in a thousand runs)."""
    master, replica, _ = pair("sync")
    warm_up(master)
    for i in range(10):
        send(master.address, b"m%d" % i)
    with Admin(brokers=master.address) as on_master, Admin(brokers=replica.address) as on_replica:
        for value in range(1, 11):
            on_master.commit("watchers", {QUEUE: value})
            wait_until(lambda v=value: on_replica.committed("watchers", QUEUE) == v, 0.5,
                       f"commit {value} on the replica within 500 ms")


def checkpointed(master) -> int | None:
    """The replicated end the master last wrote (broker/cluster/replication_checkpoint.py), None before any."""
    import json

    path = master.data_dir / "config" / "replicationCheckpoint.json"
    return json.loads(path.read_text())["confirmed"] if path.exists() else None


def test_a_restarted_sync_master_keeps_reads_bounded_until_its_replica_acknowledges_again(pair):
    # A known limit until now: the bound lived in memory, so a sync master restarted before its replica
    # came back showed readers a record no replica held (here one whose send timed out).
    master, _, link = pair("sync")
    base = warm_up(master)
    wait_until(lambda: (checkpointed(master) or 0) > 0 and readable(master.address, 0)
               and checkpointed(master) >= _log_end(master), 15, "the replicated end checkpointed")
    link.blackhole(True)
    try:
        with pytest.raises(RequestTimeoutError):
            send(master.address, b"in-doubt")
        master.kill()
        link.reset()  # the held bytes are dropped: the replica never gets the record
        master.start()  # the replica cannot reach it through the blackholed link
        assert readable(master.address, base) == [], "after the restart a reader saw a record no replica holds"
        with Admin(brokers=master.address) as admin:
            assert admin.max_offset(QUEUE) == base
    finally:
        link.heal()
    # The replica reconnects, copies the record and acknowledges it: now it is readable.
    wait_until(lambda: readable(master.address, base) == [b"in-doubt"], 30, "the copied record readable")


def test_a_fenced_async_master_serves_no_reads_past_what_its_replica_acknowledged(namesrv_factory, broker_factory):
    # Async reads are bounded only while a replica is in sync; once the master is fenced (its replica was
    # promoted), they are bounded whatever the mode: its tail sits where the new master stores other messages.
    ns = namesrv_factory()
    fast = ("--namesrv", ns.address, "--register-interval-ms", "300")
    master = broker_factory("broker-a", args=("--replication", "async", "--replication-timeout-ms", "10000", *fast))
    link = FaultProxy(master.address, name="replica-link")
    try:
        replica = broker_factory("broker-a", args=("--broker-id", str(REPLICA_ID), "--master", link.address, *fast))
        with Admin(brokers=master.address) as admin:
            admin.create_topic(TOPIC, 1)
        base = warm_up(master)
        link.blackhole(True)
        assert send(master.address, b"only-here") == base
        link.reset()  # the replica's stream ends (and its next one is held): async reads are unbounded again
        wait_until(lambda: readable(master.address, base) == [b"only-here"], 30, "async reads unbounded")
        with Admin(brokers=replica.address) as admin:
            admin.promote(replica.address)
        wait_until(lambda: "event=broker_fenced" in master.log_text(), 15, "the old master fenced")
        assert readable(master.address, base) == [], "a fenced master served a record no replica holds"
        assert send(replica.address, b"new-master") == base  # what the new master holds at that offset
    finally:
        link.close()


def _log_end(master) -> int:
    with Admin(brokers=master.address) as admin:
        return admin.broker_status_at(master.address).commit_log_max_offset


def test_a_replica_answers_offset_queries_only_once_it_copied_its_masters(broker_factory):
    """A group's offset never reads older than one already read: a replica restarted while its master is
    down holds what its file says, older than what the master answered since, so it refuses the query
    (UNAVAILABLE, retriable) until it copied the master's offsets again."""
    master = broker_factory("broker-a")
    mq = MessageQueue("Offsets", "broker-a", 0)
    create_topic(master.address, mq.topic, 1)
    with Producer(brokers=master.address) as producer:
        for i in range(10):
            producer.send(Message(mq.topic, b"m%d" % i))
    with Admin(brokers=master.address) as admin:
        admin.commit("g", {mq: 7})
    replica = broker_factory("broker-a", args=("--broker-id", "1", "--master", master.address))

    def committed_at(address: str) -> int:
        with Admin(brokers=address) as admin:
            return admin.committed("g", mq)

    def copied(address: str, offset: int) -> bool:
        try:
            return committed_at(address) == offset
        except UnavailableError:
            return False

    wait_until(lambda: copied(replica.address, 7), 10, "the replica to copy the master's offsets")
    replica.stop()
    with Admin(brokers=master.address) as admin:
        admin.commit("g", {mq: 9})
    assert committed_at(master.address) == 9  # read: no later read may see less
    master.stop()
    replica.start()
    with pytest.raises(UnavailableError, match="has not copied the consumer offsets"):
        committed_at(replica.address)
    master.start()
    wait_until(lambda: copied(replica.address, 9), 15, "the replica to copy the master's offsets again")
