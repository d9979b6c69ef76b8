"""Failover with real processes: a name server, broker-a as a sync master with a replica, and broker-b.
kill -9 of broker-a's master while a group consumes: consumption goes on from the replica, nothing is
skipped, producers write to broker-b; when the master returns it takes back the commits the replica held,
so no committed offset goes backwards."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import forkserver
import grpc
import pytest
from brokerproc import BrokerStubs
from workload import wait_until

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageQueue,
    Producer,
    PushConsumer,
)
from tidemark.v1 import common_pb2, membership_pb2, messaging_pb2


class Collector:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[float, str, str]] = []  # (when, msg id, broker name)

    def __call__(self, msgs, context):
        time.sleep(0.002 * len(msgs))  # a consumer doing some work, so the kill lands mid-stream
        with self.lock:
            self.seen.extend((time.monotonic(), m.msg_id, m.broker_name) for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def ids(self) -> list[str]:
        with self.lock:
            return [m for _, m, _ in self.seen]


def committed(address: str, group: str, topic: str, broker_name: str) -> int:
    with Admin(brokers=address) as admin:
        return sum(s.consumer_offset for s in admin.consume_stats(group, topic) if s.queue.broker_name == broker_name)


@pytest.fixture
def cluster(namesrv_factory, broker_factory):
    ns = namesrv_factory()
    common = ("--namesrv", ns.address, "--register-interval-ms", "1000")
    master = broker_factory("broker-a", args=(*common, "--replication", "sync"))
    replica = broker_factory("broker-a", args=(*common, "--broker-id", "1", "--master", master.address))
    other = broker_factory("broker-b", args=common)
    with Admin(namesrv=(ns.address,)) as admin:
        wait_until(lambda: len(admin.cluster_list()) == 3, 15, "three brokers registered")
        admin.create_topic("Failover", 2)
    return ns, master, replica, other


def test_consumers_fail_over_to_the_replica_and_the_master_takes_back_their_commits(cluster, capsys):
    ns, master, replica, other = cluster
    namesrv = (ns.address,)
    with Producer(namesrv=namesrv) as producer:
        sent = [r.msg_id for n in range(0, 800, 50)
                for r in producer.send_batch([Message("Failover", b"m%d" % i) for i in range(n, n + 50)])]
    collector = Collector()
    consumer = PushConsumer(group="survivor", namesrv=namesrv, route_refresh_interval_s=1,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET, consume_thread_max=2,
                            consume_message_batch_max_size=4)
    consumer.subscribe("Failover")
    consumer.register_message_listener(collector)
    consumer.start()
    try:
        wait_until(lambda: len(collector.ids()) >= 200, 60, "200 messages consumed before the kill")
        master.kill()
        killed = time.monotonic()
        # Producers go on, to broker-b (broker-a's queues are left out while its master is away).
        with Producer(namesrv=namesrv, route_refresh_interval_s=1) as producer:
            during = [producer.send(Message("Failover", b"d%d" % i)) for i in range(40)]
        assert {r.message_queue.broker_name for r in during} == {"broker-b"}
        everything = set(sent) | {r.msg_id for r in during}
        wait_until(lambda: everything <= set(collector.ids()), 90, "every message consumed after the kill",
                   details=lambda: f"{len(everything - set(collector.ids()))} missing")
        done = time.monotonic() - killed
        # The first broker-a message delivered again after the kill came from the replica (it serves from the
        # offsets the master had committed): the failover time, upper bound.
        before = {m for t, m, _ in collector.seen if t <= killed}
        resumed = min((t for t, m, name in collector.seen if t > killed and name == "broker-a" and m in before),
                      default=killed + done) - killed
        # (Commits ride on credit frames: the last ones may still be on their way. Which broker's queues
        # started first, and so what was consumed before the kill, is a race.)
        wait_until(lambda: committed(replica.address, "survivor", "Failover", "broker-a") > 0, 30,
                   "the replica to hold the group's commits of broker-a")
        held = committed(replica.address, "survivor", "Failover", "broker-a")
        master.start()  # back: it takes the replica's commits before the group is served from it again
        wait_until(lambda: committed(master.address, "survivor", "Failover", "broker-a") >= held, 30,
                   "the master to take back the replica's commits")
        samples = [committed(master.address, "survivor", "Failover", "broker-a") for _ in range(5)]
        assert samples == sorted(samples) and samples[0] >= held  # never backwards
    finally:
        consumer.shutdown()
    seen = collector.ids()
    duplicates = len(seen) - len(set(seen))
    # Only what was consumed within one commit interval (5 s, plus the replica's 1 s mirror) before the kill,
    # or after it from what was fetched before, comes again: never older progress.
    first: dict[str, float] = {}
    for t, m, _ in collector.seen:
        first.setdefault(m, t)
    again = {m for m in seen if seen.count(m) > 1}
    assert all(first[m] >= killed - 6.0 for m in again)
    with capsys.disabled():
        print(f"\nfailover: broker-a served by the replica {resumed:.2f} s after kill -9 of its master, every "
              f"message consumed {done:.2f} s after; {len(everything)} messages, {duplicates} duplicates "
              f"({len(before)} consumed before the kill)")


def test_a_promoted_replica_takes_writes_and_the_old_master_is_fenced(cluster):
    ns, master, replica, other = cluster
    namesrv = (ns.address,)
    with Producer(namesrv=namesrv) as producer:
        before = [producer.send(Message("Failover", b"a%d" % i), queue=MessageQueue("Failover", "broker-a", i % 2))
                  for i in range(20)]
    master.kill()
    cli = [sys.executable, "-m", "tidemark.client.cli.main", "broker", "promote", "--broker", replica.address, "--json"]
    promoted = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert promoted.returncode == 0, promoted.stderr
    assert [(r["id"], r["epoch"], r["perm"]) for r in json.loads(promoted.stdout)] == [(0, 1, "RW")]
    with Admin(namesrv=namesrv) as admin:
        wait_until(lambda: [(b.broker_id, b.address) for b in admin.cluster_list() if b.broker_name == "broker-a"]
                   == [(0, replica.address)], 15, "the promoted replica registered as broker-a's master")
    with Producer(namesrv=namesrv) as producer:  # writes go to the new master
        after = producer.send(Message("Failover", b"new"), queue=MessageQueue("Failover", "broker-a", 0))
    assert after.queue_offset == sum(1 for r in before if r.message_queue.queue_id == 0)  # right after the old ones

    master.start()  # the old master comes back with its old flags: refused by the name server, fenced
    with Admin(brokers=master.address) as admin:
        wait_until(lambda: admin.brokers()[0].fenced != "", 15, "the old master to be fenced")
        assert "epoch 1" in admin.brokers()[0].fenced
    with BrokerStubs(master.address) as stubs:
        with pytest.raises(grpc.RpcError) as e:
            stubs.messaging.SendMessage(messaging_pb2.SendMessageRequest(
                topic="Failover", queue_id=0, messages=[common_pb2.Message(body=b"stale")]), timeout=5)
        # Retriable, as Kafka's NOT_LEADER_OR_FOLLOWER: the client asks the name server for the master again.
        assert e.value.code() is grpc.StatusCode.UNAVAILABLE and "is fenced" in e.value.details()
    assert "event=broker_fenced" in master.log_text()
    with Admin(namesrv=namesrv) as admin:
        assert [(b.broker_id, b.address) for b in admin.cluster_list() if b.broker_name == "broker-a"] == [
            (0, replica.address)]

    replica.stop()
    replica.start()  # same flags as a replica; config/role.json keeps it the master
    with Admin(brokers=replica.address) as admin:
        info = admin.brokers()[0]
    assert (info.broker_id, info.epoch, info.writable) == (0, 1, True)


def test_pop_deliveries_in_flight_survive_a_promotion(cluster):
    """RocketMQ 5 pop consumers: the replica mirrors the pop ledger and the receipt-handle secret, so after the
    master's kill -9 and a promotion the handles it gave out still ack, and an acked message never comes back."""
    from google.protobuf.duration_pb2 import Duration
    from rmq5lib import Rmq5Stub, resource

    from tidemark.rmq5.v2 import messaging_pb2 as v2

    ns, master, replica, other = cluster
    with Producer(brokers=master.address) as producer:
        producer.send_batch([Message("Failover", b"p%d" % i) for i in range(20)],
                            queue=MessageQueue("Failover", "broker-a", 0))
    receive = v2.ReceiveMessageRequest(group=resource("popper"), batch_size=32,
                                       message_queue=v2.MessageQueue(topic=resource("Failover")),
                                       invisible_duration=Duration(seconds=60), long_polling_timeout=Duration(seconds=1))
    with grpc.insecure_channel(master.address) as channel:
        got = [a.message for a in Rmq5Stub(channel, client_id="127.0.0.1@popper").ReceiveMessage(receive, timeout=10)
               if a.HasField("message")]
    assert len(got) == 20
    state = replica.data_dir / "config" / "popState.json"

    def inflight_on_replica() -> int:
        doc = json.loads(state.read_text()) if state.exists() else {"queues": []}
        return sum(len(q["inflight"]) for q in doc["queues"])

    wait_until(lambda: inflight_on_replica() == 20, 20, "the replica to persist the mirrored pop state")
    master.kill()
    promote(replica)
    with grpc.insecure_channel(replica.address) as channel:
        stub = Rmq5Stub(channel, client_id="127.0.0.1@popper")
        answer = stub.AckMessage(v2.AckMessageRequest(group=resource("popper"), topic=resource("Failover"), entries=[
            v2.AckMessageEntry(message_id=m.system_properties.message_id,
                               receipt_handle=m.system_properties.receipt_handle) for m in got[:10]]), timeout=10)
        assert [e.status.code for e in answer.entries] == [v2.OK] * 10, answer
        # The other ten are still in flight (60 s): nothing is handed out now, and the acked ones never again.
        again = [a.message for a in stub.ReceiveMessage(receive, timeout=10) if a.HasField("message")]
    assert again == []


