"""PushConsumer.connect(): the connections opened before start(), without joining the group."""

from __future__ import annotations

import asyncio
import threading

import pytest
from brokerproc import free_port
from workload import create_topic, produce, wait_until

from tidemark.client import (
    Admin,
    ClientStateError,
    ConsumeConcurrentlyStatus,
    NotFoundError,
    PushConsumer,
    UnavailableError,
)
from tidemark.client.runtime import ClientState


def loop_threads(group: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"tidemark-push-consumer-{group}" and t.is_alive()]


def consumer(address: str, group: str, topic: str, seen: list[str], **settings) -> PushConsumer:
    c = PushConsumer(group=group, brokers=address, **settings)
    c.subscribe(topic)

    def listener(msgs, context):
        seen.extend(m.msg_id for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    c.register_message_listener(listener)
    return c


def test_connected_consumer_joins_only_at_start_and_consumes_on_the_open_connections(broker):
    create_topic(broker.address, "Joiners", 2)
    seen: list[str] = []
    c = consumer(broker.address, "early-birds", "Joiners", seen)
    try:
        assert c.connect() is c and c.connect() is c  # (a second call: a no-op)
        assert c.state is ClientState.CREATED and len(loop_threads("early-birds")) == 1
        connected = c._connected
        assert connected is not None and connected.connections()
        with Admin(brokers=broker.address) as admin:
            assert admin.consumer_ids("early-birds") == []  # connected is not joined
            c.start()
            assert c._core.cluster is connected  # start() used what connect() opened
            assert admin.consumer_ids("early-birds") == [c.client_id]
        ids = produce(broker.address, "Joiners", 20, batch=10)
        wait_until(lambda: set(seen) >= set(ids), 30, "all consumed")
    finally:
        c.shutdown()
    assert loop_threads("early-birds") == []
    with pytest.raises(ClientStateError):
        c.connect()


def test_connected_never_started_consumer_shuts_down_without_threads(broker):
    create_topic(broker.address, "Joiners", 2)
    c = consumer(broker.address, "never-started", "Joiners", [])
    c.connect()
    connected = c._connected
    c.shutdown()
    assert c.state is ClientState.SHUTDOWN and loop_threads("never-started") == []
    assert connected._closed
    with pytest.raises(ClientStateError):
        c.start()


def test_connect_to_no_broker_fails_and_leaves_the_consumer_to_try_again(broker):
    c = consumer(f"127.0.0.1:{free_port()}", "nobody-home", "Joiners", [], request_timeout_s=1)
    with pytest.raises(UnavailableError):
        c.connect()
    assert c.state is ClientState.CREATED and c._connected is None and loop_threads("nobody-home") == []
    c.shutdown()


def test_connect_after_start_is_a_state_error(broker):
    create_topic(broker.address, "Joiners", 2)
    c = consumer(broker.address, "late-connect", "Joiners", [])
    c.start()
    try:
        with pytest.raises(ClientStateError, match="connect"):
            c.connect()
    finally:
        c.shutdown()


def test_connect_reads_the_subscribed_routes_and_refuses_an_unknown_topic(broker):
    create_topic(broker.address, "Joiners", 2)
    c = consumer(broker.address, "route-readers", "Joiners", [])
    try:
        c.connect()
        assert "Joiners" in c._connected._routes  # start()'s heartbeat need not wait for it
    finally:
        c.shutdown()
    missing = consumer(broker.address, "route-readers", "NoSuchTopic", [])
    with pytest.raises(NotFoundError):
        missing.connect()
    assert missing.state is ClientState.CREATED and missing._connected is None
    assert loop_threads("route-readers") == []
    missing.shutdown()


def test_a_shutdown_while_connect_runs_leaves_no_thread_and_no_connection(broker, monkeypatch):
    """shutdown() on another thread while connect() waited for the brokers: the consumer went to SHUTDOWN,
    then connect() kept what it opened, and no later shutdown() closed it (its loop thread stayed)."""
    create_topic(broker.address, "Joiners", 2)
    entered, proceed = threading.Event(), threading.Event()
    opened = []
    real = PushConsumer._connect

    async def slow_connect(self, topics):
        cluster = await real(self, topics)
        opened.append(cluster)
        entered.set()
        while not proceed.is_set():  # (the loop thread's coroutine waits for the test's go)
            await asyncio.sleep(0.01)
        return cluster
    monkeypatch.setattr(PushConsumer, "_connect", slow_connect)
    c = consumer(broker.address, "racing", "Joiners", [])
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            c.connect()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test looks at what it was
            outcome.append(e)
    thread = threading.Thread(target=connect)
    thread.start()
    assert entered.wait(10)
    c.shutdown()
    assert c.state is ClientState.SHUTDOWN
    proceed.set()
    thread.join(10)
    assert isinstance(outcome[0], ClientStateError), outcome
    assert opened[0]._closed and c._connected is None
    wait_until(lambda: loop_threads("racing") == [], 10, "the consumer's loop thread to end")
