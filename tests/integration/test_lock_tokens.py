"""Queue locks name their grants (issue 27, review of the unlock retries).

A consumer that let go of a queue asks again for its unlock when the first call failed. That retry may
arrive after the queue came back to the same client, whose owner epoch has not changed (the epoch rule):
only the lock token tells the new grant from the old one. A real broker process and raw stubs, for the
protocol's answers; the consumer's side is in tests/unit/consumer/test_ownership.py.
"""

from __future__ import annotations

import grpc
import pytest
from brokerproc import BrokerProcess, BrokerStubs

from tidemark.v1 import admin_pb2, common_pb2, membership_pb2, messaging_pb2, offsets_pb2

TIMEOUT = 15
G, T = "tokens", "Tokens"


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    broker = BrokerProcess(tmp_path_factory.mktemp("tokens") / "data").start()
    try:
        with BrokerStubs(broker.address) as s:
            s.admin.CreateTopic(admin_pb2.CreateTopicRequest(name=T, queue_nums=2), timeout=TIMEOUT)
            s.messaging.SendMessage(messaging_pb2.SendMessageRequest(
                topic=T, queue_id=0, messages=[common_pb2.Message(body=b"m%d" % i) for i in range(10)]),
                timeout=TIMEOUT)
            yield s
    finally:
        broker.kill()


def _lock(stubs, queue_id: int, *, renew: bool = False) -> membership_pb2.QueueLock:
    answer = stubs.membership.LockQueues(membership_pb2.LockQueuesRequest(
        group=G, client_id="c1", queues=[common_pb2.MessageQueue(topic=T, queue_id=queue_id)], renew=renew),
        timeout=TIMEOUT)
    (grant,) = answer.locked
    return grant


def _unlock(stubs, queue_id: int, token: int, offset: int, epoch: int) -> membership_pb2.UnlockQueuesResponse:
    q = common_pb2.MessageQueue(topic=T, queue_id=queue_id)
    fence = common_pb2.CommitFence(client_id="c1", owner_epoch=epoch)
    return stubs.membership.UnlockQueues(membership_pb2.UnlockQueuesRequest(
        group=G, client_id="c1", queues=[q], lock_tokens=[token],
        final_offsets=[membership_pb2.FinalOffset(queue=q, offset=offset, fence=fence)]), timeout=TIMEOUT)


def _committed(stubs, queue_id: int) -> int:
    return stubs.offsets.QueryConsumerOffset(offsets_pb2.QueryConsumerOffsetRequest(
        group=G, topic=T, queue_id=queue_id), timeout=TIMEOUT).offset


def _held_by_another(stubs, queue_id: int) -> bool:
    """Whether a second client is refused the queue's lock (taking it when free: call it last)."""
    answer = stubs.membership.LockQueues(membership_pb2.LockQueuesRequest(
        group=G, client_id="c2", queues=[common_pb2.MessageQueue(topic=T, queue_id=queue_id)]), timeout=TIMEOUT)
    return not answer.locked


def test_a_late_unlock_of_an_earlier_grant_keeps_the_new_lock_and_its_offset(stubs):
    first = _lock(stubs, 0)
    assert first.lock_token > 0
    renewal = _lock(stubs, 0, renew=True)
    assert renewal.lock_token == first.lock_token  # a renewal is the same grant
    assert first.lock_expiry_ms == renewal.lock_expiry_ms == 60_000  # the broker's expiry, for the holder's clock
    second = _lock(stubs, 0)  # taken again by its holder: a new grant, the same epoch
    assert second.lock_token != first.lock_token and second.owner_epoch == first.owner_epoch
    late = _unlock(stubs, 0, first.lock_token, 7, first.owner_epoch)
    assert [r.error_class for r in late.refused] == ["FencedError"]
    assert "locked again" in late.refused[0].message
    assert _committed(stubs, 0) == -1 and _held_by_another(stubs, 0)  # neither moved nor released
    assert not _unlock(stubs, 0, second.lock_token, 7, second.owner_epoch).refused
    assert _committed(stubs, 0) == 7 and not _held_by_another(stubs, 0)


def test_lock_tokens_that_do_not_match_the_queues_are_refused_and_change_nothing(stubs):
    _lock(stubs, 1)
    queues = [common_pb2.MessageQueue(topic=T, queue_id=1)]
    with pytest.raises(grpc.RpcError) as caught:
        stubs.membership.UnlockQueues(membership_pb2.UnlockQueuesRequest(
            group=G, client_id="c1", queues=queues, lock_tokens=[1, 2]), timeout=TIMEOUT)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "one per queue: 2 tokens for 1 queues" in caught.value.details()
    assert _held_by_another(stubs, 1)
