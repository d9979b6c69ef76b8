"""RebalanceService: decentralised queue allocation, topic by topic, as RocketMQ's RebalanceImpl.

Every client sorts the same queue list and the same client-id list and runs
the same strategy, so each computes its own share and all agree. Runs at
start, on a consumer-ids push and every rebalance interval; only a changed
result leads to queues moving, and that is logged the way RocketMQ logs it.
A pass fetches every topic's route at once and the group's member list once
per broker, so a joining consumer's first pass costs few round trips.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tidemark.client.consumer.allocate import AllocateMessageQueueStrategy
from tidemark.client.consumer.ownership import QueueOwnership
from tidemark.client.errors import NotFoundError, TidemarkError
from tidemark.client.message import MessageModel, MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.types import TopicRoute
from tidemark.common.logs import get_logger
from tidemark.common.protocol import is_retry_topic
from tidemark.common.scheduler import cancel_and_wait

log = get_logger("tidemark.client.rebalance")


class RebalanceService:
    def __init__(self, *, cluster: BrokerCluster, group: str, client_id: str, model: MessageModel,
                 strategy: AllocateMessageQueueStrategy, ownership: QueueOwnership,
                 topics: Callable[[], list[str]], on_change: Callable[[], None] = lambda: None,
                 on_not_member: Callable[[], None] = lambda: None,
                 known_members: Callable[[str], list[str] | None] = lambda broker: None,
                 on_allocated: Callable[[str, set[MessageQueue]], None] = lambda topic, mine: None) -> None:
        self._cluster = cluster
        self._group = group
        self._client_id = client_id
        self._model = model
        self._strategy = strategy
        self._ownership = ownership
        self._topics = topics
        # Called after an assignment changed (the consumer heartbeats its new queues at once).
        self._on_change = on_change
        # Called when the broker does not list this client (e.g. it restarted): heartbeat now.
        self._on_not_member = on_not_member
        # The member list a broker last pushed (None: ask it).
        self._known_members = known_members
        # Called with a topic's share before the ownership takes it on (the fetcher opens new queues ahead).
        self._on_allocated = on_allocated
        self._pushed = False
        self.rebalances = 0
        self.changes = 0

    def members_changed(self) -> None:
        """A broker pushed a new member list: the next pass may trust cached routes and pushed lists."""
        self._pushed = True

    async def do_rebalance(self, *, fast: bool | None = None) -> None:
        """One pass over every subscribed topic, retry topics last.

        A periodic pass refreshes every route (together) and asks each broker for the member list once;
        a fast pass (after a membership push, or at start when routes were just read) uses the cached
        routes and the lists the brokers pushed, so a handover starts without extra round trips. Routes
        are asked for together, and each topic is rebalanced as soon as its own route is there: a route
        still on its way (a new member's retry topic) does not hold up the queues of the others. The
        first lock requests of every topic's new queues are answered together at the end (`settle`):
        when the pass returns, the start offsets of what they granted are fixed."""
        fast = self._pushed if fast is None else fast
        self._pushed = False
        self.rebalances += 1
        topics = sorted(self._topics(), key=lambda t: (is_retry_topic(t), t))
        routes = [asyncio.ensure_future(self._cluster.route(t, refresh=not fast)) for t in topics]
        members: dict[str, list[str]] = {}  # broker name -> the group's client ids it knows
        changed = False
        try:
            for topic, route in zip(topics, routes, strict=True):
                try:
                    changed = await self._rebalance_topic(topic, await route, members, fast=fast) or changed
                except NotFoundError as e:
                    # The topic is gone (deleted) or not created yet: hand back whatever we held of it.
                    log.debug("rebalance skipped", event="rebalance_skip", group=self._group, topic=topic, reason=e)
                    self._on_allocated(topic, set())  # (its queues opened ahead of their locks are closed)
                    if await self._ownership.update(topic, set()):
                        self.changes += 1
                        changed = True
                except TidemarkError as e:
                    log.warning("rebalance failed", event="rebalance_failed", group=self._group, topic=topic,
                                error=e)
        finally:
            await cancel_and_wait(*routes)  # (those of a pass cut short; the others are done)
        await self._ownership.settle()
        if changed:
            self._on_change()

    async def allocation(self, route: TopicRoute, members: dict[str, list[str]], *, fast: bool = False
                         ) -> tuple[list[MessageQueue], list[str], set[MessageQueue]]:
        """(all queues, all client ids, this client's share) for a topic; `members` holds the lists known
        in this pass (fast: a list a broker pushed is taken as it is)."""
        mq_all = route.read_queues()
        if self._model is MessageModel.BROADCASTING:
            return mq_all, [self._client_id], set(mq_all)
        broker = route.queue_datas[0].broker_name
        cid_all = members.get(broker)
        if cid_all is None and fast:
            cid_all = self._known_members(broker)
        if cid_all is None:
            conn = await self._cluster.connection(broker)
            # Given up when the master moves meanwhile: the pass goes on at once, and so does the next.
            cid_all = await self._cluster.moves.until(broker, conn.consumer_ids(self._group))
        members[broker] = cid_all
        if not mq_all or not cid_all:
            return mq_all, cid_all, set()
        return mq_all, cid_all, set(self._strategy.allocate(self._group, self._client_id, mq_all, cid_all))

    async def _rebalance_topic(self, topic: str, route: TopicRoute, members: dict[str, list[str]], *,
                               fast: bool) -> bool:
        """Whether this client's queues of the topic changed."""
        mq_all, cid_all, mine = await self.allocation(route, members, fast=fast)
        if self._model is MessageModel.CLUSTERING and self._client_id not in cid_all:
            # Not registered on the broker (restarted, or expired us): register first; the membership
            # push that follows triggers the next rebalance. Keep what we have meanwhile.
            log.info("not in the group's member list, heartbeating",
                     event="rebalance_not_member", group=self._group, topic=topic)
            self._on_not_member()
            return False
        self._on_allocated(topic, mine)
        if not await self._ownership.update(topic, mine):
            return False
        self.changes += 1
        log.info("rebalanced result changed. allocateMessageQueueStrategyName=%s, group=%s, topic=%s, clientId=%s, mqAllSize=%d, cidAllSize=%d, rebalanceResultSize=%d, rebalanceResultSet=[%s]", self._strategy.name, self._group, topic, self._client_id, len(mq_all), len(cid_all), len(mine), ", ".join(str(q) for q in sorted(mine)), event="rebalance_changed")
        return True
