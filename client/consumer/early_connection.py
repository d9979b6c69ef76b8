"""EarlyConnection: a consumer's brokers connected before start() (its connect()), then handed to start()
or closed by shutdown().

connect() does ahead of time what start() would do first: the consumer's loop thread, gRPC's first
channel, the brokers found (through the name servers when set) and the routes of its topics read, so
start() is left with the join itself. RocketMQ's clients have this from their process-wide
MQClientInstance, already connected when a consumer of the process starts. Nothing is registered with
a broker: the group does not hear of the consumer until start().

The one subtle part is a shutdown() on another thread while connect() waits for the brokers. A lock
orders the two: shutdown() takes it for its whole CREATED -> SHUTDOWN step, connect() to keep what it
opened, and keeps it only if the consumer is still CREATED; otherwise connect() closes it, stops the loop
thread it started and raises ClientStateError. So neither a connection nor a thread is left behind, and
a cluster is closed by exactly one of them.

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
        self._lock = threading.Lock()  # see the module docstring

    @property
    def cluster(self) -> BrokerCluster | None:
        """The connected cluster, while no start() took it and no shutdown() closed it."""
        return self._cluster

    def open(self, topics: Iterable[str]) -> None:
        """connect()'s work: a no-op when connected already; ClientStateError unless the consumer is
        CREATED; the discovery's error (or a route's, NotFoundError for a topic no broker has), or
        RequestTimeoutError after 2 * request_timeout_s, leaving the consumer as it was."""
        self._life.require(ClientState.CREATED, action="connect")
        if self._cluster is not None:
            return
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

    def take(self) -> BrokerCluster | None:
        """start(): the connected cluster, now the core's to close (None when connect() was not called)."""
        cluster, self._cluster = self._cluster, None
        return cluster

    @contextmanager
    def closing(self) -> Iterator[None]:
        """Around shutdown()'s lifecycle step: a consumer connected and never started closes its cluster
        and stops its loop thread; a connect() still under way waits to see the state it leaves."""
        with self._lock:
            cluster, self._cluster = self._cluster, None
            if cluster is not None and self._life.state is ClientState.CREATED:
                try:
                    self._loop.run(cluster.close(), timeout=self._settings.request_timeout_s + 5)
                finally:
                    self._loop.stop()
            yield
