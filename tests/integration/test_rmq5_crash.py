"""kill -9 of the broker while two pop consumers (RocketMQ 5's ReceiveMessage / AckMessage) are mid-flight.

Every message is eventually finished: the group's committed offsets reach the end, and each message was
acknowledged with an OK answer, except at most one per consumer whose ack was on the wire when the broker
died (the broker journalled it, then died before answering: the message is consumed, and the client
cannot know). None is acknowledged twice (an ack the broker answered was journalled first, so that message
is never handed out again). The deliveries beyond one per message are counted and printed: deliveries in
flight at the kill whose ack was lost come back after their invisible time. The consumers are raw protocol
clients with a short reconnect backoff, so what is measured is the broker, not a client library's
reconnect behaviour.
"""

from __future__ import annotations

import collections
import threading
import time

import grpc
from google.protobuf.duration_pb2 import Duration
from rmq5lib import Rmq5Stub, resource
from workload import wait_until

from tidemark.client import Admin, Message, Producer
from tidemark.rmq5.v2 import messaging_pb2 as pb

MESSAGES = 2_000
CHANNEL_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500),
                   ("grpc.min_reconnect_backoff_ms", 100))


def test_pop_consumers_survive_a_broker_kill_without_double_acks(broker, capsys):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Crash", 4)
    with Producer(brokers=broker.address) as producer:
        ids = []
        for n in range(0, MESSAGES, 50):
            ids += [r.msg_id for r in producer.send_batch([Message("Crash", b"c-%d" % i) for i in range(n, n + 50)])]
    acked: collections.Counter[str] = collections.Counter()
    delivered: collections.Counter[str] = collections.Counter()
    unanswered: dict[str, float] = {}  # message id -> when its ack was sent, for acks that got no answer
    lock = threading.Lock()
    stop = threading.Event()
    group, topic = resource("crash-group"), resource("Crash")
    receive = pb.ReceiveMessageRequest(group=group, message_queue=pb.MessageQueue(topic=topic), batch_size=32,
                                       invisible_duration=Duration(seconds=10),
                                       long_polling_timeout=Duration(seconds=1))

    def consume(n: int) -> None:
        with grpc.insecure_channel(broker.address, options=CHANNEL_OPTIONS) as channel:
            stub = Rmq5Stub(channel, client_id=f"127.0.0.1@crash-{n}")
            while not stop.is_set():
                try:
                    answers = list(stub.ReceiveMessage(receive, timeout=5))
                except grpc.RpcError:
                    time.sleep(0.1)  # the broker is down: try again
                    continue
                for m in (a.message for a in answers if a.HasField("message")):
                    msg_id = m.system_properties.message_id
                    with lock:
                        delivered[msg_id] += 1
                    sent = time.monotonic()
                    try:
                        answer = stub.AckMessage(pb.AckMessageRequest(group=group, topic=topic, entries=[
                            pb.AckMessageEntry(message_id=msg_id, receipt_handle=m.system_properties.receipt_handle)]),
                            timeout=5)
                    except grpc.RpcError:
                        with lock:  # lost with the connection: it comes back after its invisible time,
                            unanswered[msg_id] = sent  # unless the broker took it just before dying
                        continue
                    if answer.status.code == pb.OK:
                        with lock:
                            acked[msg_id] += 1

    threads = [threading.Thread(target=consume, args=(n,), daemon=True) for n in range(2)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 600, 60, "600 acks before the kill")
        broker.kill()
        killed = time.monotonic()
        at_kill = len(acked)
        broker.start()
        with Admin(brokers=broker.address) as admin:
            wait_until(lambda: finished(admin), 120, "every message finished after the restart",
                       details=lambda: f"progress {progress(admin)}, acked {len(acked)}, delivered "
                                       f"{len(delivered)} distinct, {sum(delivered.values())} deliveries\n"
                                       f"{broker.log_text()[-3000:]}")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert set(delivered) == set(ids)
    assert {k: v for k, v in acked.items() if v > 1} == {}, "an acknowledged message was acknowledged again"
    # Finished without an OK answer: only acks sent before the kill (one per consumer at most) may have
    # been taken by the dying broker; any other message is one the broker forgot.
    taken_unanswered = {m: unanswered.get(m) for m in set(ids) - set(acked)}
    assert len(taken_unanswered) <= len(threads) and all(
        t is not None and t < killed for t in taken_unanswered.values()), taken_unanswered
    extra = sum(delivered.values()) - MESSAGES
    with capsys.disabled():
        print(f"\npop crash: {MESSAGES} messages, {at_kill} acked before kill -9, "
              f"{extra} redeliveries after the restart")


def progress(admin: Admin) -> dict[str, tuple[int, int]]:
    """topic -> (committed offsets, lag) of the group, its pop retry topic included."""
    out: dict[str, tuple[int, int]] = {}
    for s in admin.consume_stats("crash-group"):
        done, lag = out.get(s.queue.topic, (0, 0))
        out[s.queue.topic] = (done + s.consumer_offset, lag + s.lag)
    return out


def finished(admin: Admin) -> bool:
    """The topic's queues are done to the end and so is every copy the broker revived into the retry topic."""
    p = progress(admin)
    return p.get("Crash") == (MESSAGES, 0) and all(lag == 0 for _, lag in p.values())
