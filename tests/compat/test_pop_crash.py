"""kill -9 of the broker while two official SimpleConsumers are mid-flight.

Every message is eventually acknowledged; none is acknowledged twice (an ack
the broker answered was journalled first, so that message is never handed out
again); the deliveries beyond one per message are counted and printed: they are
the messages in flight when the broker died, handed out again after their
invisible time, plus acks lost with the connection.
"""

from __future__ import annotations

import collections
import threading
import time

from workload import wait_until

from client import Admin, Message, Producer

MESSAGES = 2_000


def test_pop_consumers_survive_a_broker_kill_without_double_acks(broker, official, rmq, capsys):
    with Admin(brokers=broker.address) as admin:
        admin.create_topic("Crash", 4)
    with Producer(brokers=broker.address) as producer:
        ids = []
        for n in range(0, MESSAGES, 50):
            ids += [r.msg_id for r in producer.send_batch([Message("Crash", b"c-%d" % i) for i in range(n, n + 50)])]
    acked: collections.Counter[str] = collections.Counter()
    delivered: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    stop = threading.Event()
    config = rmq.ClientConfiguration(broker.address, rmq.Credentials())

    def consume(consumer) -> None:
        while not stop.is_set():
            try:
                messages = consumer.receive(32, 10)
            except Exception:
                time.sleep(0.2)  # the broker is down: try again
                continue
            for m in messages:
                with lock:
                    delivered[m.message_id] += 1
                try:
                    consumer.ack(m)
                except Exception:
                    continue  # lost with the connection: it comes back after its invisible time
                with lock:
                    acked[m.message_id] += 1

    consumers = [official(rmq.SimpleConsumer(config, "crash-group", {"Crash": rmq.FilterExpression()},
                                             await_duration=2)) for _ in range(2)]
    threads = [threading.Thread(target=consume, args=(c,), daemon=True) for c in consumers]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(acked) >= 600, 60, "600 acks before the kill")
        broker.kill()
        at_kill = len(acked)
        broker.start()
        wait_until(lambda: len(acked) == MESSAGES, 120, "every message acked after the restart")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert set(acked) == set(ids)
    assert {k: v for k, v in acked.items() if v > 1} == {}, "an acknowledged ack was delivered again"
    extra = sum(delivered.values()) - MESSAGES
    with capsys.disabled():
        print(f"\npop crash: {MESSAGES} messages, {at_kill} acked before kill -9, "
              f"{extra} redeliveries after the restart")
    with Admin(brokers=broker.address) as admin:
        assert sum(s.consumer_offset for s in admin.consume_stats("crash-group", "Crash")) == MESSAGES
