"""Producer against real brokers: sync, async, oneway, batches, selectors, retries, bad input."""

from __future__ import annotations

import array
import threading

import pytest
from workload import wait_until

from tidemark.client import (
    Admin,
    ClientStateError,
    InvalidArgumentError,
    Message,
    NotFoundError,
    Producer,
    SelectMessageQueueByHash,
)


def count(address: str, topic: str) -> int:
    with Admin(brokers=address) as admin:
        return sum(high - low for low, high in admin.offsets(admin.fetch_message_queues(topic)).values())


def test_async_oneway_and_selector(broker):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("P", 4)
    done = threading.Event()
    got = []
    with Producer(brokers=broker.address) as producer:
        future = producer.send_async(Message("P", b"async"))
        result = future.result(10)
        assert result.msg_id and result.queue_offset == 0
        producer.send_async(Message("P", b"cb"), callback=lambda r, e: (got.append((r, e)), done.set()))
        assert done.wait(10) and got[0][1] is None and got[0][0].msg_id
        for i in range(10):
            producer.send_oneway(Message("P", b"oneway-%d" % i))
        wait_until(lambda: count(broker.address, "P") == 12, 10, "oneway sends stored")
        selector = SelectMessageQueueByHash()
        queues = {producer.send(Message("P", b"ordered"), selector=selector, arg="order-42").message_queue
                  for _ in range(5)}
        assert len(queues) == 1, "one sharding key must map to one queue"
        failed = producer.send_async(Message("NoSuchTopic", b"x"))
        with pytest.raises(NotFoundError):
            failed.result(10)


def test_a_send_callback_may_send_again_on_success_and_on_failure(broker):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Cb", 1)
        admin.create_topic("Fallback", 1)
    followups: list = []
    done = threading.Event()

    def send_again(topic):
        def callback(result, error):
            followups.append(producer.send_async(Message(topic, b"again")))  # on the producer's own thread
            done.set()
        return callback

    # One slot in all, and routes that are always stale: the callback's send must neither wait for the
    # slot its own message holds nor block the loop to refresh a route.
    with Producer(brokers=broker.address, max_async_in_flight=1, route_refresh_interval_s=0.001) as producer:
        producer.send(Message("Cb", b"warm"))
        producer.send(Message("Fallback", b"warm"))
        producer.send_async(Message("Cb", b"first"), callback=send_again("Cb"))
        assert done.wait(10)
        assert followups[0].result(10).msg_id
        with Admin(brokers=broker.address) as admin:
            admin.delete_topic("Cb")
        done.clear()
        failed = producer.send_async(Message("Cb", b"lost"), callback=send_again("Fallback"))
        assert done.wait(10)
        with pytest.raises(NotFoundError):
            failed.result(10)
        assert followups[1].result(10).msg_id  # resent elsewhere from the failure callback
    assert count(broker.address, "Fallback") == 2


def test_retry_goes_to_another_brokers_queue(broker_factory):
    a = broker_factory("broker-a")
    b = broker_factory("broker-b")
    both = f"{a.address},{b.address}"
    with Admin(brokers=both) as admin:
        admin.create_topic("Twin", 2)
    with Producer(brokers=both, retry_times_when_send_failed=2, send_msg_timeout_s=2) as producer:
        assert {q.broker_name for q in producer.fetch_publish_message_queues("Twin")} == {"broker-a", "broker-b"}
        b.kill()  # the route still lists broker-b's queues
        results = [producer.send(Message("Twin", b"m%d" % i)) for i in range(6)]
    assert {r.message_queue.broker_name for r in results} == {"broker-a"}
    assert count(a.address, "Twin") == 6


def test_bad_input_and_lifecycle(broker):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Q1", 1)
        admin.create_topic("Q2", 1)
    producer = Producer(brokers=broker.address, max_message_size=1024)
    with pytest.raises(ClientStateError, match="start"):
        producer.send(Message("Q1", b"x"))
    producer.start()
    with pytest.raises(InvalidArgumentError, match="empty"):
        producer.send(Message("Q1", b""))
    with pytest.raises(InvalidArgumentError, match="max_message_size"):
        producer.send(Message("Q1", b"x" * 2000))
    with pytest.raises(InvalidArgumentError, match="share a topic"):
        producer.send_batch([Message("Q1", b"a"), Message("Q2", b"b")])
    with pytest.raises(InvalidArgumentError, match="topic name"):
        producer.send(Message("bad topic", b"x"))
    with pytest.raises(TypeError):
        Message("Q1", 12345)
    # Encoded records are counted in bytes, not in a view's items, and must lie in one piece.
    with pytest.raises(InvalidArgumentError, match="max_message_size"):
        producer.send_encoded_async("Q1", memoryview(array.array("q", [0] * 200)), 2)
    with pytest.raises(InvalidArgumentError, match="contiguous"):
        producer.send_encoded_async("Q1", memoryview(bytes(4000))[::2], 1)
    producer.shutdown()
    producer.shutdown()
    with pytest.raises(ClientStateError, match="shut down"):
        producer.send(Message("Q1", b"x"))
    with pytest.raises(ClientStateError):
        producer.start()


def test_shutdown_from_a_send_callback_is_refused_and_leaves_the_producer_running(broker):
    """A send_async callback runs on the producer's loop thread: a shutdown() there would wait for that
    thread, and it was left STOPPING for good (every later shutdown() returned at once, nothing closed)."""
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("CB", 1)
    producer = Producer(brokers=broker.address).start()
    errors, done = [], threading.Event()

    def callback(result, error):
        try:
            producer.shutdown()
        except ClientStateError as e:
            errors.append(e)
        done.set()
    producer.send_async(Message("CB", b"x"), callback=callback)
    assert done.wait(10)
    assert len(errors) == 1 and "own event loop thread" in str(errors[0])
    assert producer.send(Message("CB", b"still running")).queue_offset >= 0
    producer.shutdown()
    with pytest.raises(ClientStateError, match="shut down"):
        producer.send(Message("CB", b"x"))
