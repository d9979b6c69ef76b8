"""ConsumerCore: what every consumer of a group is made of, assembled in one place.

Broker cluster, offset store (remote for CLUSTERING, a local file for
BROADCASTING), the Fetcher (one stream per broker), QueueOwnership (leases,
locks, handover), RebalanceService and GroupMembership (or a fixed
assignment), and one Scheduler with every timer. A push consumer and a lite
pull consumer differ only in the hooks they fill in, as RocketMQ's
RebalanceImpl subclasses do:

- `start_offset` (computePullFromWhere) and `commit_start_offset`;
- `deliver` (dispatchPullRequest's other half): what happens to fetched
  messages (the listener's consume threads, or poll()'s buffer);
- `drain` (removeUnnecessaryMessageQueue): what a leaving lease waits for;
- `forget`: drop what is buffered for a lease that ended.

Everything runs on the consumer's event loop; background work is owned here
(the scheduler's jobs and `spawn`ed tasks, whose failures are logged) and
stopped in order by `shutdown`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from tidemark.client.consumer.consume_from_where import compute_pull_from_where
from tidemark.client.consumer.fetcher import Fetcher, FetchLimits
from tidemark.client.consumer.lease import QueueLease
from tidemark.client.consumer.membership import GroupMembership, HeartbeatData
from tidemark.client.consumer.offset_store import (
    LocalFileOffsetStore,
    OffsetStore,
    RemoteBrokerOffsetStore,
)
from tidemark.client.consumer.ownership import QueueOwnership
from tidemark.client.consumer.queue_state import QueueState
from tidemark.client.consumer.rebalance import RebalanceService
from tidemark.client.errors import FencedError, TidemarkError
from tidemark.client.message import MessageExt, MessageModel, MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.remoting.streams import QueueEnd
from tidemark.client.selector import MessageSelector
from tidemark.client.settings import ConsumerSettings
from tidemark.client.types import CommitRejectReason, RejectedCommit
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import Scheduler, TaskSet

log = get_logger("tidemark.client.consumer")

# Before opening a queue again that the broker refused for a passing reason.
REFUSED_RETRY_DELAY_S = 3.0


class ConsumerCore:
    """The shared assembly; subclasses fill in the hooks below."""

    consume_type = "CONSUME_PASSIVELY"
    commit_start_offset = True
    orderly = False

    def __init__(self, settings: ConsumerSettings, subscriptions: dict[str, MessageSelector]) -> None:
        self.settings = settings
        self.client_id = settings.client_id
        self.subscriptions = {topic: MessageSelector.of(selector) for topic, selector in subscriptions.items()}
        self.strategy = settings.allocate_strategy
        self.clustering = settings.message_model is MessageModel.CLUSTERING
        self.scheduler = Scheduler(f"consumer:{settings.group}")
        self.membership: GroupMembership | None = None
        self._tasks = TaskSet("consumer_task_failed", "consumer task failed", log, group=settings.group)
        self._granted: dict[MessageQueue, int | None] = {}  # per queue starting: the committed offset its grant told

    # -- hooks -------------------------------------------------------------------------------

    @property
    def locking(self) -> bool:
        return self.clustering and self.settings.queue_locking

    @property
    def piggyback(self) -> bool:
        """Commits ride on credit frames (push); a lite pull consumer commits when the application says."""
        return False

    def held(self) -> bool:
        """Fetching pauses (credit is held back), e.g. while a push consumer is suspended."""
        return False

    def fetch_limits(self) -> FetchLimits:
        s = self.settings
        return FetchLimits(s.pull_threshold_for_queue, s.pull_threshold_size_for_queue, None, s.pull_batch_size)

    def deliver(self, lease: QueueLease, msgs: list[MessageExt]) -> None:
        """Fetched messages of a current lease, already in its ProcessQueue."""
        raise NotImplementedError

    async def drain(self, lease: QueueLease) -> None:
        """What a leaving lease waits for before its final commit (nothing by default)."""

    def forget(self, lease: QueueLease) -> None:
        """Drop what is buffered for a lease that ended."""

    def caught_up(self, lease: QueueLease, offset: int) -> None:
        """Nothing of the lease is left to consume and the broker read up to `offset` (past entries our
        subscription filtered out): that much counts as consumed (RocketMQ's correctTagsOffset)."""

    def assemble(self) -> None:
        """Build the kind's own parts once the shared ones exist."""

    async def finish_running(self) -> None:
        """shutdown(), before the queues are handed back: what the kind lets finish first (nothing by
        default)."""

    async def stop_parts(self) -> None:
        """Stop the kind's own parts (after queues were handed back)."""

    async def abandon_parts(self) -> None:
        """After a failed start: stop the kind's own parts without waiting for a listener call to end (the
        start may have been given up by a shutdown() a listener made)."""

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, *, assigned: set[MessageQueue] | None = None, cluster: BrokerCluster | None = None) -> None:
        """Join (or take `assigned`) and start reading. `cluster`: one already connected for these settings
        (PushConsumer.connect()), which the consumer then owns (it closes it at shutdown or a failed start)."""
        s = self.settings
        self.cluster = cluster if cluster is not None else BrokerCluster.for_settings(s)
        try:
            await self._start(assigned)
        except BaseException:
            await self._abandon()
            raise

    async def _start(self, assigned: set[MessageQueue] | None) -> None:
        s = self.settings
        user_topics = sorted(self.subscriptions)  # (assemble() may add the retry topic, created by the heartbeat)
        locking = self.locking and assigned is None
        self.offset_store: OffsetStore = (
            RemoteBrokerOffsetStore(self.cluster, s.group, self.client_id, on_rejected=self._on_rejected,
                                    require_fence=locking)
            if self.clustering else LocalFileOffsetStore(self.client_id, s.group))
        self.fetcher = Fetcher(cluster=self.cluster, group=s.group, subscription=self.subscription,
                               limits=self.fetch_limits(), sink=self,
                               offset_store=self.offset_store if self.piggyback else None, held=self.held)
        self.ownership = QueueOwnership(cluster=self.cluster, group=s.group, client_id=self.client_id,
                                        offset_store=self.offset_store, locking=locking, hooks=self,
                                        on_acquired=lambda: self.scheduler.trigger("heartbeat"))
        self.assemble()
        self._stop_moves = self.cluster.moves.listen(self._master_moved)
        sched = self.scheduler
        if assigned is None:
            self.rebalance = RebalanceService(
                cluster=self.cluster, group=s.group, client_id=self.client_id, model=s.message_model,
                strategy=self.strategy, ownership=self.ownership, topics=lambda: sorted(self.subscriptions),
                on_change=lambda: sched.trigger("heartbeat"), on_not_member=lambda: sched.trigger("heartbeat"),
                known_members=lambda broker: self.membership.members(broker), on_allocated=self._open_ahead)
            self.membership = GroupMembership(cluster=self.cluster, group=s.group, client_id=self.client_id,
                                              data=self._heartbeat_data, on_change=self._members_changed)
            # Jobs are registered before the first heartbeat opens the watch: a membership push arriving
            # while start() runs then wakes the rebalance job as soon as the scheduler starts.
            sched.every("heartbeat", s.heartbeat_interval_s, self.membership.heartbeat)
            sched.every("rebalance", s.rebalance_interval_s, self.rebalance.do_rebalance)
            if self.ownership.locking:
                sched.every("renew-locks", s.lock_renew_interval_s, self.ownership.renew_locks)
        self.schedule_commits(sched)
        # Side by side: the brokers' names and the routes (asked together on the connections being made;
        # NotFoundError for an unknown topic), then the first heartbeat, which
        # is the join (the group's members hear of this client and start handing queues over; the broker
        # creates the group's config and retry topic, so it goes only once every topic is known to exist);
        # meanwhile the offsets file. A start that fails after the heartbeat leaves the group again
        # (_abandon).
        # The join leaves first: after connect() the routes are known (no call, no loop turn), and the
        # fetch streams are opened only once the heartbeat is answered. Opened beside it, as they were, their
        # setup went ahead of the heartbeat in this loop (it left 1.3 ms after start() on an idle machine,
        # 0.8 now) and, opened just after it, their setup delayed its handling at the broker
        # (docs/benchmarks.md, "Fifth pass"). They are still open before any queue is ours (the first
        # rebalance follows): the first lock grant's queue is read with one frame on a stream already there.
        async def routes_then_join() -> None:
            if not all(self.cluster.route_known(topic) for topic in user_topics):
                await asyncio.gather(*(self.cluster.route(topic) for topic in user_topics))
            if assigned is None:
                await self.membership.heartbeat()
            await self.fetcher.prepare()

        steps = [routes_then_join(), self.cluster.discover(), self.offset_store.load()]
        for outcome in await asyncio.gather(*steps, return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
        if assigned is None:
            # The first rebalance finishes inside start(): when start() returns, start offsets are fixed.
            # Routes were just read and the heartbeat answered with the members: no need to ask again.
            await self.rebalance.do_rebalance(fast=True)
        else:
            await self.assign(assigned)
        await sched.start()

    async def _abandon(self) -> None:
        """After a failed start: leave the group if the heartbeat went out and may have joined it (its
        members would hand queues over to a client that never reads them, until it expires; a client that
        never sent it has nothing to leave, and asking brokers that did not answer would only wait again),
        close what was opened."""
        # Each step whatever the one before did (a leave cut short by a second cancel, a close that raised):
        # a step skipped leaves its streams or threads behind.
        try:
            if self.membership is not None and self.membership.joined:
                try:
                    await self.membership.leave()
                except TidemarkError as e:
                    log.warning("leaving the group after a failed start failed",
                                event="consumer_start_abandon_failed", group=self.settings.group, error=e)
        finally:
            try:
                fetcher = getattr(self, "fetcher", None)
                if fetcher is not None:
                    await fetcher.close()
            finally:
                try:
                    await self.abandon_parts()
                finally:
                    await self.cluster.close()

    def _master_moved(self, broker: str, address: str) -> None:
        """Another address serves a broker name (an elected master): the fetcher moves its streams by
        itself; the group's membership moves too, and the new master hears of this client at once (its
        member list, its locks and its commits start empty), instead of at the next heartbeat and
        rebalance (heartbeat_interval_s, rebalance_interval_s)."""
        if self.membership is not None:
            self.membership.moved(broker)
            self.scheduler.trigger("heartbeat")
            self.scheduler.trigger("rebalance")

    def _open_ahead(self, topic: str, mine: set[MessageQueue]) -> None:
        """With locks, the queues of a topic's share that this client is about to lock (or still asks for)
        are opened on the fetch streams ahead: the broker starts each the moment its lock is ours, and the
        first records of a handover come with the grant (fetcher.py)."""
        if self.ownership.locking:
            self.fetcher.open_ahead(topic, {mq for mq in mine if (oq := self.ownership.get(mq)) is None
                                            or oq.state is QueueState.LOCKING}, self.client_id)

    def _members_changed(self) -> None:
        self.rebalance.members_changed()
        self.scheduler.trigger("rebalance")

    def schedule_commits(self, sched: Scheduler) -> None:
        sched.every("persist-offsets", self.settings.persist_consumer_offset_interval_s, self.persist_offsets)

    async def assign(self, queues: set[MessageQueue]) -> None:
        """A fixed assignment (no group coordination): exactly these queues."""
        topics = {mq.topic for mq in queues} | self.ownership.topics()  # with kept progress to drop
        for topic in sorted(topics):
            await self.ownership.update(topic, {mq for mq in queues if mq.topic == topic})

    async def persist_offsets(self) -> None:
        await self.offset_store.persist_all(self.ownership.assigned())

    async def shutdown(self) -> None:
        """Stop the timers, hand every queue back (drain, commit, unlock), leave the group, close."""
        self._stop_moves()
        await self.scheduler.stop()
        await self._tasks.wait()
        await self.ownership.stop()
        await self.finish_running()
        await self.ownership.release_all()
        if not self.clustering:
            await self.offset_store.persist_all(self.offset_store.clone_offset_table())
        if self.membership is not None:
            await self.membership.leave()
        await self.stop_parts()
        await self.fetcher.close()
        await self.cluster.close()
        log.info("consumer stopped", event="consumer_stop", group=self.settings.group, client_id=self.client_id)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        """Run background work owned by the consumer: failures are logged, shutdown waits for it."""
        self._tasks.spawn(coro, name)

    # -- OwnershipHooks ----------------------------------------------------------------------

    def subscription(self, topic: str) -> MessageSelector:
        return self.subscriptions.get(topic) or MessageSelector.by_tag("*")

    async def start_offset(self, mq: MessageQueue, committed: int | None) -> int:
        s = self.settings
        self._granted[mq] = committed  # (for lease_started: whether the broker starts a handle opened ahead)
        return await compute_pull_from_where(mq, where=s.consume_from_where,
                                             consume_timestamp_ms=s.consume_timestamp_ms,
                                             offset_store=self.offset_store, cluster=self.cluster,
                                             committed=committed)

    async def lease_started(self, lease: QueueLease) -> None:
        # A handle opened ahead is started by the broker at the committed offset the grant told, if any: a
        # lease that starts elsewhere (kept progress, consume_from_where) opens its queue at once.
        committed = self._granted.pop(lease.mq, None)
        await self.fetcher.start(lease, lease.start_offset,
                                 ahead=committed is not None and committed == lease.start_offset)

    async def lease_draining(self, lease: QueueLease) -> None:
        self.fetcher.stop(lease)
        await self.drain(lease)

    def lease_ended(self, lease: QueueLease) -> None:
        self.fetcher.stop(lease)
        self.forget(lease)

    def queue_lost(self, mq: MessageQueue) -> None:
        # Re-register (a restarted broker forgot us) and rebalance now rather than at the next timer.
        self.scheduler.trigger("heartbeat")
        self.scheduler.trigger("rebalance")

    # -- FetchSink ---------------------------------------------------------------------------

    def on_messages(self, lease: QueueLease, msgs: list[MessageExt], next_offset: int) -> None:
        pq = lease.pq
        if msgs:
            pq.put_messages(msgs)
        pq.advance_to(next_offset)
        if msgs:
            self.deliver(lease, msgs)
        elif pq.msg_count == 0:
            self.caught_up(lease, pq.next_offset)

    def on_ended(self, lease: QueueLease, end: QueueEnd) -> None:
        mq = lease.mq
        if end.status == "OFFSET_ILLEGAL":
            log.warning("pull offset illegal", event="offset_illegal", queue=mq, next=end.next_offset)
            self.spawn(self.ownership.restart(lease, end.next_offset, lease.reset_generation, record=True),
                       f"restart:{mq}")
        elif end.status == "OFFSET_RESET":
            log.info("offset reset by admin",
                     event="offset_reset_seen", queue=mq, offset=end.next_offset, generation=end.reset_generation)
            self.spawn(self.ownership.restart(lease, end.next_offset, end.reset_generation, record=True),
                       f"restart:{mq}")
        elif isinstance(end.error, FencedError):
            self.ownership.lose_lease(lease, f"fetch fenced: {end.error}")
        else:
            log.warning("broker refused to serve a queue, retrying",
                        event="fetch_refused", queue=mq, error=end.error)
            if end.error is not None and end.error.retriable:
                self.cluster.suspect(mq.broker_name)  # e.g. not the master any more: the retry may go elsewhere
            self.fetcher.retry(lease, REFUSED_RETRY_DELAY_S)

    # -- helpers -----------------------------------------------------------------------------

    def _heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(
            subscriptions=tuple(sorted((topic, selector.expression, selector.expression_type)
                                       for topic, selector in self.subscriptions.items())),
            message_model=self.settings.message_model.value,
            consume_type=self.consume_type,
            orderly=self.orderly,
            owned_queues=tuple(self.ownership.pulling()),
            allocate_strategy=self.strategy.name,
        )

    def _on_rejected(self, rejection: RejectedCommit) -> None:
        if rejection.reason is CommitRejectReason.FENCED:
            self.spawn(self.ownership.lose(rejection.queue, f"commit fenced: {rejection.message}"),
                       f"lose:{rejection.queue}")
