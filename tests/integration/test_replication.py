"""Master/replica broker groups with real processes: a replica copies its master's commit log at the same
offsets, mirrors topics and offsets, refuses writes, catches up after restarts, cuts a divergent tail; kill -9
of a master loses no acknowledged message under sync replication (and the async loss is counted)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from brokerproc import BrokerStubs, free_port
from workload import metric, scrape, wait_until

from tidemark.client import Admin, Message, MessageQueue, Producer, TidemarkError
from tidemark.v1 import admin_pb2, common_pb2, messaging_pb2


def contents(address: str, topic: str, queues: int) -> dict[tuple[int, int], str]:
    """(queue id, queue offset) -> msg id of every message a broker holds for the topic."""
    out = {}
    with Admin(brokers=address) as admin:
        for q in range(queues):
            mq = MessageQueue(topic, "broker-a", q)
            offset = admin.min_offset(mq)
            while True:
                got = admin.pull(mq, offset, max_nums=256)
                if not got.messages:
                    break
                out.update({(q, m.queue_offset): m.msg_id for m in got.messages})
                offset = got.next_begin_offset
    return out


def topics_of(address: str) -> set[str]:
    with Admin(brokers=address) as admin:
        return set(admin.list_topics())


@pytest.fixture
def pair(broker_factory, request):
    """A master (with the test's --replication mode) and its replica, same broker name."""
    mode = getattr(request, "param", "async")
    master = broker_factory("broker-a", args=("--replication", mode))
    replica = broker_factory("broker-a", args=("--broker-id", "1", "--master", master.address))
    with Admin(brokers=master.address) as admin:
        admin.create_topic("Copied", 2)
    wait_until(lambda: "Copied" in topics_of(replica.address), 15, "the replica to mirror the topic")
    return master, replica


def produce_until_killed(master, replica) -> tuple[dict[str, tuple[int, int]], int]:
    """Two threads send single messages to the master. After 300 acks the replica is paused (SIGSTOP: it
    falls behind), then, after 300 more acks or 4 s, the master is killed (kill -9) and the replica resumed.
    Returns every acknowledged send (msg id -> queue id, offset) and how many came while it was paused."""
    acked: dict[str, tuple[int, int]] = {}
    lock, stop = threading.Lock(), threading.Event()

    def send(n: int) -> None:
        with Producer(brokers=master.address, request_timeout_s=2, retry_times_when_send_failed=0) as producer:
            i = 0
            while not stop.is_set():
                try:
                    r = producer.send(Message("Copied", b"%d-%d" % (n, i)))
                except TidemarkError:
                    continue  # not acknowledged (the replica is paused, or the master is gone)
                finally:
                    i += 1
                with lock:
                    acked[r.msg_id] = (r.message_queue.queue_id, r.queue_offset)

    threads = [threading.Thread(target=send, args=(n,), daemon=True) for n in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 300, 60, "300 acknowledged sends")
    replica.pause()
    before = len(acked)
    deadline = time.monotonic() + 4
    while len(acked) < before + 300 and time.monotonic() < deadline:
        time.sleep(0.05)
    master.kill()
    replica.resume()
    stop.set()
    for t in threads:
        t.join(30)
    return acked, len(acked) - before


@pytest.mark.parametrize("pair", ["sync"], indirect=True)
def test_kill_9_of_a_sync_master_loses_no_acknowledged_message(pair, capsys):
    master, replica = pair
    acked, while_paused = produce_until_killed(master, replica)
    held = contents(replica.address, "Copied", 2)
    lost = {m: where for m, where in acked.items() if held.get(where) != m}
    with capsys.disabled():
        print(f"\nsync replication: {len(acked)} acknowledged, {while_paused} while the replica was paused, "
              f"{len(lost)} lost")
    assert lost == {}


def test_kill_9_of_an_async_master_keeps_a_prefix_on_the_replica(pair, capsys):
    master, replica = pair
    acked, while_paused = produce_until_killed(master, replica)
    held = contents(replica.address, "Copied", 2)
    lost = {m: where for m, where in acked.items() if held.get(where) != m}
    # Acknowledged while the replica was behind (paused, plus what it had not copied yet when paused): gone
    # with the master. They are the newest acknowledged messages of their queues, never one in the middle.
    assert lost
    for q in (0, 1):
        offsets = sorted(o for qq, o in held if qq == q)
        # What the replica holds is the master's log up to a point: never a hole, never another message.
        assert offsets == list(range(len(offsets)))
        assert all(o >= len(offsets) for m, (qq, o) in lost.items() if qq == q)
    by_place = {where: m for m, where in acked.items()}
    assert all(by_place.get(where, m) == m for where, m in held.items())
    with capsys.disabled():
        print(f"\nasync replication: {len(acked)} acknowledged, {while_paused} while the replica was paused, "
              f"{len(lost)} lost")


def test_a_replica_mirrors_offsets_refuses_writes_and_catches_up_after_a_restart(pair):
    master, replica = pair
    with Producer(brokers=master.address) as producer:
        for i in range(0, 100, 25):
            producer.send_batch([Message("Copied", b"a%d" % j) for j in range(i, i + 25)])
    with Admin(brokers=master.address) as admin:
        admin.commit("copier", {MessageQueue("Copied", "broker-a", 0): 7})
    wait_until(lambda: len(contents(replica.address, "Copied", 2)) == 100, 15, "100 messages on the replica")
    with Admin(brokers=replica.address) as admin:
        wait_until(lambda: admin.committed("copier", MessageQueue("Copied", "broker-a", 0)) == 7, 15,
                   "the group's offset mirrored")
    with BrokerStubs(replica.address) as stubs:
        with pytest.raises(grpc.RpcError) as e:  # clients do not even try: the replica routes no writable queue
            stubs.messaging.SendMessage(messaging_pb2.SendMessageRequest(
                topic="Copied", queue_id=0, messages=[common_pb2.Message(body=b"refused")]), timeout=5)
        assert e.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert f"is a replica; writes go to its master {master.address}" in e.value.details()
        route = stubs.admin.GetRoute(admin_pb2.GetRouteRequest(topic="Copied"), timeout=5)
        assert [(d.readable, d.writable) for d in route.queue_datas] == [(True, False)]

    replica.stop()
    with Producer(brokers=master.address) as producer:
        producer.send_batch([Message("Copied", b"b%d" % j) for j in range(50)])
    replica.start()
    wait_until(lambda: contents(replica.address, "Copied", 2) == contents(master.address, "Copied", 2), 30,
               "the restarted replica to catch up")


def test_a_replica_with_a_divergent_tail_cuts_it_and_copies_the_master(pair, broker_factory):
    master, replica = pair
    with Producer(brokers=master.address) as producer:
        producer.send_batch([Message("Copied", b"a%d" % j) for j in range(40)])
    wait_until(lambda: len(contents(replica.address, "Copied", 2)) == 40, 15, "40 messages on the replica")
    replica.stop()
    # The replica's data dir runs as a master of its own for a while (a former master that was replaced).
    rogue = broker_factory("broker-a", data_dir=replica.data_dir)
    with Producer(brokers=rogue.address) as producer:
        producer.send_batch([Message("Copied", b"rogue%d" % j) for j in range(30)])
    rogue.stop()
    with Producer(brokers=master.address) as producer:
        producer.send_batch([Message("Copied", b"b%d" % j) for j in range(20)])
    replica.start()
    wait_until(lambda: contents(replica.address, "Copied", 2) == contents(master.address, "Copied", 2), 30,
               "the replica to cut its tail and copy the master")
    assert "event=replica_diverged" in master.log_text()


def test_replica_lag_shows_in_metrics_on_both_sides(broker_factory):
    master_metrics, replica_metrics = free_port(), free_port()
    master = broker_factory("broker-a", args=("--metrics-port", str(master_metrics)))
    replica = broker_factory("broker-a", args=("--broker-id", "1", "--master", master.address, "--metrics-port",
                                               str(replica_metrics)))
    with Admin(brokers=master.address) as admin:
        admin.create_topic("Measured", 1)
    with Producer(brokers=master.address) as producer:
        producer.send_batch([Message("Measured", b"x" * 1000) for _ in range(100)])

    def behind() -> dict:
        return {k: v for k, v in scrape(master_metrics).items() if k[0] == "tidemark_replica_behind_bytes"}

    wait_until(lambda: list(behind().values()) == [0.0], 15, "the master to see its replica caught up",
               details=lambda: str(behind()))
    replica.pause()  # behind while paused: the master's view grows with the next sends
    with Producer(brokers=master.address) as producer:
        producer.send_batch([Message("Measured", b"y" * 1000) for _ in range(100)])
    wait_until(lambda: list(behind().values())[0] > 100_000, 15, "the master to count the paused replica behind")
    replica.resume()
    wait_until(lambda: list(behind().values()) == [0.0], 15, "the replica to catch up again")
    assert metric(replica_metrics, "tidemark_replica_lag_bytes") == 0.0
