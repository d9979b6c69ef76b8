"""A replica that stood in for its master gives back what it took when the master returns: the commits its
consumers made (at once, before its copy goes on) and the queue locks it granted them.

Both found by the fault checker (tests/faults):
- locks (the failover scenario, seed 21912 with a 3 s client keepalive): with the master paused, a push
  consumer locked its queues on the replica; when the master resumed the consumer went back to it and let
  go of two of those queues there, where the grants were unknown. The replica kept them; the master was
  then killed and the replica promoted with them, and the queues' next owner was refused them until they
  expired a minute later: their messages were not delivered in the checker's drain.
- commits (the failover scenario, seed 21915): the replica handed its consumers' commits back on its
  metadata mirror's timer, a second after it connected to the returned master; an operator's reader that
  went back to the master meanwhile saw the master's older offsets (201 after 224).
Real broker processes and raw stubs: the brokers' answers are the subject.
"""

from __future__ import annotations

import pytest
from brokerproc import BrokerStubs
from workload import wait_until

from tidemark.v1 import admin_pb2, common_pb2, membership_pb2, messaging_pb2, offsets_pb2

TIMEOUT = 15
G, T = "stand-in", "StandIn"
QUEUE = common_pb2.MessageQueue(topic=T, queue_id=0)


def _lock(stubs: BrokerStubs, client_id: str, *, renew: bool = False) -> membership_pb2.QueueLock | None:
    answer = stubs.membership.LockQueues(membership_pb2.LockQueuesRequest(
        group=G, client_id=client_id, queues=[QUEUE], renew=renew), timeout=TIMEOUT)
    return answer.locked[0] if answer.locked else None


def _knows_topic(stubs: BrokerStubs) -> bool:
    answer = stubs.admin.ListTopics(admin_pb2.ListTopicsRequest(), timeout=TIMEOUT)
    return any(t.name == T for t in answer.topics)


@pytest.fixture
def pair(broker_factory):
    master = broker_factory("broker-a", args=("--replication", "async"))
    replica = broker_factory("broker-a", args=("--broker-id", "1", "--master", master.address))
    with BrokerStubs(master.address) as stubs:
        stubs.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=T, queue_nums=1), timeout=TIMEOUT)
        stubs.messaging.SendMessage(messaging_pb2.SendMessageRequest(
            topic=T, queue_id=0, messages=[common_pb2.Message(body=b"m%d" % i) for i in range(10)]),
            timeout=TIMEOUT)
    with BrokerStubs(replica.address) as stubs:
        wait_until(lambda: _knows_topic(stubs), 15, "the replica to mirror the topic")
    return master, replica


def test_locks_a_replica_granted_while_its_master_was_away_are_released_when_it_returns(pair):
    master, replica = pair
    master.kill()
    with BrokerStubs(replica.address) as stubs:
        held = _lock(stubs, "c1")  # a client reading from the replica while its master is away
        assert held is not None
        assert _lock(stubs, "c2") is None  # the replica keeps it for c1 meanwhile

        master.start()  # the replica connects to it again: its stand-in grant goes
        wait_until(lambda: _lock(stubs, "c2") is not None, 20,
                   "the queue granted at the replica to another client once the master is back",
                   details=lambda: f"replica log tail: {replica.log_text()[-2000:]}")
        assert "lock_release_stand_in" in replica.log_text()


def test_a_client_still_reading_from_the_replica_renews_its_released_lock_under_the_same_epoch(pair):
    master, replica = pair
    master.kill()
    with BrokerStubs(replica.address) as stubs:
        held = _lock(stubs, "c1")
        master.start()
        wait_until(lambda: "lock_release_stand_in" in replica.log_text(), 20,
                   "the replica to release its stand-in grants")
        renewed = _lock(stubs, "c1", renew=True)  # nobody took the queue meanwhile: c1 is still its owner
        assert renewed is not None and renewed.owner_epoch == held.owner_epoch


def _committed(stubs: BrokerStubs) -> int:
    return stubs.offsets.QueryConsumerOffset(offsets_pb2.QueryConsumerOffsetRequest(
        group=G, topic=T, queue_id=0), timeout=TIMEOUT).offset


def _commit(stubs: BrokerStubs, offset: int) -> None:
    stubs.offsets.UpdateConsumerOffset(offsets_pb2.UpdateConsumerOffsetRequest(
        commit=offsets_pb2.OffsetCommit(group=G, topic=T, queue_id=0, offset=offset)), timeout=TIMEOUT)


def test_commits_a_replica_took_while_its_master_was_away_are_the_masters_once_the_replica_copies_again(pair):
    master, replica = pair
    with BrokerStubs(master.address) as stubs:
        _commit(stubs, 3)
    with BrokerStubs(replica.address) as stubs:
        wait_until(lambda: _committed(stubs) == 3, 15, "the replica to copy the master's commit")
    master.kill()
    with BrokerStubs(replica.address) as stubs:
        _commit(stubs, 8)  # a consumer reading from the replica while its master is away
    connections = replica.log_text().count("event=replication_connected")
    master.start()
    wait_until(lambda: replica.log_text().count("event=replication_connected") > connections, 20,
               "the replica to copy from its returned master again")
    with BrokerStubs(master.address) as stubs:
        assert _committed(stubs) == 8  # handed back before the copy went on (was: up to a second later)
