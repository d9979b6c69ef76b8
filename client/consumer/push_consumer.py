"""PushConsumer: subscribe, register a listener, start; messages arrive on a thread pool.

The asyncio core (AsyncPushConsumer) owns: the broker cluster, the offset store
(remote for CLUSTERING, local file for BROADCASTING), queue ownership, the
rebalance service, group membership, the pull service, the consume service,
and one Scheduler with every timer (heartbeat 30 s, offset persist 5 s,
rebalance 20 s, lock renewal 20 s, lock retry). The synchronous PushConsumer
runs it on its own loop thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any

from client.consumer.allocate import AllocateMessageQueueStrategy, strategy_by_name
from client.consumer.consume_concurrently import ConsumeMessageConcurrentlyService
from client.consumer.consume_from_where import compute_pull_from_where
from client.consumer.consume_orderly import ConsumeMessageOrderlyService
from client.consumer.listener import MessageListenerConcurrently, MessageListenerOrderly
from client.consumer.membership import GroupMembership, HeartbeatData
from client.consumer.offset_store import LocalFileOffsetStore, OffsetStore, RemoteBrokerOffsetStore
from client.consumer.ownership import QueueOwnership
from client.consumer.pull_service import PullMessageService
from client.consumer.queue_state import OwnedQueue
from client.consumer.rebalance import RebalanceService
from client.consumer.send_back import SendBackService
from client.errors import ClientStateError, InvalidArgumentError
from client.message import MessageModel, MessageQueue
from client.remoting.cluster import BrokerCluster
from client.runtime import LoopThread
from client.settings import PushConsumerSettings, build, unique_instance
from client.types import CommitRejectReason, RejectedCommit
from tidemark.protocol import InvalidNameError, check_topic_name, parse_tag_expression, retry_topic
from tidemark.scheduler import Scheduler

log = logging.getLogger("tidemark.client.consumer")

# How often queues waiting for their previous owner's release try to lock again.
LOCK_RETRY_INTERVAL_S = 0.1


def resolve_strategy(value: str | AllocateMessageQueueStrategy) -> AllocateMessageQueueStrategy:
    if isinstance(value, AllocateMessageQueueStrategy):
        return value
    try:
        return strategy_by_name(value)
    except ValueError as e:
        raise InvalidArgumentError(str(e)) from None


class AsyncPushConsumer:
    def __init__(self, settings: PushConsumerSettings, subscriptions: dict[str, str],
                 listener: MessageListenerConcurrently | MessageListenerOrderly, *, orderly: bool) -> None:
        self.settings = settings
        self.client_id = settings.client_id
        self._subscriptions = dict(subscriptions)
        self._listener = listener
        self.orderly = orderly
        self.strategy = resolve_strategy(settings.allocate_strategy)
        self.clustering = settings.message_model is MessageModel.CLUSTERING
        self.scheduler = Scheduler(f"consumer:{settings.group}")
        # One-off tasks (e.g. dropping a queue after a fenced commit), awaited at shutdown.
        self._background: set[asyncio.Task] = set()
        # Set by PushConsumer.suspend() from any thread; read by pull loops and consume threads.
        self.suspended = False

    def _topics(self) -> list[str]:
        return sorted(self._subscriptions)

    def _subscription(self, topic: str) -> str:
        return self._subscriptions.get(topic, "*")

    async def start(self) -> None:
        s = self.settings
        self.cluster = BrokerCluster(s.brokers, timeout_s=s.request_timeout_s, route_ttl_s=s.route_refresh_interval_s)
        try:
            await self._start()
        except BaseException:
            await self.cluster.close()
            raise

    async def _start(self) -> None:
        s = self.settings
        await self.cluster.discover()
        for topic in self._topics():
            await self.cluster.route(topic)  # NotFoundError for an unknown topic, before anything starts
        if self.clustering:
            self._subscriptions.setdefault(retry_topic(s.group), "*")
        locking = self.clustering and (s.queue_locking or self.orderly)
        self.offset_store: OffsetStore = (
            RemoteBrokerOffsetStore(self.cluster, s.group, self.client_id, on_rejected=self._on_rejected,
                                    require_fence=locking)
            if self.clustering else LocalFileOffsetStore(self.client_id, s.group))
        await self.offset_store.load()
        self.executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=s.consume_thread_max, thread_name_prefix=f"ConsumeMessageThread_{s.group}")
        # -1 (default): the broker's group config decides (retry_max_times, 16 unless changed).
        self.send_back = SendBackService(cluster=self.cluster, group=s.group, client_id=self.client_id,
                                         max_reconsume_times=max(s.max_reconsume_times, 0))
        service_cls = ConsumeMessageOrderlyService if self.orderly else ConsumeMessageConcurrentlyService
        self.consume_service = service_cls(listener=self._listener, settings=s, executor=self.executor,
                                           offset_store=self.offset_store, send_back=self.send_back,
                                           suspended=lambda: self.suspended)
        self.pull_service = PullMessageService(
            cluster=self.cluster, settings=s, client_id=self.client_id, offset_store=self.offset_store,
            subscription=self._subscription, dispatch=self.consume_service.submit, lose=self._lose,
            max_span=None if self.orderly else s.consume_concurrently_max_span,
            suspended=lambda: self.suspended)
        self.ownership = QueueOwnership(
            cluster=self.cluster, group=s.group, client_id=self.client_id, offset_store=self.offset_store,
            locking=locking, drain_timeout_s=s.drain_timeout_s,
            start_offset=self._start_offset, start_pulling=self.pull_service.start,
            on_lost=self._on_queue_lost)
        self.rebalance = RebalanceService(cluster=self.cluster, group=s.group, client_id=self.client_id,
                                          model=s.message_model, strategy=self.strategy, ownership=self.ownership,
                                          topics=self._topics,
                                          on_change=lambda: self.scheduler.trigger("heartbeat"),
                                          on_not_member=lambda: self.scheduler.trigger("heartbeat"))
        self.membership = GroupMembership(cluster=self.cluster, group=s.group, client_id=self.client_id,
                                          data=self._heartbeat_data,
                                          on_change=lambda: self.scheduler.trigger("rebalance"))
        # Jobs are registered before the first heartbeat opens the watch: a membership push arriving
        # while start() runs then wakes the rebalance job as soon as the scheduler starts.
        sched = self.scheduler
        sched.every("heartbeat", s.heartbeat_interval_s, self.membership.heartbeat)
        sched.every("persist-offsets", s.persist_consumer_offset_interval_s, self.persist_offsets)
        sched.every("rebalance", s.rebalance_interval_s, self.rebalance.do_rebalance)
        if self.ownership.locking:
            sched.every("renew-locks", s.lock_renew_interval_s, self.ownership.renew_locks)
            sched.every("retry-locks", LOCK_RETRY_INTERVAL_S, self.ownership.retry_locks)
        await self.membership.heartbeat()
        # The first rebalance finishes inside start(): when start() returns, start offsets are fixed.
        await self.rebalance.do_rebalance()
        await sched.start()
        log.info("consumer started event=consumer_start group=%s client_id=%s model=%s orderly=%s locking=%s "
                 "strategy=%s topics=%s", s.group, self.client_id, s.message_model.value, self.orderly,
                 self.ownership.locking, self.strategy.name, ",".join(self._topics()))

    def _heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(
            subscriptions=tuple((t, e) for t, e in sorted(self._subscriptions.items())),
            message_model=self.settings.message_model.value,
            consume_type="CONSUME_PASSIVELY",
            orderly=self.orderly,
            owned_queues=tuple(self.ownership.pulling()),
            allocate_strategy=self.strategy.name,
        )

    async def _start_offset(self, mq: MessageQueue) -> int:
        s = self.settings
        return await compute_pull_from_where(mq, where=s.consume_from_where,
                                             consume_timestamp_ms=s.consume_timestamp_ms,
                                             offset_store=self.offset_store, cluster=self.cluster)

    def _on_queue_lost(self, mq: MessageQueue) -> None:
        # Re-register (a restarted broker forgot us) and rebalance now rather than at the next timer.
        self.scheduler.trigger("heartbeat")
        self.scheduler.trigger("rebalance")

    async def _lose(self, oq: OwnedQueue, reason: str) -> None:
        await self.ownership.lose(oq.mq, reason)

    def _on_rejected(self, rejection: RejectedCommit) -> None:
        if rejection.reason is CommitRejectReason.FENCED:
            task = asyncio.get_running_loop().create_task(
                self.ownership.lose(rejection.queue, f"commit fenced: {rejection.message}"))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def resume(self) -> None:
        """Loop thread: undo suspend() and hand held batches to the listener."""
        self.suspended = False
        self.consume_service.resume()

    async def persist_offsets(self) -> None:
        await self.offset_store.persist_all(self.ownership.assigned())

    async def shutdown(self) -> None:
        """Stop rebalancing, hand every queue back (drain, commit, unlock), leave the group."""
        await self.scheduler.stop()
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.ownership.release_all()
        if not self.clustering:
            await self.offset_store.persist_all(self.offset_store.clone_offset_table())
        await self.membership.leave()
        await self.consume_service.shutdown()
        self.executor.shutdown(wait=True, cancel_futures=True)
        await self.cluster.close()
        log.info("consumer stopped event=consumer_stop group=%s client_id=%s", self.settings.group, self.client_id)


class PushConsumer:
    """Synchronous push consumer.

        consumer = PushConsumer(group="orders", brokers="127.0.0.1:10911")
        consumer.subscribe("Orders", "paid || shipped")
        consumer.register_message_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
        consumer.start(); ...; consumer.shutdown()
    """

    def __init__(self, settings: PushConsumerSettings | None = None, /, **overrides: Any) -> None:
        self.settings: PushConsumerSettings = unique_instance(
            build(PushConsumerSettings, settings, overrides))  # type: ignore[assignment]
        self._subscriptions: dict[str, str] = {}
        self._listener: Any = None
        self._orderly = False
        self._loop = LoopThread(f"push-consumer-{self.settings.group}")
        self._core: AsyncPushConsumer | None = None
        self._state = "CREATED"

    @property
    def client_id(self) -> str:
        return self.settings.client_id

    def subscribe(self, topic: str, expression: str = "*") -> None:
        self._check_created("subscribe")
        try:
            check_topic_name(topic)
            parse_tag_expression(expression)
        except (InvalidNameError, ValueError) as e:
            raise InvalidArgumentError(str(e)) from None
        self._subscriptions[topic] = expression or "*"

    def register_message_listener(self, listener: MessageListenerConcurrently) -> None:
        """A concurrent listener: (msgs, context) -> ConsumeConcurrentlyStatus."""
        self._set_listener(listener, orderly=False)

    def register_message_listener_orderly(self, listener: MessageListenerOrderly) -> None:
        """An orderly listener: (msgs, context) -> ConsumeOrderlyStatus; one queue at a time, in order."""
        self._set_listener(listener, orderly=True)

    def _set_listener(self, listener: Any, *, orderly: bool) -> None:
        self._check_created("register a listener")
        if not callable(listener):
            raise InvalidArgumentError(f"listener must be callable, got {type(listener).__name__}")
        self._listener, self._orderly = listener, orderly

    def _check_created(self, what: str) -> None:
        if self._state != "CREATED":
            raise ClientStateError(f"cannot {what}: the consumer is {self._state.lower()}")

    def start(self) -> PushConsumer:
        self._check_created("start")
        if self._listener is None:
            raise ClientStateError("register a message listener before start()")
        if not self._subscriptions:
            raise ClientStateError("subscribe to at least one topic before start()")
        self._loop.start()
        core = AsyncPushConsumer(self.settings, self._subscriptions, self._listener, orderly=self._orderly)
        try:
            self._loop.run(core.start(), timeout=self.settings.request_timeout_s * 4 + 5)
        except BaseException:
            self._loop.stop()
            self._state = "SHUTDOWN"
            raise
        self._core = core
        self._state = "RUNNING"
        return self

    def shutdown(self) -> None:
        """Graceful: queues are drained, committed and released; idempotent."""
        if self._state == "SHUTDOWN":
            return
        if self._state == "CREATED":
            self._state = "SHUTDOWN"
            return
        core, self._core = self._core, None
        try:
            self._loop.run(core.shutdown(), timeout=self.settings.drain_timeout_s + 30)
        finally:
            self._loop.stop()
            self._state = "SHUTDOWN"

    def __enter__(self) -> PushConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _require_running(self) -> AsyncPushConsumer:
        if self._core is None:
            raise ClientStateError(f"consumer is {self._state.lower()}")
        return self._core

    def suspend(self) -> None:
        """Stop pulling and stop handing messages to the listener (RocketMQ's suspend()).

        Safe from any thread, including a listener: batches not yet started wait, uncommitted, until
        resume() (or go to the queue's next owner after shutdown())."""
        self._require_running().suspended = True

    def resume(self) -> None:
        core = self._require_running()
        self._loop.call(core.resume, timeout=5)

    def owned_queues(self) -> list[MessageQueue]:
        core = self._require_running()
        return self._loop.call(core.ownership.pulling, timeout=5)

    def persist_offsets(self) -> None:
        """Commit every owned queue's progress now (normally every persist_consumer_offset_interval_s)."""
        core = self._require_running()
        self._loop.run(core.persist_offsets(), timeout=self.settings.request_timeout_s * 4)

    def stats(self) -> dict[str, int]:
        core = self._require_running()

        def collect() -> dict[str, int]:
            return {"consumed_ok": core.consume_service.consumed_ok,
                    "rebalances": core.rebalance.rebalances, "rebalance_changes": core.rebalance.changes,
                    "handovers": core.ownership.handovers, "owned_queues": len(core.ownership.pulling()),
                    "sent_back": core.send_back.sent_back, "retry_fallbacks": core.send_back.fallback_sends}
        return self._loop.call(collect, timeout=5)
