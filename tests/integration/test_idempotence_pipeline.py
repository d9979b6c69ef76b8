"""Several batches per queue in flight with idempotence on (Kafka's up-to-5 rule), against a real broker.

A send's request is lost on the way (the broker never sees it: the batches
behind it arrive first and are refused as a gap), or its answer is lost (the
broker stored it; the client sees a reset). Whatever happens, every
acknowledgement names the offset that holds its own message, nothing is
stored twice, and a queue's batches are stored in the order they were sent.
"""

from __future__ import annotations

import asyncio
import collections
import threading

import pytest
from workload import stored_messages

from tidemark.client import Admin, Message, MessageQueue, Producer
from tidemark.client.errors import UnavailableError
from tidemark.client.remoting import streams


class FaultySends:
    """Wraps ProduceStream.send: calls named in `lost` never reach the broker, calls in `unanswered` are
    stored and then fail as a reset would. The first call holds its answer until `hold` more calls were
    made (so batches pile up behind it if the producer pipelines them; else it gives up after 10 s)."""

    def __init__(self, monkeypatch, *, lost=(), unanswered=(), hold: int = 0) -> None:
        self.lost, self.unanswered, self.hold = set(lost), set(unanswered), hold
        self.calls = 0
        self.in_flight: collections.Counter = collections.Counter()
        self.peak = 0
        self.sequences: list[tuple[int, int, int] | None] = []
        self._crowd: asyncio.Event | None = None
        original = streams.ProduceStream.send
        outer = self

        async def send(stream, topic, queue_id, count, data, timeout, sequence=None):
            n = outer.calls
            outer.calls += 1
            outer.sequences.append(sequence)
            if n in outer.lost:
                if outer._crowd is not None:
                    outer._crowd.set()  # the queue recovers now: nothing new goes out until call 0 is answered
                raise UnavailableError("Socket closed (simulated: the request was lost on its way)")
            key = (topic, queue_id)
            outer.in_flight[key] += 1
            outer.peak = max(outer.peak, outer.in_flight[key])
            try:
                if outer._crowd is None:
                    outer._crowd = asyncio.Event()
                if outer.calls > outer.hold:
                    outer._crowd.set()
                offset = await original(stream, topic, queue_id, count, data, timeout, sequence=sequence)
                if n == 0 and outer.hold:
                    try:
                        await asyncio.wait_for(outer._crowd.wait(), 10)
                    except TimeoutError:
                        pass
            finally:
                outer.in_flight[key] -= 1
            if n in outer.unanswered:
                raise UnavailableError("Socket closed (simulated: the answer was lost)")
            return offset

        monkeypatch.setattr(streams.ProduceStream, "send", send)


def check_history(address: str, topic: str, acked: dict[bytes, int], sent: list[bytes]) -> None:
    bodies = [m.body for m in stored_messages(address, topic)]
    for body, offset in acked.items():
        assert bodies[offset] == body, f"{body!r} was acknowledged at offset {offset}, which holds {bodies[offset]!r}"
    assert len(bodies) == len(set(bodies)), f"stored twice: {[b for b in set(bodies) if bodies.count(b) > 1]}"
    assert set(acked) <= set(bodies)
    assert bodies == [b for b in sent if b in set(bodies)], "a queue's batches are stored in the order sent"


@pytest.mark.parametrize("faults", [
    {},
    {"lost": {2}},
    {"unanswered": {1}},
    {"lost": {3, 9}, "unanswered": {5, 12}},
], ids=["none", "request-lost", "answer-lost", "both"])
def test_send_async_pipelines_batches_of_a_queue_and_recovers_in_order(module_broker, monkeypatch, faults):
    topic = f"Pipe-{'-'.join(sorted(faults)) or 'none'}"
    with Admin(brokers=module_broker.address) as admin:
        admin.create_topic(topic, 1)
    sends = FaultySends(monkeypatch, hold=3, **faults)
    queue = MessageQueue(topic, "broker-a", 0)
    sent = [b"m%03d" % i for i in range(40)]
    # batch_size 1: every message is a batch of its own, drained as soon as it is full.
    with Producer(brokers=module_broker.address, batch_size=1, retry_times_when_send_failed=4) as producer:
        futures = [producer.send_async(Message(topic, body), queue=queue) for body in sent]
        results = [f.result(60) for f in futures]
    assert 1 < sends.peak <= 5, f"batches of one queue on their way at once: {sends.peak}"
    check_history(module_broker.address, topic, {b: r.queue_offset for b, r in zip(sent, results, strict=True)}, sent)
    assert len(stored_messages(module_broker.address, topic)) == len(sent)


def test_sync_sends_from_threads_share_the_window_and_one_in_flight_is_a_setting(module_broker, monkeypatch):
    topic = "PipeSync"
    with Admin(brokers=module_broker.address) as admin:
        admin.create_topic(topic, 1)
    sends = FaultySends(monkeypatch, lost={4}, unanswered={7})
    queue = MessageQueue(topic, "broker-a", 0)
    acked: dict[bytes, int] = {}
    lock = threading.Lock()

    def send(producer: Producer, prefix: str) -> None:
        for i in range(15):
            body = b"%s-%02d" % (prefix.encode(), i)
            offset = producer.send(Message(topic, body), queue=queue).queue_offset
            with lock:
                acked[body] = offset

    with Producer(brokers=module_broker.address, retry_times_when_send_failed=4) as producer:
        threads = [threading.Thread(target=send, args=(producer, f"t{n}")) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    bodies = [m.body for m in stored_messages(module_broker.address, topic)]
    assert len(acked) == 60 and sorted(bodies) == sorted(acked)
    for body, offset in acked.items():
        assert bodies[offset] == body
    for n in range(4):  # each thread's sends, one after another, are stored in its order
        mine = [b for b in bodies if b.startswith(b"t%d-" % n)]
        assert mine == sorted(mine)
    assert sends.peak > 1

    one = FaultySends(monkeypatch)
    with Producer(brokers=module_broker.address, batch_size=1, max_in_flight_per_queue=1) as producer:
        for f in [producer.send_async(Message(topic, b"one-%d" % i), queue=queue) for i in range(10)]:
            f.result(30)
    assert one.peak == 1
