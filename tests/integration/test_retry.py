"""Retry, delay levels and the dead-letter queue, against a real broker with a short delay table."""

from __future__ import annotations

import json
import sys
import threading
import time

import forkserver
from workload import create_topic, produce, queue, settled, wait_until

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    Message,
    NotFoundError,
    Producer,
    PushConsumer,
)

# Level n waits n * 100 ms, so retry k (level 3 + k) waits (3 + k) * 100 ms.
LEVELS = " ".join(f"{n * 100}ms" for n in range(1, 19))
BROKER_ARGS = ("--delay-levels", LEVELS)


class Deliveries:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[float, object]] = []

    def add(self, msgs) -> None:
        now = time.monotonic()
        with self.lock:
            self.items.extend((now, m) for m in msgs)

    def of(self, msg_id: str) -> list[tuple[float, object]]:
        with self.lock:
            return [(t, m) for t, m in self.items if m.msg_id == msg_id]


def consumer(address: str, group: str, topic: str, listener, *, orderly: bool = False, **kw) -> PushConsumer:
    c = PushConsumer(group=group, brokers=address, consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                     persist_consumer_offset_interval_s=0.2, **kw)
    c.subscribe(topic)
    if orderly:
        c.register_message_listener_orderly(listener)
    else:
        c.register_message_listener(listener)
    return c.start()


def committed(address: str, group: str, topic: str) -> dict[int, int]:
    with Admin(brokers=address) as admin:
        return {s.queue.queue_id: s.consumer_offset for s in admin.consume_stats(group, topic)}


def test_fails_three_times_then_succeeds_with_configured_delays(broker_factory):
    broker = broker_factory(args=BROKER_ARGS)
    create_topic(broker.address, "Jobs", 1)
    deliveries = Deliveries()

    def listener(msgs, ctx):
        deliveries.add(msgs)
        return (ConsumeConcurrentlyStatus.RECONSUME_LATER if msgs[0].reconsume_times < 3
                else ConsumeConcurrentlyStatus.CONSUME_SUCCESS)

    c = consumer(broker.address, "workers", "Jobs", listener)
    try:
        with Producer(brokers=broker.address) as p:
            msg_id = p.send(Message("Jobs", b"job-1", tags="t", keys="k1")).msg_id
        wait_until(lambda: len(deliveries.of(msg_id)) >= 4, 30, "four deliveries")
        wait_until(lambda: settled(broker.address, "workers", "Jobs"), 30, "the group to commit everything")
    finally:
        c.shutdown()
    got = deliveries.of(msg_id)
    assert len(got) == 4
    assert [m.reconsume_times for _, m in got] == [0, 1, 2, 3]
    assert {m.msg_id for _, m in got} == {msg_id}
    assert all(m.topic == "Jobs" and m.body == b"job-1" and m.tags == "t" and m.keys == "k1" for _, m in got)
    gaps = [b[0] - a[0] for a, b in zip(got, got[1:], strict=False)]
    for k, gap in enumerate(gaps):
        expected = (3 + k) * 0.1
        assert gap >= expected - 0.05, f"retry {k + 1} came after {gap:.3f}s, before its delay level {expected}s"
    assert committed(broker.address, "workers", "Jobs") == {0: 1}


