"""A sync-replication master stores or refuses a send, never both.

With no replica connected and in sync, a send is refused before it is stored (UNAVAILABLE, retriable:
Kafka's NOT_ENOUGH_REPLICAS, RocketMQ's SLAVE_NOT_AVAILABLE). A send stored while a replica was in sync
that no replica acknowledges in time has an unknown outcome (DEADLINE_EXCEEDED: the client's
RequestTimeoutError, which an idempotent producer retries with the same sequence). Each test keeps a
history of every send and its outcome, reads the queues back, and checks the history against them:
acknowledged sends are stored where their answer said, refused ones nowhere, and nothing else is stored.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import grpc
import pytest
from brokerproc import BrokerProcess, BrokerStubs, free_port
from workload import wait_until

from tidemark.client import (
    Admin,
    Message,
    MessageQueue,
    Producer,
    RequestTimeoutError,
    TidemarkError,
    UnavailableError,
)
from tidemark.common.protocol import ERROR_CLASS_KEY
from tidemark.common.records import RecordBatchBuilder, encode_properties
from tidemark.v1 import common_pb2, messaging_pb2

TOPIC = "Synced"
QUEUES = 2
TIMEOUT_MS = 1500
REFUSED = "in-sync replica"  # "no in-sync replica is connected", "fewer than 2 in-sync replicas"


def sync_master(broker_factory, *args: str):
    return broker_factory("broker-a", args=("--replication", "sync", "--replication-timeout-ms", str(TIMEOUT_MS),
                                            *args))


def replica_of(broker_factory, master, *args: str):
    return broker_factory("broker-a", args=("--broker-id", "1", "--master", master.address, *args))


def stored(address: str) -> dict[bytes, tuple[int, int]]:
    """body -> (queue id, queue offset) of every message of the topic on the broker at `address`."""
    out: dict[bytes, tuple[int, int]] = {}
    with Admin(brokers=address) as admin:
        for q in range(QUEUES):
            mq = MessageQueue(TOPIC, "broker-a", q)
            offset = admin.min_offset(mq)
            while True:
                got = admin.pull(mq, offset, max_nums=256)
                if not got.messages:
                    break
                for m in got.messages:
                    assert m.body not in out, f"{m.body!r} is stored twice"
                    out[m.body] = (q, m.queue_offset)
                offset = got.next_begin_offset
    return out


def commit_log_end(address: str) -> int:
    with Admin(brokers=address) as admin:
        return admin.broker_status_at(address).commit_log_max_offset



def wait_in_sync(master) -> None:
    """Until a send to the master is acknowledged (its replica connected and caught up)."""
    def acknowledged() -> bool:
        try:
            with Producer(brokers=master.address, retry_times_when_send_failed=0) as p:
                p.send(Message(TOPIC, b"probe-%d" % time.monotonic_ns()), queue=MessageQueue(TOPIC, "broker-a", 0))
            return True
        except (UnavailableError, RequestTimeoutError):  # refused, or the replica still catching up
            return False
    wait_until(acknowledged, 30, "a send acknowledged by the sync master (its replica in sync)", interval=0.2)


class History:
    """Every send and its outcome: ok (with where it was stored), refused, or unknown."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok: dict[bytes, tuple[int, int]] = {}
        self.refused: dict[bytes, TidemarkError] = {}
        self.unknown: dict[bytes, TidemarkError] = {}
        self.other: dict[bytes, TidemarkError] = {}

    def send(self, producer: Producer, body: bytes) -> None:
        try:
            r = producer.send(Message(TOPIC, body))
        except UnavailableError as e:
            outcome, value = self.refused, e
        except RequestTimeoutError as e:
            outcome, value = self.unknown, e
        except TidemarkError as e:
            outcome, value = self.other, e
        else:
            outcome, value = self.ok, (r.message_queue.queue_id, r.queue_offset)
        with self.lock:
            outcome[body] = value

    def check(self, held: dict[bytes, tuple[int, int]]) -> None:
        """Acknowledged: stored where the answer said. Refused: stored nowhere. Stored: sent by this history."""
        assert self.other == {}, f"sends failed neither as refused nor as unknown: {self.other}"
        misplaced = {b: (where, held.get(b)) for b, where in self.ok.items() if held.get(b) != where}
        assert misplaced == {}, f"acknowledged sends not stored where their answer said: {misplaced}"
        refused_but_stored = {b: held[b] for b in self.refused if b in held}
        assert refused_but_stored == {}, (f"{len(refused_but_stored)} of {len(self.refused)} refused sends were "
                                          f"stored anyway: {sorted(refused_but_stored)[:10]}")
        sent = self.ok.keys() | self.unknown.keys()
        unexpected = {b for b in held if b not in sent and not b.startswith(b"probe-")}
        assert unexpected == set(), f"stored but never sent or acknowledged: {sorted(unexpected)[:10]}"
        for e in self.refused.values():
            assert e.retriable and REFUSED in str(e), e
        for e in self.unknown.values():
            assert e.retriable, e


