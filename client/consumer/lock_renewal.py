"""LockRenewal: keeping the broker locks a consumer holds, and asking at once for one that lapsed.

Every lock_renew_interval_s (20 s; a broker keeps a lock 60 s by default)
the consumer renews the locks of the queues it reads or drains: one
LockQueues(renew) per broker. A queue the broker does not renew for the same
ownership (owner epoch) is lost; when the broker granted it anew instead (it
has none of the locks granted before it, its lock file lost, so the epoch is
a new one) that grant is unlocked at once, for whoever the group gives the
queue to next. Each answered renewal confirms the queue's LockHold from the
moment it was asked (lock_hold.py). An orderly queue whose hold lapsed (a
renewal late or unanswered, the process paused, its fetch stream broken)
asks for a renewal at once (`lapsed`: a task of this object's, which
QueueOwnership.stop cancels, so a consumer cut off from its broker still
shuts down), and again every LOCK_RETRY_DELAY_S, until the lock is
confirmed or the queue leaves.

A renewal can lose queues, so it runs under QueueOwnership's lock, as
rebalances and lock grants do; QueueOwnership hands over that lock, its
table of queues and the changes a renewal makes (`lose`, `quote`,
`release_stale`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from tidemark.client.consumer.lease import QueueLease
from tidemark.client.consumer.pending_unlocks import LOCK_RETRY_DELAY_S
from tidemark.client.consumer.queue_state import OwnedQueue, QueueState, by_broker
from tidemark.client.errors import TidemarkError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import TaskSet

log = get_logger("tidemark.client.ownership")


class LockRenewal:
    def __init__(self, *, cluster: BrokerCluster, group: str, client_id: str, lock: asyncio.Lock,
                 queues: dict[MessageQueue, OwnedQueue], lose: Callable[[OwnedQueue, str], None],
                 quote: Callable[[MessageQueue, int, int], int],
                 release_stale: Callable[[str, dict[MessageQueue, int]], Awaitable[None]],
                 stopping: Callable[[], bool]) -> None:
        self._cluster = cluster
        self._group = group
        self._client_id = client_id
        self._lock = lock
        self._queues = queues
        self._lose = lose
        self._quote = quote
        self._release_stale = release_stale
        self._stopping = stopping
        self._done = 0  # renewals done: callers that wanted one at the same moment need only one
        self._confirming: set[QueueLease] = set()  # leases whose lapsed lock is being confirmed
        self._tasks = TaskSet("lock_confirm_failed", "lock confirmation failed", log, group=group)

    def lapsed(self, lease: QueueLease, then: Callable[[], None]) -> None:
        """An orderly batch found the lease's lock lapsed and was put back (each of the queue's message
        groups' workers may say so): confirm the lock in the background, then call `then` (which starts the
        queue's workers again), once per lease at a time."""
        if lease not in self._confirming:
            self._confirming.add(lease)
            self._tasks.spawn(self._confirm_then(lease, then), name=f"confirm-lock:{lease.mq}")

    async def close(self) -> None:
        """Stop confirming (the consumer stops; it hands its queues back next)."""
        await self._tasks.close()

    async def _confirm_then(self, lease: QueueLease, then: Callable[[], None]) -> None:
        try:
            await self.confirm(lease)
        finally:
            self._confirming.discard(lease)
        then()

    async def renew(self) -> None:
        """Renew every held lock."""
        async with self._lock:
            await self._renew_held()

    async def confirm(self, lease: QueueLease) -> None:
        """An orderly batch found its queue's lock lapsed on this client's clock and was put back: renew the
        locks at once, and again every LOCK_RETRY_DELAY_S while the broker does not answer, until the lock
        is confirmed or the lease stops being active (the queue lost or leaving, the consumer stopping).
        Run beside the queue's batches, not in one: a handover that drains the queue under the ownership
        lock must not wait for a batch that waits for that lock."""
        hold = lease.lock
        if hold is None or not hold.lapsed():
            return
        log.info("queue lock lapsed on this client's clock; no orderly batch starts until it is renewed",
                 event="lock_lapsed", group=self._group, queue=lease.mq, owner_epoch=lease.owner_epoch)
        while lease.active and hold.lapsed() and not self._stopping():
            seen = self._done
            async with self._lock:
                if self._done == seen and lease.active:  # (else one finished while we waited: enough)
                    await self._renew_held()
            if lease.active and hold.lapsed():
                await hold.changed(LOCK_RETRY_DELAY_S)

    async def _renew_held(self) -> None:
        held = [oq for oq in self._queues.values() if oq.state in (QueueState.PULLING, QueueState.DRAINING)]
        for broker, oqs in by_broker(held).items():
            sent_at = time.monotonic()  # (the holds' clock: what the broker confirms counts from the asking)
            try:
                conn = await self._cluster.connection(broker)
                # Given up when the master moves meanwhile: it holds every other change of queues.
                grants = {g.queue: g for g in await self._cluster.moves.until(
                    broker, conn.lock_queues(self._group, self._client_id, [oq.mq for oq in oqs], renew=True))}
            except TidemarkError as e:
                log.warning("lock renewal failed",
                            event="lock_renew_failed", group=self._group, broker=broker, error=e)
                continue
            stale: dict[MessageQueue, int] = {}
            for oq in oqs:
                grant = grants.get(oq.mq)
                if grant is None or grant.owner_epoch != oq.owner_epoch:
                    self._lose(oq, "lock not renewed")
                    if grant is not None:  # granted anew, under another epoch: not the ownership we had
                        stale[oq.mq] = grant.lock_token
                else:  # (a new token when the lock had lapsed meanwhile)
                    oq.lock_token = self._quote(oq.mq, grant.owner_epoch, grant.lock_token)
                    oq.hold.confirm(sent_at, grant.lock_expiry_ms)
            await self._release_stale(broker, stale)
        self._done += 1
