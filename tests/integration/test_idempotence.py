"""The idempotent producer against real brokers: a retried batch is stored once, across restarts too."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading

import grpc
import pytest
from brokerproc import BrokerStubs
from workload import stored_messages

from tidemark.client import Admin, Message, Producer
from tidemark.client.errors import (
    InternalError,
    RequestTimeoutError,
    TidemarkError,
    UnavailableError,
)
from tidemark.client.remoting import streams
from tidemark.common.records import RecordBatchBuilder, encode_properties
from tidemark.v1 import messaging_pb2


def stored(address: str, topic: str) -> list[bytes]:
    return [m.body for m in stored_messages(address, topic)]


def drop_first_answer(monkeypatch, after_stored=lambda: None) -> list[int]:
    """The first produce answer is lost on the way back: the batch is stored, the client sees a timeout
    (then `after_stored` runs, e.g. a broker restart). Returns the list of sends made."""
    original = streams.ProduceStream.send
    calls: list[int] = []

    async def send(self, topic, queue_id, count, data, timeout, sequence=None):
        calls.append(count)
        offset = await original(self, topic, queue_id, count, data, timeout, sequence=sequence)
        if len(calls) == 1:
            after_stored()
            raise RequestTimeoutError("no answer to a send (simulated: the answer was lost)")
        return offset

    monkeypatch.setattr(streams.ProduceStream, "send", send)
    return calls


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_retry_after_a_lost_answer_is_stored_once(broker, monkeypatch, idempotent):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Idem", 1)
    calls = drop_first_answer(monkeypatch)
    with Producer(brokers=broker.address, enable_idempotence=idempotent) as producer:
        results = producer.send_batch([Message("Idem", b"a"), Message("Idem", b"b")])
        after = producer.send(Message("Idem", b"c"))
    assert len(calls) == 3, "the first batch was sent twice, then the next message"
    bodies = stored(broker.address, "Idem")
    if idempotent:
        assert bodies == [b"a", b"b", b"c"]
        assert [r.queue_offset for r in results] == [0, 1], "the duplicate's answer is the original's offsets"
        assert after.queue_offset == 2
    else:
        assert bodies == [b"a", b"b", b"a", b"b", b"c"], "without idempotence the retry stores a second copy"


def fail_first_after_store(monkeypatch, error: Exception) -> list[int]:
    """The first produce call stores its batch, then fails with `error` (what a connection reset mid-call
    looks like to grpc: the batch is on the broker, the answer is lost)."""
    original = streams.ProduceStream.send
    calls: list[int] = []

    async def send(self, topic, queue_id, count, data, timeout, sequence=None):
        calls.append(count)
        offset = await original(self, topic, queue_id, count, data, timeout, sequence=sequence)
        if len(calls) == 1:
            raise error
        return offset

    monkeypatch.setattr(streams.ProduceStream, "send", send)
    return calls


@pytest.mark.parametrize("retries", [2, 0])
@pytest.mark.parametrize("error", [InternalError("Internal error from Core"), UnavailableError("Socket closed"),
                                   asyncio.CancelledError()], ids=["internal", "unavailable", "cancelled"])
def test_a_send_whose_outcome_is_unknown_never_lends_its_sequence_to_the_next(broker, monkeypatch, retries, error):
    """Regression (issue 27): a send cut off after the broker stored it (InternalError from a reset) let
    the next batch reuse its sequence; the broker answered that batch as a duplicate of the stored one, and
    the producer acknowledged a message it never stored. Every acknowledgement must name the offset where
    its own message is."""
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Unknown", 1)
    fail_first_after_store(monkeypatch, error)
    acked = {}
    with Producer(brokers=broker.address, retry_times_when_send_failed=retries) as producer:
        for body in (b"a", b"b", b"c"):
            try:
                acked[body] = producer.send(Message("Unknown", body)).queue_offset
            except (TidemarkError, asyncio.CancelledError, concurrent.futures.CancelledError):
                assert body == b"a" and (retries == 0 or isinstance(error, asyncio.CancelledError))
    bodies = stored(broker.address, "Unknown")
    for body, offset in acked.items():
        assert bodies[offset] == body, f"{body!r} was acknowledged at offset {offset}, which holds {bodies[offset]!r}"
    assert bodies.count(b"a") == 1 and {b"b", b"c"} <= set(bodies)


def test_a_broker_restart_between_the_try_and_the_retry_still_deduplicates(broker, monkeypatch):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("IdemRestart", 2)
    reached, killed = threading.Event(), threading.Event()
    # The retry waits until the broker is dead (kill -9 from this thread: a child dies with the thread that
    # started it), so it reaches the restarted broker, which knows the batch from its journal only.
    drop_first_answer(monkeypatch, after_stored=lambda: (reached.set(), killed.wait(10)))
    with Producer(brokers=broker.address, retry_times_when_send_failed=12) as producer:
        future = producer.send_async(Message("IdemRestart", b"once"))
        assert reached.wait(10)
        broker.kill()
        killed.set()
        broker.start()
        first = future.result(30)
        second = producer.send(Message("IdemRestart", b"twice"), queue=first.message_queue)
    assert sorted(stored(broker.address, "IdemRestart")) == [b"once", b"twice"]
    assert (first.queue_offset, second.queue_offset) == (0, 1)
    with Admin(brokers=broker.address) as admin:
        (producer_info,) = admin.list_producers("IdemRestart")
    (queue,) = producer_info.queues
    assert (queue.queue_id, queue.last_sequence, queue.last_offset) == (first.message_queue.queue_id, 1, 1)


def test_concurrent_producers_keep_separate_sequences(broker):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("IdemMany", 2)
    per_producer = 400
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            with Producer(brokers=broker.address, linger_ms=1) as producer:
                futures = [producer.send_async(Message("IdemMany", b"%d-%d" % (n, i))) for i in range(per_producer)]
                for f in futures:
                    f.result(30)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    bodies = stored(broker.address, "IdemMany")
    assert len(bodies) == len(set(bodies)) == 4 * per_producer
    with Admin(brokers=broker.address) as admin:
        producers = admin.list_producers("IdemMany")
    assert len(producers) == 4
    for p in producers:  # sequences count each producer's own messages, per queue
        assert sum(q.last_sequence + 1 for q in p.queues) == per_producer


def _batch(topic: str, body: bytes) -> bytes:
    builder = RecordBatchBuilder(topic)
    builder.append(body, encode_properties({"UNIQ_KEY": body.hex()}))
    return bytes(builder.buffer)


def test_unknown_producers_and_out_of_order_sequences_are_refused_and_store_nothing(broker):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("IdemBad", 1)
    with BrokerStubs(broker.address) as stubs:
        producer_id = stubs.messaging.InitProducer(messaging_pb2.InitProducerRequest()).producer_id
        assert stubs.messaging.InitProducer(messaging_pb2.InitProducerRequest(key="k")).producer_id == \
            stubs.messaging.InitProducer(messaging_pb2.InitProducerRequest(key="k")).producer_id

        def produce(pid: int, seq: int, body: bytes, gaps: bool = True):
            return list(stubs.messaging.Produce(iter([messaging_pb2.ProduceRequest(
                request_id=1, topic="IdemBad", queue_id=0, count=1, records=_batch("IdemBad", body),
                producer_id=pid, base_sequence=seq, sequence_gaps=gaps)])))[0]

        unknown = produce(producer_id + 1000, 0, b"x")
        assert unknown.code == grpc.StatusCode.NOT_FOUND.value[0] and unknown.error_class == "UnknownProducerError"
        gap = produce(producer_id, 5, b"x")
        assert gap.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert gap.error_class == "SequenceGapError" and "must have sequence 0" in gap.error
        # A producer from before several batches in flight does not know SequenceGapError: it is told of
        # the gap as the out-of-order sequence it answers with a new epoch.
        old_client = produce(producer_id, 5, b"x", gaps=False)
        assert old_client.error_class == "OutOfOrderSequenceError" and "must have sequence 0" in old_client.error
        assert produce(producer_id, 0, b"first").first_queue_offset == 0
        again = produce(producer_id, 0, b"first")
        assert again.duplicate and again.first_queue_offset == 0
        reused = produce(producer_id, 0, b"other")  # the same sequence for another message: not a duplicate
        assert reused.error_class == "OutOfOrderSequenceError" and "hold another batch" in reused.error
        assert not reused.duplicate
        skip = produce(producer_id, 2, b"x")
        assert skip.error_class == "SequenceGapError" and "expected sequence 1, got 2" in skip.error
    assert stored(broker.address, "IdemBad") == [b"first"]


def test_producer_list_shows_ids_and_sequences(broker, monkeypatch, capsys):
    from tidemark.client.cli import main as cli

    monkeypatch.setattr(cli, "setup_logging", lambda *a, **k: None)
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("IdemCli", 1)
    with Producer(brokers=broker.address, producer_key="job-7") as producer:
        for i in range(3):
            producer.send(Message("IdemCli", b"m%d" % i))
    assert cli.main(["producer", "list", "--broker", broker.address, "--json", "--topic", "IdemCli"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["key"], row["topic"], row["queue"], row["last_sequence"], row["last_offset"]) == \
        ("job-7", "IdemCli", 0, 2, 2)


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "free"])
def test_a_reset_mid_call_is_retried_on_the_same_queue_though_another_broker_serves_the_topic(
        broker_factory, monkeypatch, pinned):
    """Found in review (issue 27): any UnavailableError counted as "the broker is unreachable", so with a
    second broker name serving the topic a batch cut off by a reset left its sequence: a pinned send came
    back to its queue under a new epoch, a free one went to the other broker, and a batch the first broker
    had stored was stored twice. A call cut off mid-way is retried with its sequence; only a broker that
    cannot be reached is left."""
    a, b = broker_factory("broker-a"), broker_factory("broker-b")
    for broker in (a, b):
        with Admin(brokers=broker.address) as admin:
            admin.create_topic("Twice", 1)
    calls = fail_first_after_store(monkeypatch, UnavailableError("Socket closed"))
    with Producer(brokers=f"{a.address},{b.address}") as producer:
        target = next(q for q in producer.fetch_publish_message_queues("Twice") if q.broker_name == "broker-a")
        result = producer.send(Message("Twice", b"once"), queue=target if pinned else None)
    assert len(calls) == 2, "one try, cut off after the store, and one retry"
    held = {"broker-a": stored(a.address, "Twice"), "broker-b": stored(b.address, "Twice")}
    assert held[result.message_queue.broker_name] == [b"once"]
    assert sum(held.values(), []) == [b"once"], f"stored twice: {held}"
