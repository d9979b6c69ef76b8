"""FIFO per message group with Tidemark's own clients: a producer's message groups and an orderly push
consumer that keeps order per group, a slow group holding back only itself (issue 32, item 2)."""

from __future__ import annotations

import threading

from workload import create_topic, wait_until

from tidemark.client import (
    Admin,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    Message,
    Producer,
    PushConsumer,
)
from tidemark.client.producer.selector import SelectMessageQueueByHash

GROUPS = ("a", "b", "slow")


def committed(address: str, group: str, topic: str) -> int:
    with Admin(brokers=address) as admin:
        (stats,) = admin.consume_stats(group, topic)
        return stats.consumer_offset


def test_a_slow_message_group_holds_back_only_itself(module_broker):
    address = module_broker.address
    create_topic(address, "Fifo", 1)
    release, lock = threading.Event(), threading.Lock()
    calls: list[tuple[str, bytes, int]] = []  # (group, body, reconsume times) per listener call
    done: list[tuple[str, bytes]] = []

    def listener(msgs, ctx):
        (m,) = msgs
        with lock:
            calls.append((m.message_group, m.body, m.reconsume_times))
        if m.message_group == "slow" and not release.is_set():
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        with lock:
            done.append((m.message_group, m.body))
        return ConsumeOrderlyStatus.SUCCESS

    sent = {g: [f"{g}-{i}".encode() for i in range(4)] for g in GROUPS}
    with Producer(brokers=address) as producer:
        # a-0 b-0 slow-0 a-1 b-1 slow-1 ...: the slow group's first message is at offset 2
        for i in range(4):
            for g in GROUPS:
                result = producer.send(Message("Fifo", sent[g][i], message_group=g))
                assert result.queue_offset == 3 * i + GROUPS.index(g)
    consumer = PushConsumer(group="fifo-groups", brokers=address, consume_thread_max=4,
                            suspend_current_queue_time_ms=20,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe("Fifo")
    consumer.register_message_listener_orderly(listener)
    consumer.start()
    try:
        # The slow group keeps asking to wait; the other two are consumed meanwhile.
        wait_until(lambda: consumer.stats()["consumed_ok"] == 8 and any(c[0] == "slow" for c in calls), 30,
                   "groups a and b consumed while the slow group waits")
        consumer.persist_offsets()
        assert committed(address, "fifo-groups", "Fifo") == 2, "the commit passed the slow group's first message"
        with lock:
            assert {body for g, body, _ in calls if g == "slow"} == {b"slow-0"}, "the slow group's order broke"
        release.set()
        wait_until(lambda: consumer.stats()["consumed_ok"] == 12, 30, "the slow group after it resumed")
        consumer.persist_offsets()
        assert committed(address, "fifo-groups", "Fifo") == 12
    finally:
        consumer.shutdown()
    slow = [(body, times) for g, body, times in calls if g == "slow"]
    tries = len(slow) - 3
    # Tried again in place (reconsume times counting up) until it succeeded, then the group's later ones.
    assert slow == [(b"slow-0", n) for n in range(tries)] + [(b, 0) for b in sent["slow"][1:]]
    for g in GROUPS:
        assert [body for group, body in done if group == g] == sent[g], f"group {g} out of order"


def test_a_message_group_picks_its_queue_by_hash_and_is_stored(module_broker):
    address = module_broker.address
    create_topic(address, "FifoRoutes", 4)
    expected = {}
    with Producer(brokers=address) as producer:
        queues = producer.fetch_publish_message_queues("FifoRoutes")
        for g in ("order-1", "order-2", "order-3"):
            expected[g] = SelectMessageQueueByHash().select(queues, None, g)
            results = [producer.send(Message("FifoRoutes", b"x", message_group=g)) for _ in range(2)]
            results.append(producer.send_async(Message("FifoRoutes", b"y", message_group=g)).result(10))
            assert {r.message_queue for r in results} == {expected[g]}
    stored = {}
    with Admin(brokers=address) as admin:
        for mq in set(expected.values()):
            for m in admin.pull(mq, 0, max_nums=20).messages:
                stored.setdefault(m.message_group, []).append((m.message_queue, m.properties["__SHARDINGKEY"]))
    assert stored == {g: [(mq, g)] * 3 for g, mq in expected.items()}
