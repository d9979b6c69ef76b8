"""The official Python client's SimpleConsumer and PushConsumer against a Tidemark broker (pop).

Messages are produced with Tidemark's own client, so each test also shows the
two clients exchanging messages with keys, tags and properties intact.
"""

from __future__ import annotations

import collections
import threading
import time

import pytest
from workload import wait_until

from tidemark.client import Admin, Message, NotFoundError, Producer


@pytest.fixture
def topic(broker) -> str:
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Events", 2)
    return "Events"


def _config(rmq, broker):
    return rmq.ClientConfiguration(broker.address, rmq.Credentials())


def _produce(address: str, topic: str, n: int, **fields) -> list[str]:
    with Producer(brokers=address) as producer:
        return [producer.send(Message(topic, b"m-%d" % i, keys=f"k{i}", **fields)).msg_id for i in range(n)]


def _committed(address: str, group: str, topic: str) -> int:
    """Messages of the topic the group has finished (its committed offsets, summed)."""
    with Admin(brokers=address) as admin:
        return sum(max(s.consumer_offset, 0) for s in admin.consume_stats(group, topic))


def test_simple_consumer_receives_what_a_tidemark_producer_sent_and_acks(broker, topic, official, rmq):
    ids = _produce(broker.address, topic, 10, tags="TagA", properties={"color": "red"})
    consumer = official(rmq.SimpleConsumer(_config(rmq, broker), "simple-a", {topic: rmq.FilterExpression("TagA")},
                                           await_duration=5))
    got = {}
    while len(got) < 10:
        for m in consumer.receive(16, 15):
            got[m.message_id] = m
            consumer.ack(m)
    assert set(got) == set(ids)
    m = got[ids[3]]
    assert (m.body, m.tag, set(m.keys), m.properties.get("color"), m.topic) == (b"m-3", "TagA", {"k3"}, "red", topic)
    assert m.delivery_attempt == 1 and not m.corrupted
    wait_until(lambda: _committed(broker.address, "simple-a", topic) == 10, 10, "every offset committed")
    assert consumer.receive(16, 15) == []


def test_tag_filter_delivers_only_matching_messages(broker, topic, official, rmq):
    _produce(broker.address, topic, 5, tags="Skip")
    wanted = set(_produce(broker.address, topic, 5, tags="Keep"))
    consumer = official(rmq.SimpleConsumer(_config(rmq, broker), "simple-tags", {topic: rmq.FilterExpression("Keep")},
                                           await_duration=2))
    got = set()
    deadline = time.monotonic() + 30
    while got != wanted and time.monotonic() < deadline:
        for m in consumer.receive(16, 15):
            assert m.tag == "Keep"
            got.add(m.message_id)
            consumer.ack(m)
    assert got == wanted
    wait_until(lambda: _committed(broker.address, "simple-tags", topic) == 10, 10, "skipped ones count as done")


def test_an_unacked_message_comes_back_after_its_invisible_time(broker, topic, official, rmq):
    [msg_id] = _produce(broker.address, topic, 1)
    consumer = official(rmq.SimpleConsumer(_config(rmq, broker), "simple-redeliver", {topic: rmq.FilterExpression()},
                                           await_duration=5))
    [first] = consumer.receive(16, 10)
    assert first.message_id == msg_id and first.delivery_attempt == 1
    # Not acked: invisible for 10 s, then delivered again, as attempt 2, with the same message id.
    started = time.monotonic()
    again = []
    while not again and time.monotonic() - started < 40:
        again = consumer.receive(16, 10)
    assert [m.message_id for m in again] == [msg_id] and again[0].delivery_attempt == 2
    assert time.monotonic() - started >= 9
    consumer.ack(again[0])
    from rocketmq.v5.exception import BadRequestException

    with pytest.raises(BadRequestException, match="stale"):
        consumer.ack(first)  # the first delivery's handle is over


def test_change_invisible_duration_redelivers_sooner(broker, topic, official, rmq):
    [msg_id] = _produce(broker.address, topic, 1)
    consumer = official(rmq.SimpleConsumer(_config(rmq, broker), "simple-change", {topic: rmq.FilterExpression()},
                                           await_duration=5))
    [m] = consumer.receive(16, 60)
    consumer.change_invisible_duration(m, 1)
    started = time.monotonic()
    again = []
    while not again and time.monotonic() - started < 20:
        again = consumer.receive(16, 60)
    assert [x.message_id for x in again] == [msg_id] and again[0].delivery_attempt == 2
    consumer.ack(again[0])
    wait_until(lambda: _committed(broker.address, "simple-change", topic) == 1, 10, "acked after the change")


