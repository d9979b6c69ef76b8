"""A handover's first records come with the lock grant (issue 30): the joining consumer opens the queues it
asks locks for on its fetch stream ahead of the grant (FetchOpen.after_lock), the broker starts each there
from the old owner's final commit the moment the lock is the joiner's, and the joiner's lease reads on
that handle. A real broker process and two consumers; every message consumed exactly once, and nothing
opened ahead is left open once the queues settled (at the client, nor at the broker: one handle per lease)."""

from __future__ import annotations

import collections
import threading

from brokerproc import free_port
from workload import create_topic, metric, produce, wait_until

from tidemark.client import ConsumeConcurrentlyStatus, PushConsumer


def consumer(address: str, group: str, topic: str, seen: list[str], lock: threading.Lock) -> PushConsumer:
    c = PushConsumer(group=group, brokers=address)
    c.subscribe(topic)

    def listener(msgs, context):
        with lock:
            seen.extend(m.msg_id for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    c.register_message_listener(listener)
    return c


def test_a_joiner_reads_handed_over_queues_on_the_handles_it_opened_ahead_with_no_duplicates(broker_factory):
    port = free_port()
    broker = broker_factory(args=("--metrics-port", str(port)))
    create_topic(broker.address, "Ahead", 4)
    seen: list[str] = []
    lock = threading.Lock()
    first = consumer(broker.address, "aheads", "Ahead", seen, lock)
    second = consumer(broker.address, "aheads", "Ahead", seen, lock)
    try:
        first.start()
        ids = produce(broker.address, "Ahead", 200)
        wait_until(lambda: len(seen) >= 200, 30, "the first consumer to read everything")
        second.start()  # two of the four queues move: the first's final commits, then the second's locks
        wait_until(lambda: sum(q.topic == "Ahead" for q in second._core.ownership.pulling()) == 2, 30,
                   "the handover")
        ids += produce(broker.address, "Ahead", 200, prefix="n")
        wait_until(lambda: len(seen) >= 400, 30, "every message consumed")
        fetcher = second._core.fetcher
        assert fetcher.taken_over >= 2, "the joiner's leases did not read on the handles opened ahead"
        with lock:
            counts = collections.Counter(seen)
        assert set(counts) == set(ids)
        assert not {k: v for k, v in counts.items() if v > 1}, "messages delivered more than once"
        consumers = (first._core, second._core)
        wait_until(lambda: not any(c.fetcher.opened_ahead for c in consumers), 30,
                   "every handle opened ahead taken over or closed at the client")
        wait_until(lambda: metric(port, "tidemark_fetch_queues") == sum(len(c.ownership.pulling()) for c in consumers),
                   30, "the broker to serve one handle per lease, none left waiting for a lock")
    finally:
        second.shutdown()
        first.shutdown()
