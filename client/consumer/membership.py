"""GroupMembership: heartbeats to every broker, a consumer-ids watch on each, the member lists they tell.

A change pushed by any broker triggers a rebalance (RocketMQ's "consumer ids
changed" notification); the periodic rebalance covers a lost push. A broken watch
is re-opened after a short pause; a watch whose broker name another address
serves now (an elected master) is closed at once (`moved`) and opened there by
the next heartbeat: a watch standing on a paused or fenced master would never
break, and would hide the new master's member list. The member list each
broker last pushed is kept while its watch is open (a heartbeat's answer fills
in only until the watch opens), so a rebalance right after a change needs no
GetConsumerList round trip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from tidemark.client.errors import TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.remoting.connection import BrokerConnection
from tidemark.common.logs import get_logger

log = get_logger("tidemark.client.membership")

WATCH_RETRY_DELAY_S = 1.0


@dataclass(frozen=True)
class HeartbeatData:
    subscriptions: tuple[tuple[str, str, str], ...]  # (topic, expression, expression type: TAG or SQL92)
    message_model: str
    consume_type: str
    orderly: bool
    owned_queues: tuple[MessageQueue, ...]
    allocate_strategy: str


class GroupMembership:
    def __init__(self, *, cluster: BrokerCluster, group: str, client_id: str,
                 data: Callable[[], HeartbeatData], on_change: Callable[[], None]) -> None:
        self._cluster = cluster
        self._group = group
        self._client_id = client_id
        self._data = data
        self._on_change = on_change
        self._watches: dict[str, asyncio.Task] = {}
        self._members: dict[str, list[str]] = {}
        # Per broker, the list members() last gave a rebalance since the broker's watch task started.
        self._used: dict[str, list[str]] = {}
        # A heartbeat went out (it may have reached a broker even if no answer came): this client may be
        # a member, and must leave when it gives up.
        self.joined = False

    def members(self, broker_name: str) -> list[str] | None:
        """The group's client ids as the broker last told them, while its watch keeps them current."""
        ids = self._members.get(broker_name) if self._watch_open(broker_name) else None
        if ids is not None:
            self._used[broker_name] = ids
        return ids

    async def heartbeat(self) -> None:
        data = self._data()
        try:
            brokers = await self._cluster.serving()  # a replica, while its master is away
        except TidemarkError as e:  # no name server answers, or they know no broker yet (all restarted)
            log.warning("heartbeat failed: no broker known now", event="heartbeat_failed", group=self._group,
                        error=e)
            return
        self.joined = self.joined or bool(brokers)

        async def one(conn: BrokerConnection) -> list[str]:
            owned = [q for q in data.owned_queues if q.broker_name == conn.broker_name]
            return await conn.heartbeat(client_id=self._client_id, group=self._group,
                                        subscriptions=data.subscriptions, message_model=data.message_model,
                                        consume_type=data.consume_type, orderly=data.orderly, owned_queues=owned,
                                        allocate_strategy=data.allocate_strategy)

        results = await asyncio.gather(*(one(c) for c in brokers.values()), return_exceptions=True)
        for (name, conn), result in zip(brokers.items(), results, strict=True):
            if isinstance(result, TidemarkError):
                log.warning("heartbeat failed",
                            event="heartbeat_failed", group=self._group, broker=conn.address, error=result)
            elif isinstance(result, BaseException):
                raise result
            elif not self._watch_open(name):
                # While a watch is open its pushes are the list (in the broker's order); an answer to a
                # heartbeat may have been overtaken by a push and would put an older list back.
                self._members[name] = result
        self._ensure_watches(brokers)

    def _watch_open(self, broker_name: str) -> bool:
        task = self._watches.get(broker_name)
        return task is not None and not task.done()

    def _ensure_watches(self, brokers: dict[str, BrokerConnection]) -> None:
        loop = asyncio.get_running_loop()
        for name in brokers:
            task = self._watches.get(name)
            if task is None or task.done():
                self._used.pop(name, None)
                self._watches[name] = loop.create_task(self._watch(name), name=f"watch:{self._group}:{name}")

    async def _watch(self, name: str) -> None:
        last: list[str] | None = None
        while True:
            conn = None
            try:
                conn = await self._cluster.connection(name)  # the replica's, after a failover
                async for ids in conn.watch_consumer_ids(self._group, self._client_id):
                    self._members[name] = ids
                    if last is None and ids == self._used.get(name):
                        # The watch's first list is the one a rebalance already took from the heartbeat's
                        # answer (a joining client's start): no change, no second pass for nothing.
                        last = ids
                    if ids != last:
                        last = ids
                        self._on_change()
            except TidemarkError as e:
                log.info("consumer watch broke, reopening",
                         event="watch_broken", group=self._group, broker=conn.address if conn else name, error=e)
            self._members.pop(name, None)  # no longer kept current: rebalances ask the broker
            await asyncio.sleep(WATCH_RETRY_DELAY_S)

    def moved(self, broker_name: str) -> None:
        """Another address serves `broker_name` now: its watch (on the old address) ends, and what it told
        is forgotten; the caller heartbeats, which opens the watch again where the name is served."""
        task = self._watches.pop(broker_name, None)
        if task is not None:
            task.cancel()
        self._members.pop(broker_name, None)
        self._used.pop(broker_name, None)

    async def leave(self) -> None:
        """Close the watches, then unregister from every broker (graceful shutdown)."""
        tasks = list(self._watches.values())
        self._watches.clear()
        for task in tasks:
            task.cancel()
        # gather, not `except CancelledError: pass` around each await: a cancellation of leave()
        # itself must still propagate.
        await asyncio.gather(*tasks, return_exceptions=True)
        self._members.clear()
        for conn in (await self._cluster.serving()).values():
            try:
                await conn.unregister(self._client_id, self._group)
            except TidemarkError as e:
                log.warning("unregister failed",
                            event="unregister_failed", group=self._group, broker=conn.address, error=e)
