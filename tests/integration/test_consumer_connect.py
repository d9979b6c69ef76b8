"""connect() of PushConsumer and PullConsumer: the connections opened before start(), without joining the
group (client/consumer/early_connection.py, which both use)."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest
from brokerproc import free_port
from workload import create_topic, produce, wait_until

from tidemark.client import (
    Admin,
    ClientStateError,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    MessageQueue,
    NotFoundError,
    PullConsumer,
    PushConsumer,
    RequestTimeoutError,
    UnavailableError,
)
from tidemark.client.consumer.early_connection import EarlyConnection
from tidemark.client.consumer.membership import GroupMembership
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.remoting.connection import BrokerConnection
from tidemark.client.runtime import ClientState, Lifecycle
from tidemark.common.scheduler import Scheduler

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


def held_connect(monkeypatch) -> tuple[threading.Event, threading.Event, list]:
    """EarlyConnection._connect connects, then waits for the test's go: (entered, proceed, clusters opened)."""
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
    return entered, proceed, opened


def in_thread(fn) -> tuple[threading.Thread, list]:
    """fn() on a thread of its own; what it returned or raised lands in the list."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as e:  # noqa: BLE001 - the test looks at what it was
            outcome.append(e)
    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def waiting_in(thread: threading.Thread, function: str) -> bool:
    """Whether the thread's innermost Python frame is `function` (blocked there, on a lock)."""
    frame = sys._current_frames().get(thread.ident)
    return frame is not None and frame.f_code.co_name == function


@pytest.mark.parametrize("kind", KINDS)
def test_a_connect_while_another_runs_waits_for_it_and_shares_its_connections(broker, monkeypatch, kind):
    """Two connect() in parallel each opened a cluster; the second replaced the first, which nothing
    closed any more."""
    create_topic(broker.address, "Joiners", 2)
    entered, proceed, opened = held_connect(monkeypatch)
    c = consumer(kind, broker.address, "twice", "Joiners", [])
    first, first_outcome = in_thread(c.connect)
    assert entered.wait(10)
    second, second_outcome = in_thread(c.connect)
    wait_until(lambda: waiting_in(second, "open") or len(opened) == 2, 10, "the second connect() to wait or connect")
    proceed.set()
    first.join(10)
    second.join(10)
    try:
        assert first_outcome == [c] and second_outcome == [c]
        assert len(opened) == 1 and c._early.cluster is opened[0]
        assert len(loop_threads(kind, "twice")) == 1
    finally:
        c.shutdown()
    assert all(cluster._closed for cluster in opened) and loop_threads(kind, "twice") == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_start_while_connect_runs_waits_for_it_and_uses_its_connections(broker, monkeypatch, kind):
    """start() beside a connect() under way opened a cluster of its own; the connect(), finding the consumer
    started, closed its cluster and stopped the loop thread the started consumer ran on."""
    create_topic(broker.address, "Joiners", 2)
    entered, proceed, opened = held_connect(monkeypatch)
    c = consumer(kind, broker.address, "connect-then-start", "Joiners", [])
    connecting, connected = in_thread(c.connect)
    assert entered.wait(10)
    starting, started = in_thread(c.start)
    wait_until(lambda: waiting_in(starting, "starting") or c.state is not ClientState.CREATED, 10,
               "start() to wait or begin")
    proceed.set()
    connecting.join(10)
    starting.join(30)
    try:
        assert connected == [c] and started == [c]
        assert c.state is ClientState.RUNNING and c._core.cluster is opened[0]
        assert len(loop_threads(kind, "connect-then-start")) == 1
    finally:
        c.shutdown()
    assert opened[0]._closed and loop_threads(kind, "connect-then-start") == []


