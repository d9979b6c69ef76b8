"""PushConsumer.shutdown() called from where a plain "wait until it is over" would go wrong.

A second shutdown() beside one under way returns once the consumer is SHUTDOWN, not at once while it is
still STOPPING: whoever calls it may then rely on it (close what the listener uses, exit).

A PushConsumer shut down by its own listener, on the consume thread that runs the listener's batch.

Consume until something, then stop: a common way to end a consumer. The shutdown cannot wait for the
batch of the listener that called it (that batch ends only once shutdown() returns), so it hands the
queues back without it, as it does with a batch that outlived drain_timeout_s, but without that wait:
the batch is not committed, and its messages go to whoever reads the queue next. Both listener kinds,
both with queue locks (the zero-duplicate handover, whose drain would wait for the batch) and without.
"""

from __future__ import annotations

import threading

import pytest
from workload import create_topic, produce, wait_until

from tidemark.client import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    PushConsumer,
)
from tidemark.client.runtime import ClientState

# Far longer than the waits below: a shutdown that waited for its caller's batch would fail them.
DRAIN_TIMEOUT_S = 120.0


class StopsItself:
    """A listener that shuts its consumer down at its first batch, from the consume thread, and records
    what it saw and when shutdown() returned."""

    def __init__(self, ok) -> None:
        self.ok = ok
        self.consumer: PushConsumer | None = None
        self.first: list[str] = []
        self.others: list[str] = []
        self.lock = threading.Lock()
        self.returned = threading.Event()
        self.error: BaseException | None = None

    def __call__(self, msgs, context):
        with self.lock:
            mine = not self.first
            (self.first if mine else self.others).extend(m.msg_id for m in msgs)
        if mine:
            try:
                self.consumer.shutdown()
            except BaseException as e:  # reported to the test
                self.error = e
            self.returned.set()
        return self.ok


class Collector:
    def __init__(self, ok) -> None:
        self.ok = ok
        self.lock = threading.Lock()
        self.seen: list[str] = []

    def __call__(self, msgs, context):
        with self.lock:
            self.seen.extend(m.msg_id for m in msgs)
        return self.ok


def consumer_for(address: str, group: str, topic: str, listener, *, orderly: bool, **settings) -> PushConsumer:
    consumer = PushConsumer(group=group, brokers=address, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                            drain_timeout_s=DRAIN_TIMEOUT_S, **settings)
    consumer.subscribe(topic)
    if orderly:
        consumer.register_message_listener_orderly(listener)
    else:
        consumer.register_message_listener(listener)
    return consumer


@pytest.mark.parametrize("orderly", [False, True], ids=["concurrently", "orderly"])
@pytest.mark.parametrize("locking", [True, False], ids=["locks", "no-locks"])
def test_a_listener_shuts_its_consumer_down_without_waiting_for_its_own_batch(broker, orderly, locking):
    ok = ConsumeOrderlyStatus.SUCCESS if orderly else ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    topic, group = f"Stop{orderly:d}{locking:d}", f"stoppers{orderly:d}{locking:d}"
    create_topic(broker.address, topic, 2)
    listener = StopsItself(ok)
    consumer = listener.consumer = consumer_for(broker.address, group, topic, listener, orderly=orderly,
                                                queue_locking=locking, instance_name="first")
    consumer.start()
    ids = produce(broker.address, topic, 40)  # (after the start: the test is of a running consumer)
    try:
        assert listener.returned.wait(30), "shutdown() from the listener waited for the listener's own batch"
        assert listener.error is None, listener.error
        assert consumer.state is ClientState.SHUTDOWN
    finally:
        consumer.shutdown()  # (idempotent: cleans up after a failed assertion)
    # Its batch was not committed: the group's next reader gets those messages again, and every message
    # of the topic once at least.
    again = Collector(ok)
    successor = consumer_for(broker.address, group, topic, again, orderly=orderly, queue_locking=locking,
                             instance_name="second")
    successor.start()
    try:
        wait_until(lambda: set(listener.first) <= set(again.seen), 30, "the first batch read again")
        wait_until(lambda: set(ids) <= set(again.seen) | set(listener.others), 30, "every message")
    finally:
        successor.shutdown()


def test_a_second_shutdown_returns_once_the_first_is_over(broker):
    create_topic(broker.address, "Held", 1)
    entered, release = threading.Event(), threading.Event()

    def held(msgs, context):
        entered.set()
        release.wait(60)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    consumer = consumer_for(broker.address, "holders", "Held", held, orderly=False)
    consumer.start()
    first = threading.Thread(target=consumer.shutdown, name="first-shutdown")
    try:
        produce(broker.address, "Held", 1)
        assert entered.wait(30), "the listener never ran"
        first.start()  # it drains the queue: it waits for the held batch
        wait_until(lambda: consumer.state is ClientState.STOPPING, 30, "the first shutdown under way")
        after: list[ClientState] = []
        returned = threading.Event()

        def second() -> None:
            consumer.shutdown()
            after.append(consumer.state)
            returned.set()
        threading.Thread(target=second, name="second-shutdown").start()
        assert not returned.wait(0.5), f"the second shutdown() returned while the first ran: {after}"
    finally:
        release.set()
        consumer.shutdown()  # (after a failed assertion: what the test started ends)
    first.join(60)
    assert returned.wait(30), "the second shutdown() did not return once the first was over"
    assert after == [ClientState.SHUTDOWN]


def test_a_listener_shuts_down_its_consumer_whose_stop_already_waits_for_the_listener(broker):
    """A shutdown() under way on another thread has reached the consume pool's join of the threads (no
    locks, no await_termination: it does not wait for the batches first) while a listener is in its call;
    the listener then shuts the consumer down too (a main thread's stop and a listener's "consume until
    something" meeting). Both return: the join does not wait for the thread whose listener waits for it."""
    create_topic(broker.address, "Joined", 1)
    entered, release = threading.Event(), threading.Event()
    returned: list[ClientState] = []
    consumer: PushConsumer | None = None

    def listener(msgs, context):
        entered.set()
        release.wait(60)
        consumer.shutdown()
        returned.append(consumer.state)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    consumer = consumer_for(broker.address, "joiners", "Joined", listener, orderly=False, queue_locking=False)
    consumer.start()
    pool = consumer._core.pool
    first = threading.Thread(target=consumer.shutdown, name="first-shutdown")
    try:
        produce(broker.address, "Joined", 1)
        assert entered.wait(30), "the listener never ran"
        first.start()
        wait_until(lambda: pool._stopped, 30, "the first shutdown at the pool's join")
    finally:
        release.set()
    first.join(DRAIN_TIMEOUT_S)
    assert not first.is_alive(), "the first shutdown() waited for the listener that waited for it"
    wait_until(lambda: returned, 30, "the listener's shutdown() returned")
    assert returned == [ClientState.SHUTDOWN]
