"""The broker's Prometheus endpoint after a produce/consume run."""

from __future__ import annotations

import threading

from brokerproc import free_port
from workload import create_topic, produce, scrape, wait_until

from client import Admin, ConsumeConcurrentlyStatus, ConsumeFromWhere, PushConsumer


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_after_produce_and_consume(broker_factory):
    port = free_port()
    broker = broker_factory(args=("--metrics-port", str(port), "--flush-consumer-offset-interval-ms", "200",
                                  "--delay-levels", "100ms 200ms 300ms"))
    create_topic(broker.address, "Metered", 2)
    produce(broker.address, "Metered", 100)
    seen = []
    lock = threading.Lock()
    failed_once = threading.Event()

    def listener(msgs, ctx):
        if not failed_once.is_set():
            failed_once.set()
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        with lock:
            seen.extend(m.msg_id for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(group="metered", brokers=broker.address, persist_consumer_offset_interval_s=0.2,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe("Metered")
    consumer.register_message_listener(listener)
    consumer.start()
    try:
        wait_until(lambda: len(set(seen)) >= 100, 30, "all messages consumed")
        with Admin(brokers=broker.address) as admin:
            wait_until(lambda: sum(s.lag for s in admin.consume_stats("metered", "Metered")) == 0, 10, "lag 0")
        wait_until(lambda: value(scrape(port), "tidemark_consumer_offset_flush_seconds_count") > 0, 10,
                   "an offset file flush")
        m = scrape(port)
        assert value(m, "tidemark_group_clients", group="metered") == 1
    finally:
        consumer.shutdown()
    assert value(m, "tidemark_messages_in_total", topic="Metered") == 100
    assert value(m, "tidemark_messages_out_total", topic="Metered") >= 100
    assert sum(value(m, "tidemark_offset_commits_total", kind=kind) for kind in ("stream", "fetch", "pull")) > 0
    for q in ("0", "1"):
        assert (("tidemark_consumer_lag", (("group", "metered"), ("queue", q), ("topic", "Metered"))) in m)
        assert value(m, "tidemark_consumer_lag", group="metered", topic="Metered", queue=q) == 0
    assert value(m, "tidemark_store_size_bytes") > 100 * 100
    assert value(m, "tidemark_consumer_offset_file_bytes") > 0
    assert value(m, "tidemark_queue_ownership_changes_total", group="metered") >= 2
    assert value(m, "tidemark_rebalances_total", group="metered") >= 1
    assert value(m, "tidemark_retries_total", group="metered") == 1
    assert value(m, "tidemark_fetch_frames_total") > 0
