"""The broker's Prometheus endpoint: what it counts after a produce/consume run, where it listens
(loopback unless given its own address) and what it never shows (secrets, message bodies)."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request

import pytest
from brokerproc import free_port
from workload import create_topic, produce, scrape, wait_until

from tidemark.client import (
    Admin,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageQueue,
    Producer,
    PushConsumer,
    UnauthenticatedError,
)


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


def _non_loopback_address() -> str:
    """This machine's address on its default route (no packet is sent), or skip."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            address = s.getsockname()[0]
        except OSError:
            address = ""
    if not address or address.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address to probe the metrics port from")
    return address


def _answers(host: str, port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5).read()
        return True
    except OSError:
        return False


def test_metrics_listen_on_loopback_even_when_the_broker_listens_everywhere(broker_factory):
    outside = _non_loopback_address()
    port = free_port()
    broker = broker_factory(args=("--host", "0.0.0.0", "--metrics-port", str(port)))
    assert _answers("127.0.0.1", port)
    assert not _answers(outside, port), "the metrics endpoint is reachable beyond loopback by default"
    assert f"event=metrics_ready host=127.0.0.1 port={port}" in broker.log_text()


def test_metrics_host_gives_the_endpoint_its_own_address(broker_factory):
    outside = _non_loopback_address()
    port = free_port()
    broker_factory(args=("--metrics-port", str(port)), env={"TIDEMARK_METRICS_HOST": outside})
    assert _answers(outside, port)
    assert not _answers("127.0.0.1", port), "metrics_host should be the only address served"


def test_no_secret_or_message_body_in_metrics_or_logs(broker_factory):
    """With auth on and DEBUG logs: the root secret, a created user's secret, a wrong secret tried by a
    client and a message body appear neither in the scraped text nor in the broker's log."""
    root_secret, user_secret, wrong_secret = "root-SECRET-4f1c9a", "user-SECRET-77d2e0", "wrong-SECRET-0b3e51"
    body = "BODY-4c1d8e-do-not-log"
    port = free_port()
    broker = broker_factory(args=("--auth", "--metrics-port", str(port), "--log-level", "DEBUG"),
                            env={"TIDEMARK_INIT_USER": f"root:{root_secret}"})
    root = ("root", root_secret)
    with Admin(brokers=broker.address, credentials=root) as admin:
        admin.create_topic("Guarded", 1)
        admin.create_user("app", user_secret)
        with Producer(brokers=broker.address, credentials=root) as producer:
            sent = producer.send(Message("Guarded", body.encode(), tags="t", keys="k"))
        with pytest.raises(UnauthenticatedError), \
                Producer(brokers=broker.address, credentials=("root", wrong_secret)) as intruder:
            intruder.send(Message("Guarded", body.encode()))
        assert admin.view_message(sent.message_queue, sent.queue_offset).body == body.encode()
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'tidemark_messages_in_total{topic="Guarded"} 1.0' in text, "the scrape saw no traffic"
    log = broker.log_text()
    assert "event=access_refused" in log, "the refused send left no trace: the log check would prove nothing"
    for label, secret in (("metrics", text), ("log", log)):
        for needle in (root_secret, user_secret, wrong_secret, body):
            assert needle not in secret, f"{needle!r} appears in the {label}"


def test_healthz_beside_metrics_only_at_their_paths_and_a_quick_start(broker_factory, tmp_path):
    port = free_port()
    broker = broker_factory(args=("--metrics-port", str(port)))
    base = f"http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"{base}/healthz", timeout=5) as answer:
        assert (answer.status, answer.read()) == (200, b"ok\n")
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain") and b"tidemark_store_size_bytes" in answer.read()
    for path in ("/", "/metrics/extra", "/favicon.ico"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}{path}", timeout=5)
        assert e.value.code == 404
    # Registering the state collector no longer waits on the event loop that registers it (it took 5 s and
    # logged an empty "metrics snapshot failed" at every start).
    assert "metrics_snapshot_failed" not in broker.log_text()


def test_bytes_in_and_out_count_the_stored_records_per_topic_and_group(broker_factory):
    port = free_port()
    broker = broker_factory(args=("--metrics-port", str(port)))
    create_topic(broker.address, "Weighed", 1)
    with Producer(brokers=broker.address) as p:
        p.send_batch([Message("Weighed", b"x" * (100 + i), tags="t") for i in range(10)])  # the Produce stream
    mq = MessageQueue("Weighed", "broker-a", 0)
    with Admin(brokers=broker.address) as admin:
        stored = admin.pull(mq, 0, max_nums=32).messages  # a unary pull without a group
    assert len(stored) == 10
    size = sum(m.store_size for m in stored)
    assert size > sum(100 + i for i in range(10)), "a stored record is its body and more"
    m = scrape(port)
    assert value(m, "tidemark_bytes_in_total", topic="Weighed") == size
    assert value(m, "tidemark_bytes_out_total", topic="Weighed", group="") == size

    consumer = PushConsumer(group="weigher", brokers=broker.address,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe("Weighed")
    consumer.register_message_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
    consumer.start()
    try:  # the fetch stream, counted for its group
        wait_until(lambda: value(scrape(port), "tidemark_bytes_out_total", topic="Weighed", group="weigher") >= size,
                   30, "the group's delivered bytes")
    finally:
        consumer.shutdown()
    m = scrape(port)
    assert value(m, "tidemark_bytes_out_total", topic="Weighed", group="weigher") == size
    assert value(m, "tidemark_bytes_in_total", topic="Weighed") == size, "reading stores nothing"


def test_dlq_depth_build_info_and_no_created_series_survive_a_restart(broker_factory):
    port = free_port()
    broker = broker_factory(args=("--metrics-port", str(port)))
    create_topic(broker.address, "Doomed", 1)
    produce(broker.address, "Doomed", 3)
    with Admin(brokers=broker.address) as admin:
        for m in admin.pull(MessageQueue("Doomed", "broker-a", 0), 0, max_nums=3).messages:
            admin.send_back("doomed", m, delay_level=-1)  # straight to %DLQ%doomed
        wait_until(lambda: value(scrape(port), "tidemark_dlq_depth", group="doomed") == 3, 15, "three dead letters")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "_created" not in text
    build = [line for line in text.splitlines() if line.startswith("tidemark_build_info{")]
    assert len(build) == 1 and 'version="' in build[0] and build[0].endswith(" 1.0"), build
    broker.restart()  # the depth is the DLQ's content, not a counter: a restart keeps it
    wait_until(lambda: value(scrape(port), "tidemark_dlq_depth", group="doomed") == 3, 15, "the depth after a restart")
    assert value(scrape(port), "tidemark_dlq_messages_total", group="doomed") == 0
    with Admin(brokers=broker.address) as admin:
        (first, *_rest) = admin.dead_letters("doomed")
        admin.requeue_dead_letters("doomed", first.msg_id)
    wait_until(lambda: value(scrape(port), "tidemark_dlq_depth", group="doomed") == 2, 15,
               "the requeued letter to leave the depth")