@pytest.mark.parametrize("connected", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_a_shutdown_while_start_runs_gives_the_start_up_and_leaves_nothing_open(broker, monkeypatch, kind,
                                                                                connected):
    """shutdown() on another thread while start() waited for the group's first answer raised ClientStateError
    ("the consumer is starting") and left the start to go on. Now the start gives up: what it opened is
    closed (connect()'s connections too), shutdown() returns with the consumer SHUTDOWN, and start() raises
    ClientStateError."""
    create_topic(broker.address, "Joiners", 2)
    joining = threading.Event()
    clusters = []
    real_for_settings = BrokerCluster.for_settings.__func__

    def recorded(cls, s):
        cluster = real_for_settings(cls, s)
        clusters.append(cluster)
        return cluster

    async def unanswered_heartbeat(self):
        joining.set()
        await asyncio.Event().wait()
    monkeypatch.setattr(BrokerCluster, "for_settings", classmethod(recorded))
    monkeypatch.setattr(GroupMembership, "heartbeat", unanswered_heartbeat)
    c = consumer(kind, broker.address, "stopped-starting", "Joiners", [])
    if connected:
        c.connect()
    starting, started = in_thread(c.start)
    assert joining.wait(10)
    c.shutdown()
    assert c.state is ClientState.SHUTDOWN
    starting.join(10)
    assert len(started) == 1 and isinstance(started[0], ClientStateError), started
    assert "shut down while start() ran" in str(started[0])
    assert len(clusters) == 1 and clusters[0]._closed and clusters[0].connections() == []
    assert loop_threads(kind, "stopped-starting") == [] and c._core is None
    with pytest.raises(ClientStateError):
        c.start()


def test_a_start_given_up_after_the_listener_ran_leaves_no_consume_thread(broker, monkeypatch):
    """A push consumer's start given up (a shutdown() while it ran) after its first rebalance had handed
    messages to the listener: the consume threads that ran it were left parked for the process's life."""
    create_topic(broker.address, "Joiners", 1)
    ids = produce(broker.address, "Joiners", 3)
    seen: list[str] = []
    scheduling = threading.Event()

    async def never_scheduled(self):
        scheduling.set()
        await asyncio.Event().wait()
    monkeypatch.setattr(Scheduler, "start", never_scheduled)  # start() waits here, after its first rebalance
    c = consumer("push", broker.address, "given-up", "Joiners", seen,
                 consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    starting, started = in_thread(c.start)
    assert scheduling.wait(10)
    wait_until(lambda: set(seen) >= set(ids), 30, "the listener to run")
    assert consume_threads("given-up")
    c.shutdown()
    starting.join(10)
    assert len(started) == 1 and isinstance(started[0], ClientStateError), started
    wait_until(lambda: not consume_threads("given-up"), 10, "the consume threads to end")


def consume_threads(group: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"ConsumeMessageThread_{group}_") and t.is_alive()]


@pytest.mark.parametrize("kind", KINDS)
def test_a_second_start_beside_the_first_is_refused_and_leaves_the_first_one_s_consumer(broker, monkeypatch, kind):
    """Both start() calls passed the CREATED check; the second replaced the consumer's core with one of its
    own before it was refused, then dropped it: the started consumer had no core (its shutdown() failed,
    its loop thread and connections stayed)."""
    create_topic(broker.address, "Joiners", 2)
    c = consumer(kind, broker.address, "started-twice", "Joiners", [])
    at_starting, go_on = threading.Event(), threading.Event()
    to = Lifecycle.to

    def held_at_starting(life, new):  # the first start() waits here until the second one waits too
        if new is ClientState.STARTING and not at_starting.is_set():
            at_starting.set()
            go_on.wait(10)
        to(life, new)
    monkeypatch.setattr(Lifecycle, "to", held_at_starting)
    first, first_outcome = in_thread(c.start)
    assert at_starting.wait(10)
    second, second_outcome = in_thread(c.start)
    wait_until(lambda: waiting_in(second, "starting") or not second.is_alive(), 10, "the second start() to wait")
    go_on.set()
    first.join(30)
    second.join(30)
    try:
        assert first_outcome == [c] and isinstance(second_outcome[0], ClientStateError), second_outcome
        assert c.state is ClientState.RUNNING and c._core is not None and c._core.cluster.connections()
    finally:
        c.shutdown()
    assert c.state is ClientState.SHUTDOWN and loop_threads(kind, "started-twice") == []