def promote(replica) -> None:
    """`tidemark broker promote` on the replica, as an operator runs it."""
    promoted = forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", "broker", "promote", "--broker",
                               replica.address], capture_output=True, text=True, timeout=60)
    assert promoted.returncode == 0, promoted.stderr


def wait_in_sync(master) -> None:
    """Until the master counts its replica (id 1) in sync: the replica holds the master's tables then."""
    with Admin(brokers=master.address) as admin:
        wait_until(lambda: admin.broker_status_at(master.address).in_sync_replicas == (1,), 30,
                   "the replica in sync with its master")


def _lock(address: str, client_id: str, *, renew: bool = False) -> list:
    with BrokerStubs(address) as s:
        return list(s.membership.LockQueues(membership_pb2.LockQueuesRequest(
            group="locked", client_id=client_id, queues=[common_pb2.MessageQueue(topic="Failover", queue_id=0)],
            renew=renew), timeout=15).locked)


def test_a_promoted_replica_holds_its_master_s_queue_locks(cluster):
    """A master answers a grant once its replicas in sync acknowledged the lock table holding it (sent on the
    replication stream); promoted, the replica holds each of those locks for half the lock expiry, as a
    restarted broker does: a member cut off from both brokers may still be consuming under its grant, so no
    other member gets the queue meanwhile, and the holder renews it and goes on under the same owner epoch
    and token. The master is killed the moment the grant is answered. Before, the promoted replica knew no
    lock and granted the queue to the first member that asked; then, copying the table once a second with
    the master's metadata, it missed a grant made in the second before the kill."""
    ns, master, replica, other = cluster
    wait_in_sync(master)
    (grant,) = _lock(master.address, "c1")
    master.kill()
    promote(replica)
    assert _lock(replica.address, "c2") == []  # held for c1
    (renewal,) = _lock(replica.address, "c1", renew=True)
    assert (renewal.owner_epoch, renewal.lock_token) == (grant.owner_epoch, grant.lock_token)


def test_a_topic_created_the_moment_before_the_master_dies_is_on_the_promoted_replica(cluster):
    """An admin change is answered once the master's replicas in sync acknowledged the topics and groups
    carrying it (sent on the replication stream): the master is killed the moment CreateTopic is answered,
    and the promoted replica has the topic, messages or none. Before, a replica copied the topics once a
    second with the master's metadata, and a topic without messages created in that second was gone."""
    ns, master, replica, other = cluster
    wait_in_sync(master)
    with Admin(brokers=master.address) as admin:
        admin.create_topic("Fresh", 3, brokers=["broker-a"])
    master.kill()
    promote(replica)
    with Admin(brokers=replica.address) as admin:
        assert [(b, t.write_queue_nums) for b, t in admin.list_topics()["Fresh"]] == [("broker-a", 3)]
