"""connect() of PushConsumer and PullConsumer: the connections opened before start(), without joining the
group (client/consumer/early_connection.py, which both use)."""

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
    MessageQueue,
    NotFoundError,
    PullConsumer,
    PushConsumer,
    RequestTimeoutError,
    UnavailableError,
)
from tidemark.client.consumer.early_connection import EarlyConnection
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.remoting.connection import BrokerConnection
from tidemark.client.runtime import ClientState

KINDS = ("push", "pull")


def loop_threads(kind: str, group: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"tidemark-{kind}-consumer-{group}" and t.is_alive()]


def consumer(kind: str, address: str, group: str, topic: str, seen: list[str], **settings) -> PushConsumer | PullConsumer:
    if kind == "pull":
        c = PullConsumer(group=group, brokers=address, **settings)
        c.subscribe(topic)
        return c
    c = PushConsumer(group=group, brokers=address, **settings)
    c.subscribe(topic)

    def listener(msgs, context):
        seen.extend(m.msg_id for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
    c.register_message_listener(listener)
    return c


def consumed(c: PushConsumer | PullConsumer, seen: list[str], ids: list[str]) -> None:
    """Wait until every message of `ids` reached the listener (push) or came out of poll() (pull)."""
    def done() -> bool:
        if isinstance(c, PullConsumer):
            seen.extend(m.msg_id for m in c.poll(0.2))
        return set(seen) >= set(ids)
    wait_until(done, 30, "all consumed")


@pytest.mark.parametrize("kind", KINDS)
def test_connected_consumer_joins_only_at_start_and_consumes_on_the_open_connections(broker, kind):
    create_topic(broker.address, "Joiners", 2)
    seen: list[str] = []
    group = f"early-birds-{kind}"
    c = consumer(kind, broker.address, group, "Joiners", seen)
    try:
        assert c.connect() is c and c.connect() is c  # (a second call: a no-op)
        assert c.state is ClientState.CREATED and len(loop_threads(kind, group)) == 1
        connected = c._early.cluster
        assert connected is not None and connected.connections()
        with Admin(brokers=broker.address) as admin:
            assert admin.consumer_ids(group) == []  # connected is not joined
            c.start()
            assert c._core.cluster is connected  # start() used what connect() opened
            assert c._early.cluster is None
            assert admin.consumer_ids(group) == [c.client_id]
        consumed(c, seen, produce(broker.address, "Joiners", 20, batch=10))
    finally:
        c.shutdown()
    assert loop_threads(kind, group) == []
    with pytest.raises(ClientStateError):
        c.connect()


def test_an_assigned_pull_consumer_connects_to_its_queues_topics(broker):
    create_topic(broker.address, "Joiners", 2)
    with Admin(brokers=broker.address) as admin:
        queues = admin.fetch_message_queues("Joiners")
    c = PullConsumer(group="assigned-early", brokers=broker.address)
    c.assign(queues)
    seen: list[str] = []
    try:
        c.connect()
        connected = c._early.cluster
        assert "Joiners" in connected._routes
        c.start()
        assert c._core.cluster is connected and c.assignment() == set(queues)
        c.seek_to_begin(queues[0])
        c.seek_to_begin(queues[1])
        consumed(c, seen, produce(broker.address, "Joiners", 10, batch=5))
    finally:
        c.shutdown()
    assert loop_threads("pull", "assigned-early") == []
    missing = PullConsumer(group="assigned-early", brokers=broker.address)
    missing.assign([MessageQueue("NoSuchTopic", queues[0].broker_name, 0)])
    with pytest.raises(NotFoundError):
        missing.connect()
    assert missing.state is ClientState.CREATED and missing._early.cluster is None
    missing.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_connected_never_started_consumer_shuts_down_without_threads(broker, kind):
    create_topic(broker.address, "Joiners", 2)
    c = consumer(kind, broker.address, "never-started", "Joiners", [])
    c.connect()
    connected = c._early.cluster
    c.shutdown()
    assert c.state is ClientState.SHUTDOWN and loop_threads(kind, "never-started") == []
    assert connected._closed
    with pytest.raises(ClientStateError):
        c.start()


@pytest.mark.parametrize("kind", KINDS)
def test_connect_to_no_broker_fails_and_leaves_the_consumer_to_try_again(broker, kind):
    c = consumer(kind, f"127.0.0.1:{free_port()}", "nobody-home", "Joiners", [], request_timeout_s=1)
    with pytest.raises(UnavailableError):
        c.connect()
    assert c.state is ClientState.CREATED and c._early.cluster is None and loop_threads(kind, "nobody-home") == []
    c.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_connect_after_start_is_a_state_error(broker, kind):
    create_topic(broker.address, "Joiners", 2)
    c = consumer(kind, broker.address, "late-connect", "Joiners", [])
    c.start()
    try:
        with pytest.raises(ClientStateError, match="connect"):
            c.connect()
    finally:
        c.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_connect_reads_the_subscribed_routes_and_refuses_an_unknown_topic(broker, kind):
    create_topic(broker.address, "Joiners", 2)
    c = consumer(kind, broker.address, "route-readers", "Joiners", [])
    try:
        c.connect()
        assert "Joiners" in c._early.cluster._routes  # start()'s heartbeat need not wait for it
    finally:
        c.shutdown()
    missing = consumer(kind, broker.address, "route-readers", "NoSuchTopic", [])
    with pytest.raises(NotFoundError):
        missing.connect()
    assert missing.state is ClientState.CREATED and missing._early.cluster is None
    assert loop_threads(kind, "route-readers") == []
    missing.shutdown()


@pytest.mark.parametrize("kind", KINDS)
def test_a_shutdown_while_connect_runs_leaves_no_thread_and_no_connection(broker, monkeypatch, kind):
    """shutdown() on another thread while connect() waited for the brokers: the consumer went to SHUTDOWN,
    then connect() kept what it opened, and no later shutdown() closed it (its loop thread stayed)."""
    create_topic(broker.address, "Joiners", 2)
    entered, proceed = threading.Event(), threading.Event()
    opened = []
    real = EarlyConnection._connect

    async def slow_connect(self, topics):
        cluster = await real(self, topics)
        opened.append(cluster)
        entered.set()
        while not proceed.is_set():  # (the loop thread's coroutine waits for the test's go)
            await asyncio.sleep(0.01)
        return cluster
    monkeypatch.setattr(EarlyConnection, "_connect", slow_connect)
    c = consumer(kind, broker.address, "racing", "Joiners", [])
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
    assert opened[0]._closed and c._early.cluster is None
    wait_until(lambda: loop_threads(kind, "racing") == [], 10, "the consumer's loop thread to end")


@pytest.mark.parametrize("kind", KINDS)
def test_a_connect_past_its_timeout_closes_every_connection_it_opened(broker, monkeypatch, kind):
    """connect() waits 2 * request_timeout_s for the routes, then gives up and stops the loop thread it
    started: the cancelled connect's cleanup, closing the connections (each a few turns of the loop), runs
    to its end first, rather than being cancelled half-way by the loop's stop."""
    create_topic(broker.address, "Joiners", 2)
    closing, closed = [], []
    real_close = BrokerConnection.close

    async def never_answered(self, topic, **kwargs):
        await asyncio.Event().wait()

    async def slow_close(self):
        closing.append(self)
        await asyncio.sleep(0.2)  # (a channel's close taking a while: the loop is stopped meanwhile)
        await real_close(self)
        closed.append(self)
    monkeypatch.setattr(BrokerCluster, "route", never_answered)
    monkeypatch.setattr(BrokerConnection, "close", slow_close)
    c = consumer(kind, broker.address, "slow-routes", "Joiners", [], request_timeout_s=0.5)
    with pytest.raises(RequestTimeoutError):
        c.connect()
    assert closing and closed == closing
    assert c.state is ClientState.CREATED and loop_threads(kind, "slow-routes") == []
    c.shutdown()