def test_always_failing_message_lands_in_dlq_and_queue_moves_on(broker_factory, tmp_path):
    broker = broker_factory(args=BROKER_ARGS)
    create_topic(broker.address, "Jobs", 1)
    deliveries = Deliveries()

    def listener(msgs, ctx):
        deliveries.add(msgs)
        return (ConsumeConcurrentlyStatus.RECONSUME_LATER if msgs[0].body == b"poison"
                else ConsumeConcurrentlyStatus.CONSUME_SUCCESS)

    c = consumer(broker.address, "strict", "Jobs", listener, max_reconsume_times=2)
    try:
        with Producer(brokers=broker.address) as p:
            poison = p.send(Message("Jobs", b"poison")).msg_id
            good = p.send(Message("Jobs", b"fine")).msg_id
        with Admin(brokers=broker.address) as admin:
            wait_until(lambda: _dlq_ids(admin, "strict") == [poison], 30, "the poison message in the DLQ")
        wait_until(lambda: committed(broker.address, "strict", "Jobs") == {0: 2}, 10, "commit offset past both")
    finally:
        c.shutdown()
    assert [m.reconsume_times for _, m in deliveries.of(poison)] == [0, 1, 2]
    assert len(deliveries.of(good)) == 1

    # dlq requeue sends it back to Jobs; a consumer that now accepts it gets it.
    out = forkserver.run([sys.executable, "-m", "tidemark.client.cli.main", "dlq", "requeue", "strict", "--all",
                          "--execute", "--broker", broker.address], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert poison in out.stdout
    accepted = Deliveries()

    def accept(msgs, ctx):
        accepted.add(msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c2 = consumer(broker.address, "strict", "Jobs", accept)
    try:
        wait_until(lambda: accepted.of(poison), 30, "the requeued message")
    finally:
        c2.shutdown()
    assert accepted.of(poison)[0][1].body == b"poison"


def _dlq_ids(admin: Admin, group: str) -> list[str]:
    try:
        return [m.msg_id for m in admin.dead_letters(group, 100)]
    except NotFoundError:
        return []


def test_ack_index_is_honoured_on_reconsume_later(broker_factory):
    broker = broker_factory(args=BROKER_ARGS)
    create_topic(broker.address, "Batch", 1)
    with Producer(brokers=broker.address) as p:
        ids = [r.msg_id for r in p.send_batch([Message("Batch", b"m%d" % i) for i in range(10)],
                                              queue=queue("Batch", 0))]
    deliveries = Deliveries()
    first = threading.Event()

    def listener(msgs, ctx):
        deliveries.add(msgs)
        if not first.is_set() and len(msgs) == 10:
            first.set()
            ctx.ack_index = 4
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c = consumer(broker.address, "batchers", "Batch", listener, consume_message_batch_max_size=10)
    try:
        wait_until(lambda: first.is_set() and all(len(deliveries.of(i)) >= 2 for i in ids[5:]), 30,
                   "messages 5..9 retried")
        # Committed everything, retry topic included: a wrongly retried 0..4 would be there, not consumed.
        wait_until(lambda: settled(broker.address, "batchers", "Batch"), 30, "the group to commit everything")
    finally:
        c.shutdown()
    assert first.is_set()
    assert all(len(deliveries.of(i)) == 1 for i in ids[:5]), "messages up to ack_index were retried"
    assert all(len(deliveries.of(i)) == 2 for i in ids[5:])


def test_write_permission_off_keeps_commit_offset_at_the_failed_message(broker_factory):
    broker = broker_factory(args=BROKER_ARGS)
    create_topic(broker.address, "Perm", 1)
    ids = produce(broker.address, "Perm", 6, batch=6)
    deliveries = Deliveries()
    healed = threading.Event()

    def listener(msgs, ctx):
        deliveries.add(msgs)
        if msgs[0].msg_id == ids[0] and not healed.is_set():
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    with Admin(brokers=broker.address) as admin:
        admin.update_broker_permission("broker-a", readable=True, writable=False)
        c = consumer(broker.address, "perm", "Perm", listener, local_retry_delay_s=0.3)
        try:
            wait_until(lambda: all(deliveries.of(i) for i in ids[1:]) and len(deliveries.of(ids[0])) >= 3, 30,
                       "the others consumed and the first retried locally")
            # Two more local retries (0.3 s apart) span several 0.2 s offset persists made after the others
            # were consumed: a commit past the failed message would have reached the broker by then.
            tries = len(deliveries.of(ids[0]))
            wait_until(lambda: len(deliveries.of(ids[0])) >= tries + 2, 30, "two more local retries")
            assert committed(broker.address, "perm", "Perm") == {0: 0}, "commit offset moved past a failed message"
            admin.update_broker_permission("broker-a", readable=True, writable=True)
            healed.set()
            wait_until(lambda: committed(broker.address, "perm", "Perm") == {0: 6}, 30, "the queue to complete")
        finally:
            c.shutdown()
    assert all(m.reconsume_times == 0 for _, m in deliveries.of(ids[0])), "it never left the client"


def test_scheduled_messages_survive_a_broker_restart_exactly_once(broker_factory):
    broker = broker_factory(args=("--delay-levels", "1s 2s 3s"))
    create_topic(broker.address, "Later", 2)
    with Producer(brokers=broker.address) as p:
        early = [p.send(Message("Later", b"early-%d" % i, delay_level=1)).msg_id for i in range(5)]
        late = [p.send(Message("Later", b"late-%d" % i, delay_level=3)).msg_id for i in range(10)]
    with Admin(brokers=broker.address) as admin:
        wait_until(lambda: _real_ids(admin, "Later") >= set(early), 10, "the 1 s messages delivered")
        assert not _real_ids(admin, "Later") & set(late)
    assert broker.stop() == 0  # graceful: schedule progress persisted
    broker.start()
    with Admin(brokers=broker.address) as admin:
        wait_until(lambda: _real_ids(admin, "Later") >= set(early) | set(late), 15, "the 3 s messages delivered")
        # The schedule's progress covers every scheduled message: nothing is left to deliver (again).
        wait_until(lambda: _schedule_done(admin, broker.data_dir), 15, "the schedule progress persisted")
        delivered = _real_list(admin, "Later")
    assert sorted(delivered) == sorted(early + late), "a scheduled message was lost or delivered twice"


def _schedule_done(admin: Admin, data_dir) -> bool:
    """delayOffset.json has every schedule queue's progress at its max offset."""
    path = data_dir / "config" / "delayOffset.json"
    if not path.exists():
        return False
    progress = json.loads(path.read_text())["offsetTable"]
    maxes = {mq.queue_id + 1: high for mq, (_, high) in
             admin.offsets(admin.fetch_message_queues("SCHEDULE_TOPIC_XXXX")).items() if high}
    return all(progress.get(str(level), 0) >= high for level, high in maxes.items())


def _real_list(admin: Admin, topic: str) -> list[str]:
    out = []
    for mq, (low, high) in admin.offsets(admin.fetch_message_queues(topic)).items():
        if high > low:
            out.extend(m.msg_id for m in admin.pull(mq, low, max_nums=1000).messages)
    return out


def _real_ids(admin: Admin, topic: str) -> set[str]:
    return set(_real_list(admin, topic))


def test_orderly_suspend_retries_locally_then_dead_letters(broker_factory):
    broker = broker_factory(args=BROKER_ARGS)
    create_topic(broker.address, "Ordered", 1)
    deliveries = Deliveries()

    def listener(msgs, ctx):
        deliveries.add(msgs)
        if msgs[0].body == b"stuck":
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    c = consumer(broker.address, "seq", "Ordered", listener, orderly=True, max_reconsume_times=2,
                 suspend_current_queue_time_ms=100)
    try:
        with Producer(brokers=broker.address) as p:
            stuck = p.send(Message("Ordered", b"stuck"), queue=queue("Ordered", 0)).msg_id
            after = p.send(Message("Ordered", b"next"), queue=queue("Ordered", 0)).msg_id
        wait_until(lambda: deliveries.of(after), 30, "the queue to move on")
        with Admin(brokers=broker.address) as admin:
            wait_until(lambda: _dlq_ids(admin, "seq") == [stuck], 10, "the stuck message in the DLQ")
    finally:
        c.shutdown()
    assert [m.reconsume_times for _, m in deliveries.of(stuck)] == [0, 1, 2]
    first_after = deliveries.of(after)[0][0]
    assert all(t <= first_after for t, _ in deliveries.of(stuck)), "order broken: next consumed before stuck gave up"