def records(body: bytes) -> bytes:
    b = RecordBatchBuilder(TOPIC, "h")
    b.append(body, encode_properties({"UNIQ_KEY": body.decode()}))
    return bytes(b.buffer)


def test_a_sync_master_without_a_replica_refuses_before_storing_then_stores_once_one_is_in_sync(broker_factory):
    master = sync_master(broker_factory)
    with Admin(brokers=master.address) as admin:
        admin.create_topic(TOPIC, QUEUES)
    end = commit_log_end(master.address)
    history = History()
    with Producer(brokers=master.address, retry_times_when_send_failed=0) as producer:
        for i in range(5):
            history.send(producer, b"alone-%d" % i)
        # A batch and a delayed message (the unary SendMessage path) are refused alike.
        with pytest.raises(UnavailableError, match=REFUSED):
            producer.send_batch([Message(TOPIC, b"batch-%d" % i) for i in range(3)])
        with pytest.raises(UnavailableError, match=REFUSED):
            producer.send(Message(TOPIC, b"delayed", delay_level=1))
    assert sorted(history.refused) == [b"alone-%d" % i for i in range(5)]
    with BrokerStubs(master.address) as stubs:
        with pytest.raises(grpc.RpcError) as e:
            stubs.messaging.SendMessage(messaging_pb2.SendMessageRequest(
                topic=TOPIC, queue_id=0, messages=[common_pb2.Message(body=b"unary")]), timeout=10)
        assert e.value.code() is grpc.StatusCode.UNAVAILABLE and REFUSED in e.value.details()
        assert (ERROR_CLASS_KEY, "NotEnoughReplicasError") in tuple(e.value.trailing_metadata())
        [answer] = stubs.messaging.Produce(iter([messaging_pb2.ProduceRequest(
            request_id=1, topic=TOPIC, queue_id=1, count=1, records=records(b"streamed"))]), timeout=10)
        assert answer.code == grpc.StatusCode.UNAVAILABLE.value[0] and REFUSED in answer.error
        assert answer.error_class == "NotEnoughReplicasError"
    assert commit_log_end(master.address) == end  # nothing refused reached the commit log
    assert stored(master.address) == {}

    replica = replica_of(broker_factory, master)
    wait_in_sync(master)
    with Producer(brokers=master.address, retry_times_when_send_failed=0) as producer:
        for i in range(20):
            history.send(producer, b"replicated-%d" % i)
    assert len(history.ok) == 20 and not history.unknown
    held = stored(master.address)
    history.check(held)
    wait_until(lambda: stored(replica.address) == held, 15, "the replica to hold what the master acknowledged")


def test_killing_the_only_replica_mid_run_refuses_retriably_and_stores_nothing_refused(broker_factory):
    master = sync_master(broker_factory)
    replica = replica_of(broker_factory, master)
    with Admin(brokers=master.address) as admin:
        admin.create_topic(TOPIC, QUEUES)
    wait_in_sync(master)
    history = History()
    stop = threading.Event()

    def sender(n: int) -> None:
        with Producer(brokers=master.address, retry_times_when_send_failed=0, enable_idempotence=False) as producer:
            i = 0
            while not stop.is_set():
                history.send(producer, b"%d-%d" % (n, i))
                i += 1

    threads = [threading.Thread(target=sender, args=(n,), daemon=True) for n in range(2)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(history.ok) >= 200, 60, "200 acknowledged sends")
        replica.kill()
        acked_at_kill = len(history.ok)
        wait_until(lambda: len(history.refused) >= 50, 60, "50 refused sends after the replica's kill -9")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    # Once the replica is gone nothing more is acknowledged (at most what was on its way at the kill).
    assert len(history.ok) - acked_at_kill <= 2
    history.check(stored(master.address))


