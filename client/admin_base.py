"""What every part of Admin shares: its settings, the loop thread that runs its calls, the broker
cluster it talks to, and the helpers that find the brokers a call goes to.

Admin (tidemark.client.admin) is split by subject into mixins (admin_cluster, admin_topics,
admin_groups, admin_messages, admin_auth); each subclasses AdminBase, so the helpers they use are
defined in one place a reader and a type checker can find. Admin sets the state declared here up
in its constructor and start().
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from tidemark.client.errors import ClientStateError
from tidemark.client.message import MessageQueue
from tidemark.client.namespacing import Names
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.remoting.connection import BrokerConnection
from tidemark.client.runtime import LoopThread
from tidemark.client.settings import ClientSettings

__all__ = ["AdminBase"]

T = TypeVar("T")


class AdminBase:
    """The connection state and call helpers of Admin (not used on its own)."""

    settings: ClientSettings
    _loop: LoopThread
    _cluster: BrokerCluster | None

    @property
    def cluster(self) -> BrokerCluster:
        """The brokers this client talks to (connections, routes, failover to replicas).

        Raises ClientStateError before start() and after shutdown()."""
        if self._cluster is None:
            raise ClientStateError("admin client is not started")
        return self._cluster

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._loop.run(coro, timeout=timeout or self.settings.request_timeout_s * 4 + 30)

    @property
    def _names(self) -> Names:
        """The names a call is given, in the client's namespace (namespace=): each public call wraps the
        topics, groups and queues it is given; answers carry stored names (NAMESPACE%name), as every
        admin tool and ACL rule shows them, and a stored name given back is taken as it is."""
        return Names(self.settings.namespace)

    async def _brokers(self) -> dict[str, BrokerConnection]:
        return await self.cluster.discover()

    async def _for_topic(self, topic: str) -> list[BrokerConnection]:
        route = await self.cluster.route(topic, refresh=True)
        return [await self.cluster.connection(d.broker_name) for d in route.queue_datas]

    async def _conn(self, mq: MessageQueue) -> BrokerConnection:
        return await self.cluster.connection(mq.broker_name)

    async def _read(self, mq: MessageQueue, call: Callable[[BrokerConnection], Awaitable[T]]) -> T:
        """A read of the queue's broker that goes to its replica at once when it finds the master gone."""
        return await self.cluster.read(mq.broker_name, call)
