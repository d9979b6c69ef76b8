"""QueueOwnership: which queues this consumer works on, and how they change hands.

Zero-duplicate handover (CLUSTERING with queue_locking, the default):
- a queue that arrives is pulled only after this client holds its broker lock,
  starting from the committed offset read *after* the lock was granted (the
  previous owner committed before releasing, so that offset is fresh);
- a queue that leaves stops pulling, lets in-flight batches finish (bounded by
  drain_timeout_s), commits synchronously with its owner epoch, then unlocks.
These remove both causes of duplicates in seed 001: two owners pulling at once,
and a new owner reading an offset the old one had not committed yet.

RocketMQ-style (queue_locking=False): no locks; a leaving queue is dropped at
once and its offset persisted without waiting for in-flight messages.

All changes go through one asyncio.Lock, so rebalances, lock retries and
renewals never interleave; per-queue state changes go through
OwnedQueue.transition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from client.consumer.offset_store import OffsetStore, RemoteBrokerOffsetStore
from client.consumer.queue_state import OwnedQueue, QueueState
from client.errors import FencedError, TidemarkError
from client.message import MessageQueue
from client.remoting.cluster import BrokerCluster

log = logging.getLogger("tidemark.client.ownership")

StartOffset = Callable[[MessageQueue], Awaitable[int]]
StartPulling = Callable[[OwnedQueue], asyncio.Task]
OnLost = Callable[[MessageQueue], None]


class QueueOwnership:
    def __init__(self, *, cluster: BrokerCluster, group: str, client_id: str, offset_store: OffsetStore,
                 locking: bool, drain_timeout_s: float, start_offset: StartOffset,
                 start_pulling: StartPulling, on_lost: OnLost = lambda mq: None,
                 commit_start_offset: bool = True) -> None:
        self._cluster = cluster
        self._group = group
        self._client_id = client_id
        self._store = offset_store
        self.locking = locking
        self._drain_timeout = drain_timeout_s
        self._start_offset = start_offset
        self._start_pulling = start_pulling
        # Called when ownership was taken away, so the consumer rebalances (and re-locks) at once.
        self._on_lost = on_lost
        # Record the computed start as the queue's progress, so a group that owned a queue and consumed
        # nothing from it resumes there instead of re-applying consume_from_where (LAST_OFFSET would
        # skip what arrived meanwhile). The lite pull consumer commits only what the application does.
        self._commit_start = commit_start_offset
        self._queues: dict[MessageQueue, OwnedQueue] = {}
        self._lock = asyncio.Lock()
        self.handovers = 0

    # -- views -----------------------------------------------------------------

    def get(self, mq: MessageQueue) -> OwnedQueue | None:
        return self._queues.get(mq)

    def queues(self, topic: str | None = None) -> list[OwnedQueue]:
        return [oq for mq, oq in self._queues.items() if topic is None or mq.topic == topic]

    def assigned(self, topic: str | None = None) -> set[MessageQueue]:
        """Queues this client has taken on (in any state but released/lost)."""
        return {oq.mq for oq in self.queues(topic)}

    def pulling(self) -> list[MessageQueue]:
        return sorted(oq.mq for oq in self._queues.values() if oq.state is QueueState.PULLING)

    # -- changes ---------------------------------------------------------------

    async def update(self, topic: str, target: set[MessageQueue]) -> bool:
        """Make the queues of a topic equal to target; True if anything changed."""
        async with self._lock:
            current = {mq for mq in self._queues if mq.topic == topic}
            removed, added = current - target, target - current
            if removed:
                await asyncio.gather(*(self._release(self._queues[mq]) for mq in sorted(removed)))
            for mq in sorted(added):
                self._queues[mq] = OwnedQueue(mq)
            if added:
                await self._acquire([self._queues[mq] for mq in sorted(added)])
            return bool(removed or added)

    async def retry_locks(self) -> None:
        """Try again to lock queues whose previous owner had not released them yet."""
        async with self._lock:
            waiting = [oq for oq in self._queues.values() if oq.state is QueueState.LOCKING]
            if waiting:
                await self._lock_and_start(waiting)

    async def renew_locks(self) -> None:
        """Renew every held lock; a queue whose lock was not renewed is lost."""
        if not self.locking:
            return
        async with self._lock:
            held = [oq for oq in self._queues.values() if oq.state in (QueueState.PULLING, QueueState.DRAINING)]
            for broker, oqs in _by_broker(held).items():
                try:
                    conn = await self._cluster.connection(broker)
                    grants = {g.queue: g for g in await conn.lock_queues(self._group, self._client_id,
                                                                          [oq.mq for oq in oqs])}
                except TidemarkError as e:
                    log.warning("lock renewal failed event=lock_renew_failed group=%s broker=%s error=%s",
                                self._group, broker, e)
                    continue
                for oq in oqs:
                    grant = grants.get(oq.mq)
                    if grant is None or grant.owner_epoch != oq.owner_epoch:
                        self._lose(oq, "lock not renewed")

    async def lose(self, mq: MessageQueue, reason: str) -> None:
        async with self._lock:
            oq = self._queues.get(mq)
            if oq is not None:
                self._lose(oq, reason)

    async def release_all(self) -> None:
        """Hand every queue back; also completes releases a cancelled rebalance had started."""
        async with self._lock:
            await asyncio.gather(*(self._release(oq) for oq in list(self._queues.values())))

    # -- internals -------------------------------------------------------------

    async def _acquire(self, oqs: list[OwnedQueue]) -> None:
        if self.locking:
            for oq in oqs:
                oq.transition(QueueState.LOCKING)
            await self._lock_and_start(oqs)
        else:
            for oq in oqs:
                await self._start(oq)

    async def _lock_and_start(self, oqs: Iterable[OwnedQueue]) -> None:
        for broker, group in _by_broker(list(oqs)).items():
            try:
                conn = await self._cluster.connection(broker)
                grants = await conn.lock_queues(self._group, self._client_id, [oq.mq for oq in group])
            except TidemarkError as e:
                log.warning("queue lock failed event=lock_failed group=%s broker=%s error=%s", self._group, broker, e)
                continue
            by_mq = {g.queue: g for g in grants}
            granted = []
            for oq in group:
                grant = by_mq.get(oq.mq)
                if grant is None:
                    continue
                oq.owner_epoch = grant.owner_epoch
                log.info("queue lock granted event=lock_grant group=%s queue=%s owner_epoch=%d",
                         self._group, oq.mq, grant.owner_epoch)
                granted.append(oq)
            # Each start reads the queue's committed offset: do them concurrently.
            await asyncio.gather(*(self._start(oq) for oq in granted))

    async def _start(self, oq: OwnedQueue) -> None:
        self._store.remove_offset(oq.mq)  # RocketMQ's removeDirtyOffset: never trust a stale local value
        # Fence first: the entry the offset read creates must never be committed without the epoch.
        self._store.set_fence(oq.mq, owner_epoch=oq.owner_epoch, reset_generation=None)
        try:
            offset = await self._start_offset(oq.mq)
        except TidemarkError as e:
            log.warning("cannot read start offset event=start_offset_failed group=%s queue=%s error=%s",
                        self._group, oq.mq, e)
            if oq.state is QueueState.ASSIGNED:
                # Without locks there is nothing to wait for: try again at the next rebalance.
                oq.transition(QueueState.RELEASED)
                del self._queues[oq.mq]
            return
        oq.next_offset = offset
        if self._commit_start and self._store.read_memory(oq.mq) < 0:
            self._store.update_offset(oq.mq, offset, increase_only=False)
        if isinstance(self._store, RemoteBrokerOffsetStore):
            oq.reset_generation = self._store.generation(oq.mq)
        self._store.set_fence(oq.mq, owner_epoch=oq.owner_epoch, reset_generation=oq.reset_generation)
        oq.transition(QueueState.PULLING)
        oq.pull_task = self._start_pulling(oq)

    async def _release(self, oq: OwnedQueue) -> None:
        if oq.state in (QueueState.ASSIGNED, QueueState.LOCKING):
            had_lock = oq.owner_epoch is not None
            oq.transition(QueueState.RELEASED)
            self._forget(oq)
            if had_lock:  # granted, but starting failed: do not leave the next owner waiting for expiry
                await self._unlock(oq)
            return
        if oq.state is QueueState.PULLING:
            oq.transition(QueueState.DRAINING)
            oq.release_task = asyncio.get_running_loop().create_task(self._finish_release(oq),
                                                                     name=f"release:{oq.mq}")
        if oq.release_task is not None:
            await asyncio.shield(oq.release_task)

    async def _unlock(self, oq: OwnedQueue) -> None:
        try:
            conn = await self._cluster.connection(oq.mq.broker_name)
            await conn.unlock_queues(self._group, self._client_id, [oq.mq])
        except TidemarkError as e:
            log.warning("unlock failed event=unlock_failed group=%s queue=%s error=%s", self._group, oq.mq, e)

    async def _finish_release(self, oq: OwnedQueue) -> None:
        """DRAINING -> RELEASED: stop pulling, drain, commit, unlock."""
        await _cancel(oq.pull_task)
        oq.pull_task = None
        if not self.locking:
            # RocketMQ-style: persist what is known now; in-flight messages are not waited for.
            await self._persist_quietly(oq)
            if oq.state is QueueState.DRAINING:
                oq.transition(QueueState.RELEASED)
                self._forget(oq)
            return
        try:
            await asyncio.wait_for(oq.idle.wait(), self._drain_timeout)
        except TimeoutError:
            log.warning("drain timed out event=drain_timeout group=%s queue=%s inflight=%d",
                        self._group, oq.mq, oq.inflight)
        if oq.state is not QueueState.DRAINING:
            return  # lost meanwhile (lock renewal failed): nothing of ours to commit
        try:
            await self._store.persist(oq.mq)
        except FencedError as e:
            self._lose(oq, f"final commit fenced: {e}")
            return
        except TidemarkError as e:
            log.warning("final commit failed event=final_commit_failed group=%s queue=%s error=%s",
                        self._group, oq.mq, e)
        if oq.state is not QueueState.DRAINING:
            return
        await self._unlock(oq)
        if oq.state is QueueState.DRAINING:
            oq.transition(QueueState.RELEASED)
            self.handovers += 1
            self._forget(oq)

    async def _persist_quietly(self, oq: OwnedQueue) -> None:
        try:
            await self._store.persist(oq.mq)
        except TidemarkError as e:
            log.warning("offset persist on drop failed event=drop_persist_failed group=%s queue=%s error=%s",
                        self._group, oq.mq, e)

    def _lose(self, oq: OwnedQueue, reason: str) -> None:
        if oq.state in (QueueState.RELEASED, QueueState.LOST):
            return
        log.warning("queue ownership lost event=queue_lost group=%s queue=%s owner_epoch=%s reason=%s",
                    self._group, oq.mq, oq.owner_epoch, reason)
        oq.transition(QueueState.LOST)
        if oq.pull_task is not None:
            oq.pull_task.cancel()
            oq.pull_task = None
        self._forget(oq)
        self._on_lost(oq.mq)

    def _forget(self, oq: OwnedQueue) -> None:
        self._store.remove_offset(oq.mq)
        if self._queues.get(oq.mq) is oq:
            del self._queues[oq.mq]


def _by_broker(oqs: list[OwnedQueue]) -> dict[str, list[OwnedQueue]]:
    out: dict[str, list[OwnedQueue]] = {}
    for oq in oqs:
        out.setdefault(oq.mq.broker_name, []).append(oq)
    return out


async def _cancel(task: asyncio.Task | None) -> None:
    if task is None or task.done():
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