def test_a_silent_replica_makes_sends_unknown_then_refused_and_a_retried_sequence_is_stored_once(broker_factory):
    master = sync_master(broker_factory)
    replica = replica_of(broker_factory, master)
    with Admin(brokers=master.address) as admin:
        admin.create_topic(TOPIC, QUEUES)
    wait_in_sync(master)
    with BrokerStubs(master.address) as stubs:
        producer_id = stubs.messaging.InitProducer(messaging_pb2.InitProducerRequest(topic=TOPIC), timeout=10)
        producer_id = producer_id.producer_id

        def produce(body: bytes, sequence: int) -> messaging_pb2.ProduceResponse:
            [answer] = stubs.messaging.Produce(iter([messaging_pb2.ProduceRequest(
                request_id=1, topic=TOPIC, queue_id=0, count=1, records=records(body), producer_id=producer_id,
                producer_epoch=0, base_sequence=sequence)]), timeout=30)
            return answer

        assert produce(b"seq-0", 0).code == 0
        replica.pause()  # connected, but acknowledges nothing: the first send is stored, its outcome unknown
        unknown = produce(b"seq-1", 1)
        assert unknown.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], unknown
        assert unknown.error_class == "ReplicationTimeoutError"
        # Behind for longer than a send may wait: out of sync, and sends are refused before they are stored.
        answers: list[messaging_pb2.ProduceResponse] = []

        def refused() -> bool:
            answers.append(produce(b"seq-%d" % (len(answers) + 2), len(answers) + 2))
            if answers[-1].code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]:
                return False
            assert answers[-1].code == grpc.StatusCode.UNAVAILABLE.value[0], answers[-1]
            return True

        wait_until(refused, 30, "a send refused while the replica is silent", interval=0)
        assert REFUSED in answers[-1].error and answers[-1].error_class == "NotEnoughReplicasError"
        # A refusal stores nothing: the same send refused again leaves the commit log as it was.
        log_end = commit_log_end(master.address)
        last = len(answers) + 1
        again_refused = produce(b"seq-%d" % last, last)
        assert again_refused.error_class == "NotEnoughReplicasError", again_refused
        assert commit_log_end(master.address) == log_end, "a refused send was stored"
        # Stored but not readable: readers of a master see only what a replica holds (the high watermark).
        unknown_at = held_before = len(stored(master.address))
        replica.resume()
        # The idempotent producer's retry of the unknown batch: its sequence is already stored, the
        # broker answers the original's offset (once the replica has it) and stores nothing new.
        again = produce(b"seq-1", 1)
        assert again.code == 0 and again.duplicate and again.first_queue_offset == unknown_at, again
    after = stored(master.address)
    assert b"seq-1" in after and b"seq-%d" % (len(answers) + 1) not in after  # the unknown one, the refused one
    assert len(after) == held_before + 1 + sum(a.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0] for a in answers)
    wait_until(lambda: stored(replica.address) == after, 15, "the replica to catch up")


def test_a_promoted_sync_replica_refuses_until_it_has_a_replica_of_its_own(broker_factory):
    master = sync_master(broker_factory)
    replica = replica_of(broker_factory, master, "--replication", "sync",
                         "--replication-timeout-ms", str(TIMEOUT_MS))
    with Admin(brokers=master.address) as admin:
        admin.create_topic(TOPIC, QUEUES)
    wait_in_sync(master)
    history = History()
    with Producer(brokers=master.address, retry_times_when_send_failed=0) as producer:
        for i in range(10):
            history.send(producer, b"before-%d" % i)
    assert len(history.ok) == 10
    master.kill()
    with Admin(brokers=replica.address) as admin:
        assert admin.promote(replica.address).broker_id == 0
    end = commit_log_end(replica.address)
    with Producer(brokers=replica.address, retry_times_when_send_failed=0) as producer:
        for i in range(5):
            history.send(producer, b"promoted-alone-%d" % i)
    assert len(history.refused) == 5
    assert commit_log_end(replica.address) == end
    replica_of(broker_factory, replica)
    wait_in_sync(replica)
    with Producer(brokers=replica.address, retry_times_when_send_failed=0) as producer:
        for i in range(10):
            history.send(producer, b"after-%d" % i)
    assert len(history.ok) == 20
    history.check(stored(replica.address))


def test_a_replica_whose_master_is_down_tries_again_within_seconds(broker_factory, tmp_path):
    """A sync master refuses every send until a replica connects, so a replica must find a master that comes
    up (or back) at once, not after gRPC's reconnect backoff (up to two minutes; 46 s in one run)."""
    port = free_port()
    attempts: list[float] = []
    with socket.create_server(("127.0.0.1", port)) as listener:  # the master's port, nobody answering gRPC
        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                attempts.append(time.monotonic())
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()  # reset: no TIME_WAIT left on the port the master takes next

        threading.Thread(target=accept, daemon=True).start()
        broker_factory("broker-a", args=("--broker-id", "1", "--master", f"127.0.0.1:{port}"))
        wait_until(lambda: len(attempts) >= 8, 90, "eight connection attempts of the replica")
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept: the port is free once the listener closes
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    assert max(gaps) < 4.0, f"seconds between the replica's attempts to reach its master: {gaps}"
    master = BrokerProcess(tmp_path / "master", port=port, args=("--replication", "sync", "--replication-timeout-ms",
                                                                 str(TIMEOUT_MS)))
    try:
        master.start()
        with Admin(brokers=master.address) as admin:
            admin.create_topic(TOPIC, QUEUES)
        wait_in_sync(master)  # the replica found it
    finally:
        master.kill()
