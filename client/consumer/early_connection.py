"""EarlyConnection: a consumer's brokers connected before start() (its connect()), then handed to start()
or closed by shutdown().

connect() does ahead of time what start() would do first: the consumer's loop thread, gRPC's first
channel, the brokers found (through the name servers when set) and the routes of its topics read, so
start() is left with the join itself. RocketMQ's clients have this from their process-wide
MQClientInstance, already connected when a consumer of the process starts. Nothing is registered with
a broker: the group does not hear of the consumer until start().

The one subtle part is other threads. A shutdown() while connect() waits for the brokers: a lock
orders the two, taken by shutdown() (once the consumer is SHUTDOWN) to close what connect() kept, and by
connect() to keep what it opened, which it keeps only if the consumer is still CREATED; otherwise
connect() closes it, stops the loop thread it started and raises ClientStateError. So neither a
connection nor a thread is left behind, and a cluster is closed by exactly one of them.

A second connect(), or a start(), while one runs waits for it and shares what it opened: a second lock,
held by connect() and start() throughout. (Two connects in parallel each opened a cluster, and the
first was never closed; a connect() that failed beside a start() stopped the loop thread the start ran
on.) start() takes the cluster only once the consumer is STARTING: a shutdown() that found it CREATED
closes the cluster, one that found it STARTING leaves it to the start, which gives up and closes it.

Apart from the consumers because PushConsumer and PullConsumer need exactly the same thing, and it is
the one piece of their lifecycle that runs before their core exists.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from tidemark.client.errors import ClientStateError
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.runtime import ClientState, Lifecycle, LoopThread
from tidemark.client.settings import ConsumerSettings


class EarlyConnection:
    """The cluster connect() opened, until start() takes it or shutdown() closes it."""

    def __init__(self, settings: ConsumerSettings, loop: LoopThread, life: Lifecycle) -> None:
        self._settings = settings
        self._loop = loop
        self._life = life
        self._cluster: BrokerCluster | None = None
        self._lock = threading.Lock()  # shutdown() against connect(): see the module docstring
        self._connecting = threading.Lock()  # one connect() at a time, none while start() runs

    @property
    def cluster(self) -> BrokerCluster | None:
        """The connected cluster, while no start() took it and no shutdown() closed it."""
        return self._cluster

    def open(self, topics: Iterable[str]) -> None:
        """connect()'s work: a no-op when connected already (by a connect() under way on another thread,
        which this waits for); ClientStateError unless the consumer is CREATED; the discovery's error (or
        a route's, NotFoundError for a topic no broker has), or RequestTimeoutError after
        2 * request_timeout_s, leaving the consumer as it was."""
        self._life.require(ClientState.CREATED, action="connect")  # (refused at once beside a start under way)
        with self._connecting:
            self._life.require(ClientState.CREATED, action="connect")
            if self._cluster is None:
                self._open(topics)

    def _open(self, topics: Iterable[str]) -> None:
        timeout = self._settings.request_timeout_s
        self._loop.start()
        try:
            cluster = self._loop.run(self._connect(sorted(set(topics))), timeout=timeout * 2)
        except BaseException:
            self._loop.stop()
            raise
        with self._lock:
            if self._life.state is ClientState.CREATED:
                self._cluster = cluster
                return
        try:  # shut down (on another thread) while it connected
            self._loop.run(cluster.close(), timeout=timeout + 5)
        finally:
            self._loop.stop()
        raise ClientStateError("the consumer was shut down while connect() ran")

    async def _connect(self, topics: list[str]) -> BrokerCluster:
        """The connected cluster with the routes of `topics` read too (kept for route_refresh_interval_s):
        start()'s first rebalance, which needs them, then need not wait for them."""
        cluster = await BrokerCluster.connect(self._settings)
        try:
            await asyncio.gather(*(cluster.route(topic) for topic in topics))
        except BaseException:
            await cluster.close()
            raise
        return cluster

    @contextmanager
    def starting(self) -> Iterator[None]:
        """Around start(): a connect() under way is waited for first (start() then takes what it opened),
        and none begins until start() has ended."""
        with self._connecting:
            yield

    def take(self) -> BrokerCluster | None:
        """start(), once the consumer is STARTING: the connected cluster, now the core's to close (None when
        connect() was not called)."""
        cluster, self._cluster = self._cluster, None
        return cluster

    def close(self) -> None:
        """shutdown() of a consumer never started, once it is SHUTDOWN: what connect() opened is closed and
        the loop thread stopped; a connect() still under way closes its own (it finds the consumer SHUTDOWN
        when it would keep it)."""
        with self._lock:
            cluster, self._cluster = self._cluster, None
            if cluster is not None:
                try:
                    self._loop.run(cluster.close(), timeout=self._settings.request_timeout_s + 5)
                finally:
                    self._loop.stop()
