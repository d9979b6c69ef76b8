"""PullConsumer (RocketMQ's DefaultLitePullConsumer): the application polls.

Two modes: subscribe(topic) joins the group and gets queues by rebalance (with
the same ownership handover as the push consumer), or assign(queues) reads
exactly those queues with no group coordination. Background pull loops fill a
buffer; poll() hands out one pulled batch at a time and advances the queue's
consumed offset; commit() (or auto commit every auto_commit_interval_s, until
the application commits itself) stores consumed offsets on the broker.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from client.consumer.consume_from_where import compute_pull_from_where
from client.consumer.membership import GroupMembership, HeartbeatData
from client.consumer.offset_store import RemoteBrokerOffsetStore
from client.consumer.ownership import QueueOwnership
from client.consumer.pull_service import PullMessageService
from client.consumer.push_consumer import LOCK_RETRY_INTERVAL_S, resolve_strategy
from client.consumer.queue_state import OwnedQueue
from client.consumer.rebalance import RebalanceService
from client.errors import ClientStateError, InvalidArgumentError
from client.message import MessageExt, MessageQueue
from client.remoting.cluster import BrokerCluster
from client.runtime import LoopThread
from client.settings import PullConsumerSettings, build, unique_instance
from tidemark.protocol import InvalidNameError, check_topic_name, parse_tag_expression
from tidemark.scheduler import Scheduler

log = logging.getLogger("tidemark.client.pull_consumer")


@dataclasses.dataclass(frozen=True, slots=True)
class _Fetched:
    oq: OwnedQueue
    msgs: list[MessageExt]
    cache_epoch: int


class AsyncLitePullConsumer:
    def __init__(self, settings: PullConsumerSettings) -> None:
        self.settings = settings
        self.client_id = settings.client_id
        self.subscriptions: dict[str, str] = {}
        self.assigned: set[MessageQueue] | None = None
        self.paused: set[MessageQueue] = set()
        self.auto_commit = settings.auto_commit
        # Offset after the last message poll() returned, per queue; it reaches the offset store (and so
        # the broker) only through commit() or auto commit.
        self.consumed: dict[MessageQueue, int] = {}
        # Pulled batches in arrival order; batches of paused queues wait in _held, in order, until resume.
        self._ready: collections.deque[_Fetched] = collections.deque()
        self._held: dict[MessageQueue, collections.deque[_Fetched]] = {}
        self._arrived = asyncio.Event()
        self.scheduler = Scheduler(f"pull-consumer:{settings.group}")

    async def start(self, subscriptions: dict[str, str], assigned: set[MessageQueue] | None) -> None:
        s = self.settings
        self.subscriptions = dict(subscriptions)
        self.cluster = BrokerCluster(s.brokers, timeout_s=s.request_timeout_s, route_ttl_s=s.route_refresh_interval_s)
        try:
            await self.cluster.discover()
            for topic in self.subscriptions:
                await self.cluster.route(topic)
            locking = s.queue_locking and assigned is None
            self.store = RemoteBrokerOffsetStore(self.cluster, s.group, self.client_id, require_fence=locking)
            self.pull_service = PullMessageService(
                cluster=self.cluster, settings=s, client_id=self.client_id, offset_store=self.store,
                subscription=lambda topic: self.subscriptions.get(topic, "*"), dispatch=self._dispatch,
                lose=lambda oq, reason: self.ownership.lose(oq.mq, reason), max_span=None,
                piggyback_commit=False)
            self.ownership = QueueOwnership(
                cluster=self.cluster, group=s.group, client_id=self.client_id, offset_store=self.store,
                locking=locking, drain_timeout_s=s.drain_timeout_s,
                start_offset=self._start_offset, start_pulling=self._start_pulling,
                on_lost=self._on_queue_lost, commit_start_offset=False)
            sched = self.scheduler
            sched.every("auto-commit", s.auto_commit_interval_s, self._auto_commit)
            if assigned is None:
                self.rebalance = RebalanceService(
                    cluster=self.cluster, group=s.group, client_id=self.client_id, model=s.message_model,
                    strategy=resolve_strategy(s.allocate_strategy), ownership=self.ownership,
                    topics=lambda: sorted(self.subscriptions),
                    on_change=lambda: self.scheduler.trigger("heartbeat"),
                    on_not_member=lambda: self.scheduler.trigger("heartbeat"))
                self.membership: GroupMembership | None = GroupMembership(
                    cluster=self.cluster, group=s.group, client_id=self.client_id, data=self._heartbeat_data,
                    on_change=lambda: self.scheduler.trigger("rebalance"))
                sched.every("heartbeat", s.heartbeat_interval_s, self.membership.heartbeat)
                sched.every("rebalance", s.rebalance_interval_s, self.rebalance.do_rebalance)
                if self.ownership.locking:
                    sched.every("renew-locks", s.lock_renew_interval_s, self.ownership.renew_locks)
                    sched.every("retry-locks", LOCK_RETRY_INTERVAL_S, self.ownership.retry_locks)
                await self.membership.heartbeat()
                await self.rebalance.do_rebalance()
            else:
                self.membership = None
                await self.assign(assigned)
            await sched.start()
        except BaseException:
            await self.cluster.close()
            raise

    def _on_queue_lost(self, mq: MessageQueue) -> None:
        self.scheduler.trigger("heartbeat")
        self.scheduler.trigger("rebalance")

    def _heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(tuple(sorted(self.subscriptions.items())), self.settings.message_model.value,
                             "CONSUME_ACTIVELY", False, tuple(self.ownership.pulling()),
                             resolve_strategy(self.settings.allocate_strategy).name)

    async def assign(self, queues: Iterable[MessageQueue]) -> None:
        wanted = set(queues)
        self.assigned = wanted
        for topic in {mq.topic for mq in wanted} | {oq.mq.topic for oq in self.ownership.queues()}:
            await self.ownership.update(topic, {mq for mq in wanted if mq.topic == topic})

    async def _start_offset(self, mq: MessageQueue) -> int:
        s = self.settings
        return await compute_pull_from_where(mq, where=s.consume_from_where, consume_timestamp_ms=s.consume_timestamp_ms,
                                             offset_store=self.store, cluster=self.cluster)

    def _start_pulling(self, oq: OwnedQueue) -> asyncio.Task:
        self._consumed(oq.mq, oq.next_offset)
        return self.pull_service.start(oq)

    def _consumed(self, mq: MessageQueue, offset: int) -> None:
        self.consumed[mq] = offset
        if self.auto_commit:
            self.store.update_offset(mq, offset, increase_only=False)

    def _dispatch(self, oq: OwnedQueue, msgs: list[MessageExt]) -> None:
        fetched = _Fetched(oq, msgs, oq.epoch_of_cache)
        if oq.mq in self.paused:
            self._held.setdefault(oq.mq, collections.deque()).append(fetched)
        else:
            self._ready.append(fetched)
            self._arrived.set()

    def pause(self, mqs: Iterable[MessageQueue]) -> None:
        self.paused.update(mqs)

    def resume(self, mqs: Iterable[MessageQueue]) -> None:
        for mq in mqs:
            self.paused.discard(mq)
            held = self._held.pop(mq, None)
            if held:
                self._ready.extend(held)
                self._arrived.set()

    async def poll(self, timeout_s: float) -> list[MessageExt]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            while self._ready:
                fetched = self._ready.popleft()
                oq = fetched.oq
                if not oq.pulling or fetched.cache_epoch != oq.epoch_of_cache:
                    continue  # the queue moved away, was reset or seeked: this batch is stale
                if oq.mq in self.paused:
                    self._held.setdefault(oq.mq, collections.deque()).append(fetched)
                    continue
                oq.pq.remove_messages(fetched.msgs)
                self._consumed(oq.mq, fetched.msgs[-1].queue_offset + 1)
                return fetched.msgs
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except TimeoutError:
                return []

    def _owned(self, mq: MessageQueue) -> OwnedQueue:
        oq = self.ownership.get(mq)
        if oq is None or not oq.pulling:
            raise InvalidArgumentError(f"{mq} is not assigned to this consumer")
        return oq

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        oq = self._owned(mq)
        conn = await self.cluster.connection(mq.broker_name)
        low, high = await conn.min_offset(mq), await conn.max_offset(mq)
        if not low <= offset <= high:
            raise InvalidArgumentError(f"seek offset {offset} is outside [{low}, {high}] for {mq}")
        if oq.pull_task is not None:
            oq.pull_task.cancel()
        oq.pq.clear()
        oq.epoch_of_cache += 1
        self._held.pop(mq, None)
        oq.next_offset = offset
        self._consumed(mq, offset)
        oq.pull_task = self.pull_service.start(oq)

    async def seek_edge(self, mq: MessageQueue, *, end: bool) -> None:
        conn = await self.cluster.connection(mq.broker_name)
        await self.seek(mq, await (conn.max_offset(mq) if end else conn.min_offset(mq)))

    async def committed(self, mq: MessageQueue) -> int:
        conn = await self.cluster.connection(mq.broker_name)
        return (await conn.query_consumer_offset(self.settings.group, mq))[0]

    async def commit(self, offsets: Mapping[MessageQueue, int] | None, sync: bool) -> None:
        if offsets is None:
            offsets = {oq.mq: self.consumed[oq.mq] for oq in self.ownership.queues()
                       if oq.pulling and oq.mq in self.consumed}
        for mq, offset in offsets.items():
            self._owned(mq)
            if offset < 0:
                raise InvalidArgumentError(f"commit offset must be >= 0, got {offset} for {mq}")
            self.store.update_offset(mq, offset, increase_only=False)
        targets = list(offsets)
        if sync:
            for mq in targets:
                await self.store.persist(mq)
        else:
            await self.store.persist_all(self.ownership.assigned())

    async def _auto_commit(self) -> None:
        if self.auto_commit:
            await self.store.persist_all(self.ownership.assigned())

    async def shutdown(self) -> None:
        await self.scheduler.stop()
        await self.ownership.release_all()
        if self.membership is not None:
            await self.membership.leave()
        await self.cluster.close()


class PullConsumer:
    """Synchronous lite pull consumer.

        with PullConsumer(group="g", brokers="127.0.0.1:10911") as c:   # after subscribe()/assign()
            ...
        c = PullConsumer(group="g"); c.assign(queues); c.start(); c.seek(q, 0); msgs = c.poll(1.0)
    """

    def __init__(self, settings: PullConsumerSettings | None = None, /, **overrides: Any) -> None:
        self.settings: PullConsumerSettings = unique_instance(
            build(PullConsumerSettings, settings, overrides))  # type: ignore[assignment]
        self._subscriptions: dict[str, str] = {}
        self._assigned: set[MessageQueue] | None = None
        self._loop = LoopThread(f"pull-consumer-{self.settings.group}")
        self._core: AsyncLitePullConsumer | None = None
        self._state = "CREATED"

    def subscribe(self, topic: str, expression: str = "*") -> None:
        if self._assigned is not None:
            raise ClientStateError("subscribe() and assign() cannot be mixed")
        try:
            check_topic_name(topic)
            parse_tag_expression(expression)
        except (InvalidNameError, ValueError) as e:
            raise InvalidArgumentError(str(e)) from None
        if self._state != "CREATED":
            raise ClientStateError("subscribe before start()")
        self._subscriptions[topic] = expression or "*"

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Read exactly these queues (no rebalance); may be called again while running."""
        if self._subscriptions:
            raise ClientStateError("subscribe() and assign() cannot be mixed")
        queues = set(queues)
        if not all(isinstance(q, MessageQueue) for q in queues):
            raise InvalidArgumentError("assign() takes MessageQueue objects")
        self._assigned = queues
        if self._state == "RUNNING":
            self._run(self._require().assign(queues))

    def start(self) -> PullConsumer:
        if self._state != "CREATED":
            raise ClientStateError(f"cannot start: the consumer is {self._state.lower()}")
        if not self._subscriptions and self._assigned is None:
            raise ClientStateError("subscribe() or assign() before start()")
        self._loop.start()
        core = AsyncLitePullConsumer(self.settings)
        try:
            self._loop.run(core.start(self._subscriptions, self._assigned), timeout=self.settings.request_timeout_s * 4 + 5)
        except BaseException:
            self._loop.stop()
            self._state = "SHUTDOWN"
            raise
        self._core = core
        self._state = "RUNNING"
        return self

    def shutdown(self) -> None:
        if self._state == "RUNNING":
            core, self._core = self._core, None
            try:
                self._loop.run(core.shutdown(), timeout=self.settings.drain_timeout_s + 30)
            finally:
                self._loop.stop()
        self._state = "SHUTDOWN"

    def __enter__(self) -> PullConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _require(self) -> AsyncLitePullConsumer:
        if self._core is None:
            raise ClientStateError(f"consumer is {self._state.lower()}; start() it first"
                                   if self._state == "CREATED" else "consumer was shut down")
        return self._core

    def _run(self, coro, timeout: float | None = None):
        return self._loop.run(coro, timeout=timeout or self.settings.request_timeout_s * 4 + 5)

    def poll(self, timeout: float | None = None) -> list[MessageExt]:
        """The next pulled batch (one queue, in offset order), or [] after timeout seconds."""
        core = self._require()
        wait = self.settings.poll_timeout_s if timeout is None else timeout
        return self._run(core.poll(wait), timeout=wait + 5)

    def seek(self, mq: MessageQueue, offset: int) -> None:
        """Continue reading mq at offset (within [min, max] of the queue)."""
        self._run(self._require().seek(mq, offset))

    def seek_to_begin(self, mq: MessageQueue) -> None:
        self._run(self._require().seek_edge(mq, end=False))

    def seek_to_end(self, mq: MessageQueue) -> None:
        self._run(self._require().seek_edge(mq, end=True))

    def committed(self, mq: MessageQueue) -> int:
        """The group's committed offset on the broker (-1 when none)."""
        return self._run(self._require().committed(mq))

    def commit(self, offsets: Mapping[MessageQueue, int] | None = None, *, sync: bool = True) -> None:
        """Commit consumed offsets (or the given ones); turns auto commit off from then on."""
        core = self._require()
        if core.auto_commit:
            log.info("manual commit, auto commit off event=auto_commit_off group=%s", self.settings.group)
            core.auto_commit = False
        self._run(core.commit(offsets, sync))

    def assignment(self) -> set[MessageQueue]:
        return set(self._loop.call(self._require().ownership.pulling, timeout=5))

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        return self._run(self._require().cluster.read_queues(topic, refresh=True))

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """Stop returning batches of these queues from poll() (pulling continues up to the flow limit)."""
        core, queues = self._require(), list(queues)
        self._loop.call(lambda: core.pause(queues), timeout=5)

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        core, queues = self._require(), list(queues)
        self._loop.call(lambda: core.resume(queues), timeout=5)