def test_two_simple_consumers_of_one_group_share_without_duplicates(broker, topic, official, rmq):
    ids = _produce(broker.address, topic, 300)
    seen: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def consume(consumer) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if len(seen) >= len(ids):
                    return
            for m in consumer.receive(16, 30):
                with lock:
                    seen[m.message_id] += 1
                consumer.ack(m)

    consumers = [official(rmq.SimpleConsumer(_config(rmq, broker), "simple-shared", {topic: rmq.FilterExpression()},
                                             await_duration=2)) for _ in range(2)]
    threads = [threading.Thread(target=consume, args=(c,)) for c in consumers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(seen) == set(ids)
    assert {k: v for k, v in seen.items() if v > 1} == {}
    wait_until(lambda: _committed(broker.address, "simple-shared", topic) == 300, 10, "all committed")
    with Admin(brokers=broker.address) as admin:
        members = {m.client_id: m for m in admin.describe_group("simple-shared").members}
    assert len(members) == 2 and {m.consume_type for m in members.values()} == {"CONSUME_POP"}


@pytest.fixture
def fast_retry_broker(broker_factory):
    """Retries after 1 s, 2 s, 3 s... (delay levels 3 on), so a push consumer's nacks take seconds."""
    return broker_factory(args=("--delay-levels", "1s 1s 1s 2s 3s 4s 5s"))


def test_push_consumer_retries_a_failing_message_until_it_succeeds(fast_retry_broker, official, rmq):
    broker = fast_retry_broker
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Jobs", 2)
    [msg_id] = _produce(broker.address, "Jobs", 1)
    attempts: list[int] = []
    done = threading.Event()

    class FailTwice(rmq.MessageListener):
        def consume(self, message):
            attempts.append(message.delivery_attempt)
            if len(attempts) < 3:
                return rmq.ConsumeResult.FAILURE
            done.set()
            return rmq.ConsumeResult.SUCCESS

    official(rmq.PushConsumer(_config(rmq, broker), "push-retry", FailTwice(), {"Jobs": rmq.FilterExpression()}))
    assert done.wait(60), f"attempts so far: {attempts}"
    assert attempts == [1, 2, 3]
    wait_until(lambda: _committed(broker.address, "push-retry", "Jobs") == 1, 20, "the success committed")


def test_push_consumer_message_that_always_fails_goes_to_the_dlq(fast_retry_broker, official, rmq):
    broker = fast_retry_broker
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Jobs", 2)
        admin.update_group_config("push-dlq", retry_max_times=2)  # three attempts in all
    [msg_id] = _produce(broker.address, "Jobs", 1, tags="T", properties={"why": "poison"})
    attempts: list[int] = []

    class AlwaysFail(rmq.MessageListener):
        def consume(self, message):
            attempts.append(message.delivery_attempt)
            return rmq.ConsumeResult.FAILURE

    official(rmq.PushConsumer(_config(rmq, broker), "push-dlq", AlwaysFail(), {"Jobs": rmq.FilterExpression()}))

    def dead() -> list:
        with Admin(brokers=broker.address) as admin:
            try:
                return admin.dead_letters("push-dlq")
            except NotFoundError:
                return []  # no DLQ yet

    wait_until(lambda: len(dead()) == 1, 60, "the message dead-lettered")
    [letter] = dead()
    assert letter.msg_id == msg_id and letter.tags == "T" and letter.properties["why"] == "poison"
    assert attempts == [1, 2, 3]
    wait_until(lambda: _committed(broker.address, "push-dlq", "Jobs") == 1, 20, "dead-lettered counts as done")


def test_fifo_a_slow_message_group_does_not_delay_the_others_and_comes_back_in_place(broker, official, rmq):
    """FIFO per message group: three groups on one queue; the slow group's first message is not acked, the
    other two groups flow past it in order, and it comes back in place (attempt 2) before its own later
    messages."""
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Fifo", 1)  # every message group on one queue
        admin.update_group_config("fifo-group", consume_orderly=True)
    producer = official(rmq.Producer(_config(rmq, broker), ("Fifo",)))
    for n in range(5):
        for group in ("slow", "a", "b"):
            m = rmq.Message()
            m.topic, m.body, m.message_group = "Fifo", f"{group}-{n}".encode(), group
            producer.send(m)
    consumer = official(rmq.SimpleConsumer(_config(rmq, broker), "fifo-group", {"Fifo": rmq.FilterExpression()},
                                           await_duration=2))
    [slow] = consumer.receive(1, 10)  # not acked: it comes back after its invisible time
    assert (slow.body, slow.delivery_attempt) == (b"slow-0", 1)
    deliveries: list[tuple[bytes, int]] = []
    deadline = time.monotonic() + 60
    while len(deliveries) < 15 and time.monotonic() < deadline:
        for m in consumer.receive(32, 10):
            deliveries.append((m.body, m.delivery_attempt))
            consumer.ack(m)
    bodies = [body for body, _ in deliveries]
    for group in (b"a", b"b"):
        assert [b for b in bodies if b.startswith(group)] == [group + b"-%d" % n for n in range(5)]
    assert [d for d in deliveries if d[0].startswith(b"slow")] == [(b"slow-0", 2)] + [
        (b"slow-%d" % n, 1) for n in range(1, 5)], "redelivered in place, its group's later ones after it"
    assert max(bodies.index(b"a-4"), bodies.index(b"b-4")) < bodies.index(b"slow-0"), \
        "the other groups did not wait for the slow one"
    wait_until(lambda: _committed(broker.address, "fifo-group", "Fifo") == 15, 10, "every offset committed")
