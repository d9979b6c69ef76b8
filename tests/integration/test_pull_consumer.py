"""PullConsumer (lite pull) against a real broker: assign, poll, seek, commit, subscribe."""

from __future__ import annotations

import pytest
from workload import create_topic, produce, queue, wait_until

from tidemark.client import (
    Admin,
    ClientStateError,
    ConsumeFromWhere,
    InvalidArgumentError,
    PullConsumer,
)


def poll_all(consumer: PullConsumer, want: int, timeout: float = 20.0) -> list:
    got = []
    wait_until(lambda: got.extend(consumer.poll(0.2)) or len(got) >= want, timeout, f"{want} messages")
    return got


def test_assign_poll_seek_commit(broker):
    create_topic(broker.address, "Lite", 2)
    produce(broker.address, "Lite", 100, batch=50)  # 50 per queue
    q0 = queue("Lite", 0)
    consumer = PullConsumer(group="lite", brokers=broker.address, auto_commit=False,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.assign([q0])
    with consumer:
        msgs = poll_all(consumer, 50)
        assert [m.queue_offset for m in msgs] == list(range(50))
        assert {m.queue_id for m in msgs} == {0}
        assert consumer.committed(q0) == -1
        consumer.commit()
        assert consumer.committed(q0) == 50

        consumer.seek(q0, 10)
        again = poll_all(consumer, 40)
        assert [m.queue_offset for m in again] == list(range(10, 50))
        consumer.commit({q0: 25})
        assert consumer.committed(q0) == 25
        with pytest.raises(InvalidArgumentError, match="outside"):
            consumer.seek(q0, 51)
        with pytest.raises(InvalidArgumentError, match="not assigned"):
            consumer.seek(queue("Lite", 1), 0)
        consumer.seek_to_end(q0)
        assert consumer.poll(0.3) == []
    with Admin(brokers=broker.address) as admin:
        assert admin.committed("lite", q0) == 25
    with pytest.raises(ClientStateError):
        consumer.poll(0.1)


def test_subscribe_gets_all_queues_and_auto_commits(broker):
    create_topic(broker.address, "LiteSub", 3)
    ids = produce(broker.address, "LiteSub", 90, batch=30)
    consumer = PullConsumer(group="lite-sub", brokers=broker.address, auto_commit_interval_s=0.5,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe("LiteSub")
    with consumer:
        msgs = poll_all(consumer, 90)
        assert {m.msg_id for m in msgs} == set(ids)
        assert len(consumer.assignment()) == 3
        with Admin(brokers=broker.address) as admin:
            wait_until(lambda: all(s.lag == 0 for s in admin.consume_stats("lite-sub", "LiteSub")), 10,
                       "auto commit")


def test_two_consumers_in_one_process_are_two_members_known_by_their_client_ids(broker):
    """client_id is what the brokers know each consumer by: the group's members are exactly the two ids,
    each owning the queues its consumer was given."""
    create_topic(broker.address, "LiteSplit", 4)
    consumers = [PullConsumer(group="lite-split", brokers=broker.address) for _ in range(2)]
    for c in consumers:
        c.subscribe("LiteSplit")
    try:
        for c in consumers:
            c.start()
        first, second = consumers
        assert first.client_id != second.client_id
        wait_until(lambda: len(first.assignment()) == len(second.assignment()) == 2, 30, "2 queues each")
        with Admin(brokers=broker.address) as admin:
            wait_until(lambda: {m.client_id: {q for q in m.owned_queues if q.topic == "LiteSplit"}
                                for m in admin.describe_group("lite-split").members}
                       == {c.client_id: c.assignment() for c in consumers}, 30, "members owning what they read")
    finally:
        for c in consumers:
            c.shutdown()
