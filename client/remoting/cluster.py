"""BrokerCluster: the brokers a client talks to, and which queues of a topic each one holds.

There is no name server: the client is given broker addresses, learns each
broker's name from GetBrokerInfo, and merges GetRoute answers into a topic
route (a topic may have queues on several brokers). Routes are cached for
route_refresh_interval_s, like RocketMQ's periodic route refresh.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from client.errors import InvalidArgumentError, NotFoundError, TidemarkError, UnavailableError
from client.message import MessageQueue
from client.remoting.connection import BrokerConnection
from client.security import TlsSettings
from client.types import QueueData, TopicRoute
from tidemark.auth import Credentials
from tidemark.logs import get_logger

log = get_logger("tidemark.client.cluster")


class BrokerCluster:
    def __init__(self, addresses: Sequence[str], *, timeout_s: float = 3.0, route_ttl_s: float = 30.0,
                 credentials: Credentials | None = None, tls: TlsSettings | None = None) -> None:
        self._timeout = timeout_s
        self._route_ttl = route_ttl_s
        self._credentials = credentials
        self._tls = tls
        self._by_address: dict[str, BrokerConnection] = {a: self._connect(a) for a in addresses}
        self._by_name: dict[str, BrokerConnection] = {}
        self._routes: dict[str, tuple[float, TopicRoute]] = {}
        self._lock = asyncio.Lock()

    def _connect(self, address: str) -> BrokerConnection:
        """Every connection of the cluster dials the same way: the same credentials and TLS settings."""
        return BrokerConnection(address, timeout_s=self._timeout, credentials=self._credentials, tls=self._tls)

    @property
    def addresses(self) -> list[str]:
        return list(self._by_address)

    def connections(self) -> list[BrokerConnection]:
        return list(self._by_address.values())

    async def close(self) -> None:
        for conn in self._by_address.values():
            await conn.close()
        self._by_address.clear()
        self._by_name.clear()

    async def discover(self) -> dict[str, BrokerConnection]:
        """Learn the name of every reachable broker; UnavailableError if none answers."""
        async with self._lock:
            missing = [c for c in self._by_address.values() if c.broker_name is None]
            results = await asyncio.gather(*(c.broker_info() for c in missing), return_exceptions=True)
            failures: list[TidemarkError] = []
            for conn, result in zip(missing, results, strict=True):
                if isinstance(result, TidemarkError):
                    log.warning("broker unreachable", event="broker_unreachable", addr=conn.address, error=result)
                    failures.append(result)
                    continue
                if isinstance(result, BaseException):
                    raise result
                other = self._by_name.get(result.broker_name)
                if other is not None and other is not conn:
                    raise InvalidArgumentError(
                        f"brokers {other.address} and {conn.address} both call themselves {result.broker_name!r}")
                self._by_name[result.broker_name] = conn
            if not self._by_name:
                if len(failures) == 1:
                    raise failures[0]  # its message names the broker and why (a refused TLS handshake...)
                why = "; ".join(str(f) for f in failures)
                # Every broker refused the same way (credentials, TLS): that kind, not a retriable outage.
                kinds = {type(f) for f in failures}
                kind = kinds.pop() if len(kinds) == 1 else UnavailableError
                raise kind(f"no broker reachable at {', '.join(self._by_address)}" + (f": {why}" if why else ""),
                           code=failures[0].code if failures else None)
            return dict(self._by_name)

    async def connection(self, broker_name: str) -> BrokerConnection:
        conn = self._by_name.get(broker_name)
        if conn is None:
            await self.discover()
            conn = self._by_name.get(broker_name)
        if conn is None:
            raise NotFoundError(f"broker {broker_name!r} is not among the known brokers ({', '.join(self._by_name)})")
        return conn

    async def any_connection(self) -> BrokerConnection:
        names = self._by_name or await self.discover()
        return next(iter(names.values()))

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        cached = self._routes.get(topic)
        if cached is not None and not refresh and time.monotonic() - cached[0] < self._route_ttl:
            return cached[1]
        brokers = await self.discover()
        answers = await asyncio.gather(*(c.route(topic) for c in brokers.values()), return_exceptions=True)
        datas: list[QueueData] = []
        for result in answers:
            if isinstance(result, NotFoundError | UnavailableError):
                continue
            if isinstance(result, BaseException):
                raise result
            datas.extend(result.queue_datas)
        if not datas:
            self._routes.pop(topic, None)
            raise NotFoundError(f"topic {topic!r} does not exist on any broker ({', '.join(brokers)})")
        for d in datas:
            if d.broker_name not in self._by_name and d.broker_addr not in self._by_address:
                conn = self._connect(d.broker_addr)
                conn.broker_name = d.broker_name
                self._by_address[d.broker_addr] = conn
                self._by_name[d.broker_name] = conn
        route = TopicRoute(topic, tuple(sorted(datas, key=lambda d: d.broker_name)))
        self._routes[topic] = (time.monotonic(), route)
        return route

    def forget_route(self, topic: str) -> None:
        self._routes.pop(topic, None)

    async def read_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        return (await self.route(topic, refresh=refresh)).read_queues()

    async def write_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        return (await self.route(topic, refresh=refresh)).write_queues()
