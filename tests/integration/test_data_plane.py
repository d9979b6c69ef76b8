"""The data plane against a real broker: Produce and Fetch streams over gRPC, and record batches that
survive kill -9 (sync flush) and read back through recovery, `message get` and the consumers."""

from __future__ import annotations

import struct
import threading

import grpc
import pytest
from brokerproc import BrokerStubs
from workload import create_topic, wait_until

from tidemark.client import Admin, Message, MessageQueue, Producer, UnavailableError
from tidemark.common.protocol import tag_hash
from tidemark.common.records import RecordBatchBuilder, encode_properties
from tidemark.v1 import messaging_pb2, offsets_pb2


def records(n: int, *, topic: str = "P", start: int = 0) -> bytes:
    b = RecordBatchBuilder(topic, "h")
    for i in range(n):
        b.append(b"body-%d" % (start + i), encode_properties({"UNIQ_KEY": f"ID{start + i}", "TAGS": "t"}),
                 tags_code=tag_hash("t"))
    return bytes(b.buffer)


def max_offset(stubs: BrokerStubs, topic: str, queue_id: int) -> int:
    return stubs.offsets.GetMaxOffset(offsets_pb2.QueueRequest(topic=topic, queue_id=queue_id), timeout=10).offset


def produce(stubs: BrokerStubs, requests: list[messaging_pb2.ProduceRequest]) -> list[messaging_pb2.ProduceResponse]:
    return list(stubs.messaging.Produce(iter(requests), timeout=10))


def test_bad_batches_are_refused_alone_and_store_nothing(broker):
    create_topic(broker.address, "P", 2)
    good = records(3)
    torn = good[:-7]
    lying_size = bytearray(good)
    struct.pack_into(">i", lying_size, 0, 40)
    bad_props = bytes(RecordBatchBuilder("P").buffer)
    b = RecordBatchBuilder("P")
    b.append(b"x", b"UNIQ_KEY\x01A\x02oops")  # properties that are not k\x01v\x02 pairs
    bad_props = bytes(b.buffer)
    big = RecordBatchBuilder("P")
    # Over max_message_size (4 MiB) but within the request limit: refused alone. (A request over
    # max_request_bytes is refused by gRPC itself and ends the stream: test_hardening.)
    big.append(b"x" * (4 * 1024 * 1024 + 1024), encode_properties({"UNIQ_KEY": "B"}))
    cases = [
        ("torn", dict(queue_id=0, count=3, records=torn), "INVALID_ARGUMENT"),
        ("lying size", dict(queue_id=0, count=3, records=bytes(lying_size)), "INVALID_ARGUMENT"),
        ("lying count", dict(queue_id=0, count=4, records=good), "INVALID_ARGUMENT"),
        ("bad properties", dict(queue_id=0, count=1, records=bad_props), "INVALID_ARGUMENT"),
        ("oversize", dict(queue_id=0, count=1, records=bytes(big.buffer)), "INVALID_ARGUMENT"),
        ("other topic", dict(queue_id=0, count=3, records=records(3, topic="Q")), "INVALID_ARGUMENT"),
        ("no such queue", dict(queue_id=9, count=3, records=good), "INVALID_ARGUMENT"),
        ("system topic", dict(topic="%RETRY%g", queue_id=0, count=3, records=good), "INVALID_ARGUMENT"),
        ("unknown topic", dict(topic="Nope", queue_id=0, count=3, records=records(3, topic="Nope")), "NOT_FOUND"),
    ]
    with BrokerStubs(broker.address) as stubs:
        requests = [messaging_pb2.ProduceRequest(request_id=i + 1, **{"topic": "P", **kw})
                    for i, (_, kw, _) in enumerate(cases)]
        requests.append(messaging_pb2.ProduceRequest(request_id=99, topic="P", queue_id=1, count=3, records=good))
        answers = produce(stubs, requests)
        assert [a.request_id for a in answers] == [r.request_id for r in requests]  # in order, one each
        for (name, _, code), answer in zip(cases, answers, strict=False):
            assert grpc.StatusCode[code].value[0] == answer.code, (name, answer)
            assert answer.error, name
        assert answers[-1].code == 0 and answers[-1].first_queue_offset == 0  # the stream carried on
        assert max_offset(stubs, "P", 0) == 0 and max_offset(stubs, "P", 1) == 3  # nothing of a bad batch


