"""A replaced master rejoins as a replica holding a tail its new master does not have (issue 29): it drops
exactly that tail, from the first record where the two logs part, in the middle of a segment, and keeps
and does not copy again what it held before (broker/cluster/divergence.py). Real brokers; the roles are set
by hand so that the divergence is exact: the replica stops, the master takes writes alone (async
replication), stops, the replica is promoted and takes other writes, the old master comes back as its
replica."""

from __future__ import annotations

import re

from workload import create_topic, wait_until

from tidemark.client import Admin, Message, MessageQueue, Producer

TOPIC = "Diverged"
QUEUES = 2


def status(address: str):
    with Admin(brokers=address) as admin:
        return admin.broker_status_at(address)


def send(address: str, prefix: str, count: int, size: int) -> None:
    with Producer(brokers=address) as producer:
        for i in range(count):
            producer.send(Message(TOPIC, f"{prefix}-{i}-".encode().ljust(size, b".")))


def queue_contents(address: str) -> dict[int, list[bytes]]:
    """Every body of TOPIC's queues, read at each offset."""
    with Admin(brokers=address) as admin:
        return {q: [admin.view_message(MessageQueue(TOPIC, "broker-a", q), offset).body
                    for offset in range(admin.max_offset(MessageQueue(TOPIC, "broker-a", q)))]
                for q in range(QUEUES)}


def test_a_rejoining_old_master_drops_its_tail_from_the_first_differing_record_and_copies_nothing_before(
        broker_factory, tmp_path):
    old = broker_factory(args=("--replication", "async"), data_dir=tmp_path / "old")
    new = broker_factory(args=("--broker-id", "1", "--master", old.address), data_dir=tmp_path / "new")
    create_topic(old.address, TOPIC, QUEUES)
    send(old.address, "common", 40, 100)
    wait_until(lambda: status(new.address).commit_log_max_offset == status(old.address).commit_log_max_offset
               and status(new.address).replica_lag_bytes == 0, 15, "the replica to hold the master's log")
    point = status(new.address).commit_log_max_offset
    new.stop()
    send(old.address, "lost", 30, 400)  # acknowledged by the master alone: nobody else has these
    old_end = status(old.address).commit_log_max_offset
    common = {q: [b for b in bodies if b.startswith(b"common-")] for q, bodies in queue_contents(old.address).items()}
    old.stop()

    new.start()
    with Admin(brokers=new.address) as admin:
        admin.promote(new.address)
    send(new.address, "kept", 10, 100)  # at the offsets where the old master holds its "lost" records
    new_end = status(new.address).commit_log_max_offset
    assert point < new_end < old_end, "the old master must hold records past the new master's end"
    assert point % (64 << 20) and new_end < 64 << 20, "the point lies in the middle of the first segment"

    old.args = ("--broker-id", "2", "--master", new.address)
    old.start()
    wait_until(lambda: status(old.address).commit_log_max_offset == new_end
               and status(old.address).replica_lag_bytes == 0, 20, "the old master to catch up as a replica")

    # Cut once, at the point, dropping exactly what followed it; the copy started there.
    cuts = re.findall(r"event=replica_truncated offset=(\d+) dropped_bytes=(\d+)", old.log_text())
    assert cuts == [(str(point), str(old_end - point))], cuts
    assert re.search(rf"event=replica_diverged .*truncate_to={point}\b", new.log_text())
    connected = re.findall(r"event=replica_connected replica=broker-a/2@\S+ offset=(\d+)", new.log_text())
    assert connected == [str(point)], connected

    # Reads at every offset give the new master's messages; the old master's own tail is gone.
    on_new, on_old = queue_contents(new.address), queue_contents(old.address)
    assert on_old == on_new
    assert all(bodies[:len(common[q])] == common[q] for q, bodies in on_old.items())
    assert not any(b.startswith(b"lost-") for bodies in on_old.values() for b in bodies)
    assert sum(b.startswith(b"kept-") for bodies in on_old.values() for b in bodies) == 10
    assert sum(b.startswith(b"common-") for bodies in on_old.values() for b in bodies) == 40
