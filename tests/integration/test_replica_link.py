"""A replica's link to its master when it goes silent (no reset, no refusal) and comes back: the replica
gives the dead connection up by itself, and reconnects and copies again once the link carries bytes.
Real brokers; the link is a FaultProxy whose blackhole holds every byte and ends nothing, as a network
that drops packets does while TCP keeps retransmitting."""

from __future__ import annotations

from brokerproc import BrokerProcess, free_port
from faults.proxy import FaultProxy
from workload import create_topic, wait_until

from tidemark.client import Admin, Message, MessageQueue, NotFoundError, Producer

TOPIC = "Linked"


def max_offset(address: str) -> int:
    """The queue's max offset at the broker; -1 while it has not mirrored the topic yet."""
    try:
        with Admin(brokers=address) as admin:
            return admin.max_offset(MessageQueue(TOPIC, "broker-a", 0))
    except NotFoundError:
        return -1


def events(broker: BrokerProcess, event: str) -> int:
    return broker.log_text().count(f"event={event} ")


def send(address: str, count: int) -> None:
    with Producer(brokers=address) as producer:
        for i in range(count):
            producer.send(Message(TOPIC, b"m%d" % i))


def test_a_replica_gives_up_a_silent_link_and_copies_again_once_it_recovers(broker_factory, tmp_path):
    """Over a link that drops packets a TCP connection stays open while TCP retransmits (minutes), and
    every call the replica opens again goes on it. The replica's gRPC keepalive finds the connection dead
    within seconds and gives it up; the stream that went silent is opened again on a new connection and,
    once the link carries bytes, the replica holds what its master took meanwhile."""
    master = broker_factory(args=("--replication", "async"))
    link = FaultProxy(master.address, name="replica-link")
    replica = BrokerProcess(tmp_path / "replica", args=("--broker-id", "1", "--master", link.address))
    try:
        replica.start()
        create_topic(master.address, TOPIC, 1)
        send(master.address, 5)
        wait_until(lambda: max_offset(replica.address) == 5, 15, "the replica to copy the first messages")
        assert events(master, "replica_connected") == 1

        link.blackhole(True)  # nothing moves and nothing ends: no reset, no refusal
        send(master.address, 7)  # async replication: the master takes them alone
        wait_until(lambda: "no chunk from the master" in replica.log_text(), 10, "the replica to see the silence")
        # The proxy holds the old connection's bytes, and its FIN too (nothing crosses a dead link): that the
        # replica gave it up shows as a second connection it dials through the proxy.
        wait_until(lambda: link.open_connections() == 2, 20, "the replica to give the dead connection up")
        assert max_offset(replica.address) == 5  # nothing crossed the link

        link.blackhole(False)
        wait_until(lambda: max_offset(replica.address) == 12, 30, "the replica to copy what the master took")
        assert events(master, "replica_connected") >= 2  # a new stream, on a new connection
    finally:
        replica.kill()
        link.close()


def test_a_replica_copies_again_from_its_master_restarted_at_the_same_address(broker_factory, tmp_path):
    """A master killed and started again at its address: the replica, whose calls failed meanwhile, opens
    its stream again by itself and copies what the master takes in its new life."""
    port = free_port()
    master = BrokerProcess(tmp_path / "master", port=port, args=("--replication", "async")).start()
    try:
        replica = broker_factory(args=("--broker-id", "1", "--master", master.address))
        create_topic(master.address, TOPIC, 1)
        send(master.address, 3)
        wait_until(lambda: max_offset(replica.address) == 3, 15, "the replica to copy the first messages")

        master.kill()
        wait_until(lambda: "event=replication_interrupted" in replica.log_text(), 10, "the replica to lose it")
        master.start()
        send(master.address, 4)
        wait_until(lambda: max_offset(replica.address) == 7, 15, "the replica to copy the master's new life")
        assert events(replica, "replication_connected") >= 2
    finally:
        master.kill()