def test_a_fetch_stream_serves_many_queues_within_credit_and_waits_for_new_records(broker):
    create_topic(broker.address, "P", 2)
    with BrokerStubs(broker.address) as stubs:
        produce(stubs, [messaging_pb2.ProduceRequest(request_id=1, topic="P", queue_id=0, count=5, records=records(5))])
        outbox: list[messaging_pb2.FetchRequest] = []
        ready = threading.Event()

        def requests():
            sent = 0
            while True:
                ready.wait(10)
                ready.clear()
                while sent < len(outbox):
                    yield outbox[sent]
                    sent += 1
                if outbox and outbox[-1].WhichOneof("kind") == "close" and outbox[-1].close.handle == 0:
                    return

        for handle, queue_id in ((1, 0), (2, 1)):
            outbox.append(messaging_pb2.FetchRequest(open=messaging_pb2.FetchOpen(
                handle=handle, topic="P", queue_id=queue_id, offset=0, credit_messages=3, credit_bytes=10**6,
                batch_size=16)))
        ready.set()
        call = stubs.messaging.Fetch(requests(), timeout=20)
        first = next(call)
        assert [(r.handle, r.count, r.next_offset) for r in first.records] == [(1, 3, 3)]  # credit 3 of 5
        produce(stubs, [messaging_pb2.ProduceRequest(request_id=2, topic="P", queue_id=1, count=2,
                                                     records=records(2, start=10))])
        second = next(call)  # queue 1 was empty: its records arrive as they are stored
        assert [(r.handle, r.count) for r in second.records] == [(2, 2)]
        outbox.append(messaging_pb2.FetchRequest(credit=messaging_pb2.FetchCredit(handle=1, messages=10,
                                                                                  bytes=10**6)))
        ready.set()
        third = next(call)
        assert [(r.handle, r.count, r.next_offset) for r in third.records] == [(1, 2, 5)]
        outbox.append(messaging_pb2.FetchRequest(open=messaging_pb2.FetchOpen(
            handle=3, topic="P", queue_id=0, offset=-1, credit_messages=1, credit_bytes=1)))
        ready.set()
        fourth = next(call)
        assert fourth.ended[0].handle == 3 and fourth.ended[0].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        call.cancel()


def test_record_batches_survive_kill_9_with_sync_flush_and_read_back_everywhere(broker_factory):
    broker = broker_factory(args=("--flush", "sync"))
    create_topic(broker.address, "P", 4)
    acked: dict[str, tuple[MessageQueue, int]] = {}
    lock = threading.Lock()
    failures: list[Exception] = []

    def callback(result, error):
        with lock:
            if error is None:
                acked[result.msg_id] = (result.message_queue, result.queue_offset)
            else:
                failures.append(error)

    producer = Producer(brokers=broker.address, retry_times_when_send_failed=0, send_msg_timeout_s=5).start()
    stop = threading.Event()

    def send_forever():
        i = 0
        while not stop.is_set():
            try:
                producer.send_async(Message("P", b"m-%d" % i, keys=f"k{i}"), callback)
            except Exception:  # the producer closes under us at the end
                return
            i += 1

    sender = threading.Thread(target=send_forever, daemon=True)
    sender.start()
    wait_until(lambda: len(acked) >= 3000, 60, "3000 acknowledged record-batch sends")
    broker.kill()
    wait_until(lambda: failures, 30, "the producer to see the broker die")
    stop.set()
    sender.join(10)
    with lock:
        snapshot = dict(acked)
    try:
        producer.shutdown()
    except UnavailableError:
        pass

    broker.start()
    assert "not shut down cleanly" in broker.log_text()
    with Admin(brokers=broker.address) as admin:
        for mq in admin.fetch_message_queues("P"):
            mine = sorted(offset for q, offset in snapshot.values() if q == mq)
            low, high = admin.offsets([mq])[mq]
            assert high >= len(mine) and mine == list(range(len(mine)))  # no acknowledged record lost
        sample = list(snapshot.items())[:: max(1, len(snapshot) // 50)]
        for msg_id, (mq, offset) in sample:
            m = admin.view_message(mq, offset)  # `message get` reads what recovery kept
            assert m.msg_id == msg_id and m.body.startswith(b"m-") and m.keys.startswith("k")


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_producer_batches_keep_per_message_results_and_order(broker_factory, flush):
    broker = broker_factory(args=("--flush", flush))
    create_topic(broker.address, "P", 1)
    with Producer(brokers=broker.address, linger_ms=5) as producer:
        futures = [producer.send_async(Message("P", b"%d" % i)) for i in range(500)]
        results = [f.result(10) for f in futures]
    assert [r.queue_offset for r in results] == list(range(500))  # one queue: send order is offset order
    assert len({r.msg_id for r in results}) == 500
