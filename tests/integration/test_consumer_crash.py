"""kill -9 of a consumer process: nothing is lost; re-delivery is bounded by the last persisted commit."""

from __future__ import annotations

from workload import ConsumerProcess, create_topic, produce, wait_until

from tidemark.client import Admin


def test_consumer_kill_9_redelivers_only_after_last_commit(broker, tmp_path):
    create_topic(broker.address, "Payments", 4)
    ids = produce(broker.address, "Payments", 4000)
    # 0-40 ms a message on its 20 listener threads: about 1,000 msg/s, so the 2,500 left after the first
    # 1,500 take seconds, not the quarter second (0-4 ms) that a loaded machine's poll and kill could miss.
    first = ConsumerProcess(tmp_path / "first.txt", "--brokers", broker.address, "--group", "pay",
                            "--topic", "Payments", "--delay-ms", "40", "--persist-interval", "0.5").start()
    wait_until(lambda: len(first.records()) >= 1500, 60, "the first consumer to get going")
    first.kill()
    seen_first = first.records()
    assert len(seen_first) < len(ids), "the first consumer finished before it was killed; the test proves nothing"
    with Admin(brokers=broker.address) as admin:
        committed = {s.queue.queue_id: s.consumer_offset for s in admin.consume_stats("pay", "Payments")}
    # The broker's offsets are what the dead consumer had persisted: a lower bound of its progress.
    assert any(c > 0 for c in committed.values())

    # Its queue locks stay until the broker forgets the dead client (its watch stream broke): the second
    # consumer's lock requests wait for that, then start from the persisted commits.
    second = ConsumerProcess(tmp_path / "second.txt", "--brokers", broker.address, "--group", "pay",
                             "--topic", "Payments", "--instance", "second")
    second.start()
    try:
        wait_until(lambda: {r[0] for r in first.records()} | {r[0] for r in second.records()} >= set(ids),
                   120, "every message consumed by one of the two")
    finally:
        second.stop()
    seen_second = second.records()
    # No loss: every message was consumed by one of them.
    assert {r[0] for r in seen_first} | {r[0] for r in seen_second} == set(ids)
    # The restart began exactly at the persisted commits (a queue without one at its start: the
    # group reads from the first offset)...
    for queue_id, offset in committed.items():
        offsets = [r[2] for r in seen_second if r[1] == queue_id]
        if offsets:
            assert min(offsets) == max(offset, 0), (queue_id, min(offsets), offset)
    # ...so every re-delivered message is one the dead consumer handled after its last persisted commit.
    first_by_id = {r[0]: r for r in seen_first}
    redelivered = [r for r in seen_second if r[0] in first_by_id]
    assert all(r[2] >= committed[r[1]] for r in redelivered)
    bound = sum(1 for r in seen_first if r[2] >= committed[r[1]])
    assert len(redelivered) <= bound
    print(f"consumed before kill: {len(seen_first)}, re-delivered after restart: {len(redelivered)} "
          f"(bound {bound})")
