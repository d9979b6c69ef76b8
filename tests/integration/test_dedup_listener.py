"""DedupListener on a real PushConsumer: a message sent twice (as a producer retry would) is handled once."""

from __future__ import annotations

import threading
import time
from collections import Counter

from workload import create_topic, settled, wait_until

from tidemark.client import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    Producer,
    PushConsumer,
)
from tidemark.client.consumer.dedup import DedupKey, DedupListener, MemoryDedupStore

# Level n waits n * 100 ms: a message retried because its copy was in flight comes back in ~0.3 s.
BROKER_ARGS = ("--delay-levels", " ".join(f"{n * 100}ms" for n in range(1, 19)))
KEYS = [f"order-{i}" for i in range(40)]
FAILS_ONCE = "order-7"


def test_each_key_is_handled_once_when_every_message_is_sent_twice(broker_factory):
    broker = broker_factory(args=BROKER_ARGS)
    create_topic(broker.address, "Payments", 4)
    lock = threading.Lock()
    handled: Counter[str] = Counter()
    attempts: Counter[str] = Counter()

    def charge(msgs, ctx):
        """Handles a run of messages; the first attempt at FAILS_ONCE fails it and what follows."""
        time.sleep(0.005 * len(msgs))  # the work: long enough for a key's two copies to overlap
        for i, m in enumerate(msgs):
            with lock:
                attempts[m.keys] += 1
                if m.keys == FAILS_ONCE and attempts[m.keys] == 1:
                    ctx.ack_index = i - 1
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER
                handled[m.keys] += 1
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    # Both copies of a key are stored before the consumer starts, on neighbouring queues at about the
    # same position: the four queues are consumed at once, so copies meet in flight, not only in turn.
    with Producer(brokers=broker.address) as producer:
        queues = producer.fetch_publish_message_queues("Payments")
        sent = [producer.send(Message("Payments", k.encode(), keys=k), queue=queues[(i + copy) % 4]).msg_id
                for i, k in enumerate(KEYS) for copy in range(2)]
    assert len(set(sent)) == 2 * len(KEYS)  # two different messages per key, as a re-send makes

    group = "payments"
    dedup = DedupListener(charge, group=group, store=MemoryDedupStore(max_entries=1000), key=DedupKey.KEYS)
    consumer = PushConsumer(group=group, brokers=broker.address,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                            consume_thread_max=8, consume_message_batch_max_size=4,
                            persist_consumer_offset_interval_s=0.1)
    consumer.subscribe("Payments")
    consumer.register_message_listener(dedup)
    consumer.start()
    try:
        wait_until(lambda: dedup.stats().skipped == len(KEYS) and settled(broker.address, group, "Payments"),
                   30, "every copy consumed and committed",
                   details=lambda: f"stats={dedup.stats()} handled={sum(handled.values())} attempts={attempts}")
    finally:
        consumer.shutdown()
    assert handled == Counter(KEYS), "a key was handled more than once, or not at all"
    assert attempts[FAILS_ONCE] == 2  # the failure cleared the mark: the retry ran it
