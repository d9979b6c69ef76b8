"""Consumer groups with real consumer processes: handover, expiry, fencing, orderly."""

from __future__ import annotations

import collections
import threading
import time

import pytest
from faults.proxy import FaultProxy
from workload import ConsumerProcess, create_topic, produce, wait_until

from tidemark.client import Admin, Message, Producer

TOPIC = "Stream"


def steady_producer(address: str, total: int, rate: float, ids: list[str], done: threading.Event) -> threading.Thread:
    """Send `total` messages at about `rate` msg/s in small batches, round-robin over queues."""

    def run() -> None:
        with Producer(brokers=address) as producer:
            queues = producer.fetch_publish_message_queues(TOPIC)
            batch, sent, started = 20, 0, time.monotonic()
            while sent < total:
                n = min(batch, total - sent)
                results = producer.send_batch([Message(TOPIC, b"payload-%d" % (sent + i)) for i in range(n)],
                                              queue=queues[(sent // batch) % len(queues)])
                ids.extend(r.msg_id for r in results)
                sent += n
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def scale_1_4_2(broker, tmp_path, *extra: str) -> tuple[list[str], list[tuple]]:
    """1 consumer, then 4, then 2 (two leave gracefully) while 50,000 messages arrive; all records."""
    create_topic(broker.address, TOPIC, 8)
    ids: list[str] = []
    done = threading.Event()
    common = ("--brokers", broker.address, "--group", "scalers", "--topic", TOPIC, "--persist-interval", "1",
              *extra)
    consumers = [ConsumerProcess(tmp_path / "c0.txt", *common, "--instance", "c0").start()]
    producer = steady_producer(broker.address, 50_000, 4_000, ids, done)
    try:
        wait_until(lambda: len(ids) >= 10_000, 60, "a first fifth of the messages")
        consumers += [ConsumerProcess(tmp_path / f"c{i}.txt", *common, "--instance", f"c{i}").start()
                      for i in (1, 2, 3)]
        wait_until(lambda: len(ids) >= 30_000, 60, "three fifths of the messages")
        for c in consumers[2:]:
            assert c.stop() == 0
        producer.join(120)
        assert done.is_set()
        wait_until(lambda: {r[0] for c in consumers for r in c.records()} >= set(ids), 120,
                   "every message consumed")
    finally:
        for c in consumers:
            if c.proc is not None:
                c.stop()
    return ids, [r for c in consumers for r in c.records()]


def test_scale_out_and_in_with_handover_has_no_duplicates(broker, tmp_path):
    ids, records = scale_1_4_2(broker, tmp_path)
    counts = collections.Counter(r[0] for r in records)
    duplicates = {k: v for k, v in counts.items() if v > 1}
    print(f"handover: {len(ids)} sent, {len(records)} consumed, {len(duplicates)} duplicated")
    assert set(counts) == set(ids)
    assert not duplicates, f"{len(duplicates)} messages delivered more than once"


def test_scale_out_and_in_rocketmq_style_reports_duplicates(broker, tmp_path):
    ids, records = scale_1_4_2(broker, tmp_path, "--no-locking")
    counts = collections.Counter(r[0] for r in records)
    duplicates = sum(v - 1 for v in counts.values() if v > 1)
    print(f"rocketmq-style: {len(ids)} sent, {len(records)} consumed, {duplicates} duplicate deliveries")
    assert set(counts) == set(ids)  # still at-least-once


def owners(address: str, group: str) -> dict[str, int]:
    with Admin(brokers=address) as admin:
        d = admin.describe_group(group)
    return {m.client_id: sum(1 for q in m.owned_queues if q.topic == TOPIC) for m in d.members}


def test_silent_consumer_expires_and_its_queues_are_taken_over(broker_factory, tmp_path):
    broker = broker_factory(args=("--channel-expired-timeout-ms", "3000", "--lock-expiry-ms", "4000"))
    create_topic(broker.address, TOPIC, 4)
    common = ("--brokers", broker.address, "--group", "g", "--topic", TOPIC, "--heartbeat-interval", "1",
              "--rebalance-interval", "1", "--lock-renew-interval", "1")
    a = ConsumerProcess(tmp_path / "a.txt", *common, "--instance", "a").start()
    b = ConsumerProcess(tmp_path / "b.txt", *common, "--instance", "b").start()
    try:
        wait_until(lambda: sorted(owners(broker.address, "g").values()) == [2, 2], 30, "two consumers, 2 queues each")
        b.pause()  # no more heartbeats or lock renewals, yet its connections stay open
        wait_until(lambda: list(owners(broker.address, "g").values()) == [4], 30, "a owning all four queues")
        with Producer(brokers=broker.address) as p:
            sent = [p.send(Message(TOPIC, b"after"), queue=q).msg_id for q in p.fetch_publish_message_queues(TOPIC)]
        wait_until(lambda: set(sent) <= {r[0] for r in a.records()}, 30, "a consuming b's former queues")
    finally:
        b.kill()
        a.stop()


def test_paused_consumer_cannot_move_offsets_of_queues_it_lost(broker_factory, tmp_path):
    broker = broker_factory(args=("--channel-expired-timeout-ms", "3000", "--lock-expiry-ms", "3000"))
    create_topic(broker.address, TOPIC, 2)
    with Producer(brokers=broker.address) as p:
        for q in p.fetch_publish_message_queues(TOPIC):
            p.send_batch([Message(TOPIC, b"x") for _ in range(200)], queue=q)
    common = ("--brokers", broker.address, "--group", "f", "--topic", TOPIC, "--heartbeat-interval", "1",
              "--rebalance-interval", "1", "--lock-renew-interval", "1", "--persist-interval", "0.3")
    a = ConsumerProcess(tmp_path / "a.txt", *common, "--instance", "a", "--delay-ms", "20").start()
    wait_until(lambda: len(a.records()) >= 20, 30, "a consuming")
    a.pause()
    b = ConsumerProcess(tmp_path / "b.txt", *common, "--instance", "b").start()
    samples: list[dict[int, int]] = []
    try:
        wait_until(lambda: len(b.records()) >= 300, 60, "b taking over and consuming")
        with Admin(brokers=broker.address) as admin:
            def sample() -> dict[int, int]:
                return {s.queue.queue_id: s.consumer_offset for s in admin.consume_stats("f", TOPIC)}
            wait_until(lambda: all(v == 200 for v in sample().values()), 30, "b committing everything")
            a.resume()
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                samples.append(sample())
                time.sleep(0.05)
    finally:
        a.stop()
        b.stop()
    assert all(s == {0: 200, 1: 200} for s in samples), "a stale owner moved an offset back"
    log = (tmp_path / "a.txt.log").read_text()
    assert "event=queue_lost" in log, log[-2000:]


def batches(consumer: ConsumerProcess) -> list[tuple[int, int, int]]:
    """(queue id, monotonic ns the listener call started, ns it ended) per consumed message."""
    return [(int(q), int(start), int(end)) for _, q, _, _, start, end in
            (line.split(" ") for line in consumer.out.read_text().splitlines())]


def stop_all(*consumers: ConsumerProcess | None) -> None:
    """Stop the consumer processes a test started (None: not started)."""
    for c in consumers:
        if c is not None:
            c.stop()


def heal_until_lost(proxy: FaultProxy, a: ConsumerProcess) -> None:
    """Let a, cut off behind `proxy`, reach the broker again, until it learns that its queue is gone."""
    proxy.heal()
    wait_until(lambda: "event=queue_lost" in a.log_tail(50_000), 30, "a learning that it lost the queue")


def assert_stopped_before(a: ConsumerProcess, b: ConsumerProcess, cut: int, healed: int | None = None) -> None:
    """a, cut off at `cut` (until `healed`), started no batch once b had started one, and went on for a while
    after the cut (while the lock was surely its own: the stop is the lock's, not the partition's)."""
    b_first = min(start for _, start, _ in batches(b))
    a_after_cut = [start for _, start, _ in batches(a) if cut < start and (healed is None or start < healed)]
    late = [start for start in a_after_cut if start >= b_first]
    assert not late, (f"a started {len(late)} batches after b's first, up to {(max(late) - b_first) / 1e6:.0f} ms "
                      f"after it; {len(a_after_cut)} after the cut")
    assert a_after_cut, "a consumed nothing after the cut"


def test_an_orderly_consumer_cut_off_from_the_broker_stops_before_its_lock_can_pass_on(broker_factory, tmp_path):
    """An orderly consumer keeps consuming what it fetched while the broker cannot reach it, but only for
    half the broker's lock expiry after its last renewal (lock_hold.py, RocketMQ's client-side lock
    lifetime): once the broker lets the lock go, the queue's next owner is the only one calling a listener
    with its messages. Without that, the cut-off consumer went on through its buffer beside the new owner."""
    broker = broker_factory(args=("--channel-expired-timeout-ms", "3000", "--lock-expiry-ms", "3000"))
    create_topic(broker.address, TOPIC, 1)
    produce(broker.address, TOPIC, 1_000, batch=250)
    common = ("--group", "cut", "--topic", TOPIC, "--orderly", "--heartbeat-interval", "1", "--rebalance-interval",
              "1", "--lock-renew-interval", "1", "--persist-interval", "0.3", "--delay-ms", "20")
    with FaultProxy(broker.address) as proxy:
        a = ConsumerProcess(tmp_path / "a.txt", "--brokers", proxy.address, *common, "--instance", "a").start()
        b = None
        try:
            wait_until(lambda: len(a.records()) >= 20, 30, "a consuming")
            proxy.blackhole(True)  # a hears nothing more, and it has hundreds of messages fetched
            cut = time.monotonic_ns()
            b = ConsumerProcess(tmp_path / "b.txt", "--brokers", broker.address, *common, "--instance", "b").start()
            wait_until(lambda: len(b.records()) >= 50, 60, "b taking the queue over and consuming")
            healed = time.monotonic_ns()  # (then a is back in the group, and the queue may pass back to it)
            heal_until_lost(proxy, a)
        finally:
            stop_all(a, b)
    assert_stopped_before(a, b, cut, healed)


def lapsed_behind(proxy: FaultProxy, tmp_path, *, delay_ms: int) -> ConsumerProcess:
    """An orderly consumer of TOPIC's one queue through `proxy`, cut off once it consumed some, returned
    when its lock's hold lapsed (its log says so); stopped if that does not come."""
    a = ConsumerProcess(tmp_path / "a.txt", "--brokers", proxy.address, "--group", "lapse", "--topic", TOPIC,
                        "--orderly", "--lock-renew-interval", "1", "--delay-ms", str(delay_ms), "--instance", "a").start()
    try:
        wait_until(lambda: len(a.records()) >= 20, 30, "a consuming")
        proxy.blackhole(True)
        wait_until(lambda: "event=lock_lapsed" in a.log_tail(20_000), 30, "a's hold lapsing")
    except BaseException:
        a.stop()
        raise
    return a


def test_an_orderly_consumer_whose_lock_lapsed_goes_on_once_the_broker_renews_it(broker_factory, tmp_path):
    """Cut off longer than half the broker's lock expiry but shorter than the expiry: the consumer stops
    calling its listener, and once the broker can be reached its renewal is granted (the lock is still its
    own) and it consumes the rest, the queue never lost."""
    broker = broker_factory(args=("--channel-expired-timeout-ms", "20000", "--lock-expiry-ms", "6000"))
    create_topic(broker.address, TOPIC, 1)
    ids = produce(broker.address, TOPIC, 300, batch=150)
    with FaultProxy(broker.address) as proxy:
        a = lapsed_behind(proxy, tmp_path, delay_ms=50)  # (3 s after its last renewal)
        try:
            stalled = len(a.records())
            proxy.heal()  # within 6 s of its last renewal: the broker still holds the lock for a
            wait_until(lambda: {r[0] for r in a.records()} >= set(ids), 60, "a consuming the rest")
        finally:
            a.stop()
    assert stalled < len(ids)  # (it was cut off with messages left)
    assert "event=queue_lost" not in a.log_tail(100_000), a.log_tail()


def test_an_orderly_consumer_cut_off_with_its_lock_lapsed_still_shuts_down(broker_factory, tmp_path):
    """Regression: the renewal a lapsed lock asks for went on every second while the broker could not be
    reached, and the consumer's shutdown waited for it until its own bound ran out (40 s, exit code 1)."""
    broker = broker_factory(args=("--channel-expired-timeout-ms", "20000", "--lock-expiry-ms", "4000"))
    create_topic(broker.address, TOPIC, 1)
    produce(broker.address, TOPIC, 1_500, batch=250)
    with FaultProxy(broker.address) as proxy:
        a = lapsed_behind(proxy, tmp_path, delay_ms=20)  # (2 s after its last renewal)
        code = a.stop()
    assert code == 0, a.log_tail()


def test_an_orderly_holder_keeps_its_queue_across_a_broker_restart_and_hands_it_over_after(broker_factory,
                                                                                        tmp_path):
    """A broker keeps its lock table on disk (queueLocks.json): restarted (kill -9), it holds each lock
    for its holder, which renews it under the same epoch and goes on, the queue never lost. A member that
    joins then gets the queue by a handover, and only one of them consumes it at a time. (Before, the
    restarted broker had forgotten the locks: every holder lost its queues, and, had it been cut off, the
    next member was granted them at once: the test below.)"""
    broker = broker_factory()
    create_topic(broker.address, TOPIC, 1)
    ids = produce(broker.address, TOPIC, 600, batch=200)
    common = ("--brokers", broker.address, "--group", "restart", "--topic", TOPIC, "--orderly",
              "--persist-interval", "0.3", "--delay-ms", "10")
    a = ConsumerProcess(tmp_path / "a.txt", *common, "--instance", "z").start()
    b = None
    try:
        wait_until(lambda: len(a.records()) >= 50, 30, "a consuming")
        broker.kill()
        broker.start()  # the same port and data
        consumed = len(a.records())
        wait_until(lambda: len(a.records()) >= consumed + 50, 30, "a going on after the restart")
        # AVG gives the one queue to the first client id: b's once the broker knows both.
        b = ConsumerProcess(tmp_path / "b.txt", *common, "--heartbeat-interval", "0.5", "--rebalance-interval",
                            "0.5", "--instance", "a").start()
        wait_until(lambda: len(b.records()) >= 20, 30, "b taking the queue over")
        wait_until(lambda: {r[0] for c in (a, b) for r in c.records()} >= set(ids), 60, "all consumed")
    finally:
        stop_all(a, b)
    assert "event=queue_lost" not in a.log_tail(200_000), a.log_tail()
    assert "event=locks_restored held=2" in broker.log_text()  # (the queue and the group's retry queue)
    b_batches = batches(b)
    b_first, b_last = min(start for _, start, _ in b_batches), max(end for _, _, end in b_batches)
    beside = [start for _, start, _ in batches(a) if b_first <= start <= b_last]
    assert not beside, f"a started {len(beside)} batches while b consumed the queue"


def test_an_orderly_consumer_cut_off_when_its_broker_restarts_stops_before_the_queue_passes_on(broker_factory,
                                                                                            tmp_path):
    """A member cut off from the broker when the broker restarts sees no broken stream: it goes on through
    what it fetched for half the lock expiry after its last renewal. The restarted broker holds its lock
    that long (restored from queueLocks.json), so the member the group gives the queue to meanwhile
    starts only after. Before, the restarted broker granted it at once, beside the cut-off member."""
    broker = broker_factory(args=("--channel-expired-timeout-ms", "20000", "--lock-expiry-ms", "6000"))
    create_topic(broker.address, TOPIC, 1)
    produce(broker.address, TOPIC, 1_500, batch=250)
    common = ("--group", "cut-restart", "--topic", TOPIC, "--orderly", "--lock-renew-interval", "1",
              "--persist-interval", "0.3", "--delay-ms", "20")
    with FaultProxy(broker.address) as proxy:
        a = ConsumerProcess(tmp_path / "a.txt", "--brokers", proxy.address, *common, "--instance", "z").start()
        b = None
        try:
            wait_until(lambda: len(a.records()) >= 20, 30, "a consuming")
            proxy.blackhole(True)
            cut = time.monotonic_ns()
            broker.kill()
            broker.start()
            b = ConsumerProcess(tmp_path / "b.txt", "--brokers", broker.address, *common, "--heartbeat-interval",
                                "0.5", "--rebalance-interval", "0.5", "--instance", "a").start()
            wait_until(lambda: len(b.records()) >= 20, 60, "b taking the queue after the restart")
            heal_until_lost(proxy, a)
        finally:
            stop_all(a, b)
    assert_stopped_before(a, b, cut)


def test_an_orderly_queue_stays_with_its_member_until_a_listener_call_past_the_drain_timeout_returns(
        broker, tmp_path):
    """RocketMQ keeps an orderly queue while its listener runs: a handover waits for it, however long past
    drain_timeout_s, or the next owner calls its listener with the queue's messages beside the call still
    running. Before, the queue was let go at the timeout (0.5 s here) and b consumed beside a's stuck call.
    The rebalance that began the handover is not held up (a renews the lock meanwhile, or it would lapse)."""
    create_topic(broker.address, TOPIC, 1)
    ids = produce(broker.address, TOPIC, 300, batch=150)
    hold = tmp_path / "hold"
    common = ("--brokers", broker.address, "--group", "kept", "--topic", TOPIC, "--orderly", "--drain-timeout",
              "0.5", "--heartbeat-interval", "0.5", "--rebalance-interval", "0.5", "--lock-renew-interval", "1",
              "--delay-ms", "5")
    a = ConsumerProcess(tmp_path / "a.txt", *common, "--hold-file", str(hold), "--instance", "z").start()
    b = None
    try:
        wait_until(lambda: len(a.records()) >= 20, 30, "a consuming")
        hold.touch()
        wait_until(lambda: "listener held" in a.log_tail(20_000), 30, "a's listener call held")
        b = ConsumerProcess(tmp_path / "b.txt", *common, "--instance", "a").start()  # AVG: the queue is b's
        wait_until(lambda: a.log_tail(50_000).count("event=drain_timeout") >= 3 or b.records(), 30,
                   "a keeping the queue through three drain timeouts (or b consuming beside it)")
        held = len(b.records())
        hold.unlink()
        wait_until(lambda: {r[0] for c in (a, b) for r in c.records()} >= set(ids), 60, "b consuming the rest")
    finally:
        stop_all(a, b)
    assert held == 0, f"b consumed {held} messages while a's listener call ran"
    assert "event=drain_kept" in a.log_tail(100_000)
    a_last_end = max(end for _, _, end in batches(a))
    b_first = min(start for _, start, _ in batches(b))
    assert b_first >= a_last_end, f"b started {(a_last_end - b_first) / 1e6:.0f} ms before a's last call ended"
    consumed = [r[0] for c in (a, b) for r in c.records()]
    assert len(consumed) == len(set(consumed)), "a message consumed twice across the handover"
    offsets = [r[2] for c in (a, b) for r in c.records()]
    assert offsets == sorted(offsets)


def test_orderly_consumption_keeps_per_queue_order_across_rebalance(broker, tmp_path):
    create_topic(broker.address, TOPIC, 4)
    ids: list[str] = []
    done = threading.Event()
    common = ("--brokers", broker.address, "--group", "ordered", "--topic", TOPIC, "--orderly",
              "--delay-ms", "1", "--persist-interval", "1")
    a = ConsumerProcess(tmp_path / "a.txt", *common, "--instance", "a").start()
    producer = steady_producer(broker.address, 6_000, 1_500, ids, done)
    b = c = None
    try:
        wait_until(lambda: len(ids) >= 1_500, 30, "some messages")
        b = ConsumerProcess(tmp_path / "b.txt", *common, "--instance", "b").start()
        wait_until(lambda: len(ids) >= 3_500, 30, "more messages")
        c = ConsumerProcess(tmp_path / "c.txt", *common, "--instance", "c").start()
        wait_until(lambda: len(ids) >= 4_500, 30, "still more")
        assert b.stop() == 0
        producer.join(60)
        everyone = [a, b, c]
        wait_until(lambda: {r[0] for p in everyone for r in p.records()} >= set(ids), 60, "all consumed")
    finally:
        for p in (a, b, c):
            if p is not None and p.proc is not None:
                p.stop()
    rows = []
    for p in (a, b, c):
        for line in p.out.read_text().splitlines():
            msg_id, qid, offset, client, start, end = line.split(" ")
            rows.append((int(qid), int(offset), client, int(start), int(end), msg_id))
    by_queue: dict[int, list] = collections.defaultdict(list)
    for row in rows:
        by_queue[row[0]].append(row)
    for qid, items in by_queue.items():
        per_client: dict[str, list[int]] = collections.defaultdict(list)
        for row in sorted(items, key=lambda r: r[3]):
            per_client[row[2]].append(row[1])
        for client, offsets in per_client.items():
            assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), (qid, client)
        spans = sorted((r[3], r[4], r[2]) for r in items)
        for (_s1, e1, c1), (s2, _e2, c2) in zip(spans, spans[1:], strict=False):
            assert c1 == c2 or e1 <= s2, f"queue {qid}: {c1} and {c2} consumed at the same time"
    assert {r[5] for r in rows} == set(ids)


@pytest.fixture(autouse=True)
def _quiet_producer_logs(caplog):
    caplog.set_level("ERROR")
