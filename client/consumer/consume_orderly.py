"""ConsumeMessageOrderlyService: a lease's messages in order per message group, under the queue's lock.

A queue is consumed only while this client holds its broker lock: its lease
is ACTIVE and its LockHold has not lapsed (lock_hold.py). A consume thread
that finds the lock unconfirmed for half the broker's expiry (it may have
passed to another member) puts the batch back; the queue's workers end, and
`on_lock_lapsed` has the lock renewed, then resume() starts them again.
Within the queue, order is kept per message group (RocketMQ 5 FIFO;
message_groups.py has the rule): each group with messages waiting has one
worker task taking its batches in offset order, and workers of different
groups run side by side on the consume threads. Messages without a group form
one group per queue, so a queue of them is consumed as before: one task,
strictly in offset order.

SUSPEND_CURRENT_QUEUE_A_MOMENT puts the batch back and the group's worker
tries it again after the suspend time, with reconsume_times increased: only
that group waits, the others keep flowing. When max_reconsume_times is set
(>= 0) and reached, the batch goes to the DLQ and its group moves on
(RocketMQ's default for orderly is to retry forever). The committed offset is
the lease's ProcessQueue's smallest unfinished offset, so it never passes a
message of a waiting group.

While the consumer is suspended, a worker puts its batch back and ends;
resume() starts workers again. Every worker is supervised: if one dies of an
unexpected error, `on_death` drops the queue's lease (the consumer
re-acquires it through rebalance).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tidemark.client.consumer.consume_concurrently import SKIPPED, call_listener, for_listener
from tidemark.client.consumer.consume_pool import ConsumeThreadPool
from tidemark.client.consumer.fetcher import Fetcher
from tidemark.client.consumer.lease import QueueLease
from tidemark.client.consumer.listener import ConsumeOrderlyContext, MessageListenerOrderly
from tidemark.client.consumer.message_groups import MessageGroups
from tidemark.client.consumer.offset_store import OffsetStore
from tidemark.client.consumer.send_back import SendBackService
from tidemark.client.message import ConsumeOrderlyStatus, MessageExt
from tidemark.client.settings import PushConsumerSettings
from tidemark.common.logs import get_logger
from tidemark.common.protocol import is_retry_topic

log = get_logger("tidemark.client.consume")

# A consume thread's answer instead of the listener's: the queue's lock may have expired on the broker.
LAPSED = object()


class ConsumeMessageOrderlyService:
    def __init__(self, *, listener: MessageListenerOrderly, settings: PushConsumerSettings,
                 pool: ConsumeThreadPool, offset_store: OffsetStore, send_back: SendBackService, fetcher: Fetcher,
                 suspended: Callable[[], bool], on_death: Callable[[QueueLease, BaseException], None],
                 on_lock_lapsed: Callable[[QueueLease], None]) -> None:
        self._listener = listener
        self._settings = settings
        self._pool = pool
        self._store = offset_store
        self._send_back = send_back
        self._fetcher = fetcher
        self._suspended = suspended
        self._on_death = on_death
        # Has the lease's lapsed lock renewed, then calls resume() (beside the queue's workers, which end).
        self._on_lock_lapsed = on_lock_lapsed
        self._groups: dict[QueueLease, MessageGroups] = {}
        self._running: dict[tuple[QueueLease, str], asyncio.Task] = {}  # one worker per (lease, group)
        self.consumed_ok = 0
        self.consumed_failed = 0  # messages of batches that asked to suspend their group (tried again)
        self.dead_lettered = 0

    def submit(self, lease: QueueLease, msgs: list[MessageExt]) -> None:
        """The lease's messages are in its ProcessQueue already: queue them by group, start the workers
        of groups that had none."""
        if not lease.active:
            return
        groups = self._groups.get(lease)
        if groups is None:
            # A lease that stopped with no worker running left its entry: forget those now.
            for old in [old for old, g in self._groups.items() if not old.active and not g.busy]:
                del self._groups[old]
            groups = self._groups[lease] = MessageGroups()
        for group in groups.add(msgs):
            self._start(lease, group)

    def resume(self) -> None:
        """Workers put their batch back and ended while the consumer was suspended, or while their queue's
        lock was lapsed: start them again (those of queues whose lock is still lapsed wait for its renewal)."""
        for lease, groups in list(self._groups.items()):
            if lease.active and not _lapsed(lease):
                for group in groups.unclaimed():
                    self._start(lease, group)

    def apply_finished(self) -> None:
        """Orderly results are applied by each group's worker as it goes."""

    async def shutdown(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _start(self, lease: QueueLease, group: str) -> None:
        lease.batch_started()
        task = asyncio.get_running_loop().create_task(self._consume_group(lease, group),
                                                      name=f"consume-orderly:{lease.mq}:{group}")
        self._running[(lease, group)] = task
        task.add_done_callback(lambda t: self._task_done(lease, group, t))

    def _task_done(self, lease: QueueLease, group: str, task: asyncio.Task) -> None:
        del self._running[(lease, group)]
        lease.batch_finished()
        groups = self._groups.get(lease)
        waiting = groups is not None and groups.stop(group)
        if groups is not None and not lease.active and not groups.busy:
            del self._groups[lease]  # its last worker: nothing of this lease is consumed any more
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.error("orderly consume task died",
                      event="consume_task_died", queue=lease.mq, group=group, exc_info=error)
            self._on_death(lease, error)
        elif waiting and lease.active and not self._suspended() and not _lapsed(lease) and groups.claim(group):
            # Messages arrived after its last take, or it skipped its batch while the consumer was suspended.
            self._start(lease, group)

    def _call(self, lease: QueueLease, batch: list[MessageExt], context: ConsumeOrderlyContext) -> object:
        """On a consume thread: skip when the lease stopped being active or the consumer is suspended, hold
        back when the queue's lock may have expired on the broker."""
        if not lease.active or self._suspended():
            return SKIPPED
        if _lapsed(lease):
            return LAPSED
        view = [for_listener(m) for m in batch] if is_retry_topic(lease.mq.topic) else batch
        return call_listener(self._listener, view, context, lease)

    async def _consume_group(self, lease: QueueLease, group: str) -> None:
        """One group's worker: its batches in offset order until it has none waiting."""
        groups = self._groups[lease]
        while lease.active:
            batch = groups.take(group, self._settings.consume_message_batch_max_size)
            if not batch:
                return
            context = ConsumeOrderlyContext(message_queue=lease.mq)
            status = await self._pool.run(lambda b=batch, c=context: self._call(lease, b, c))
            if status is SKIPPED:
                groups.put_back(group, batch)
                if lease.active and not self._suspended():
                    continue  # resumed while the batch waited for a thread
                return
            if status is LAPSED:
                groups.put_back(group, batch)
                self._on_lock_lapsed(lease)
                return
            if not lease.counts:
                return
            if status is ConsumeOrderlyStatus.SUCCESS:
                self._finish(lease, batch, consumed=len(batch))
                continue
            if not isinstance(status, ConsumeOrderlyStatus):
                log.error("orderly listener returned %r; treating it as SUSPEND_CURRENT_QUEUE_A_MOMENT", status,
                          event="listener_bad_status", queue=lease.mq)
            if await self._exhausted(batch):
                self.dead_lettered += len(batch)
                if not lease.counts:
                    return
                self._finish(lease, batch, consumed=0)
                continue
            self.consumed_failed += len(batch)
            groups.put_back(group, [m.replace(reconsume_times=m.reconsume_times + 1) for m in batch])
            suspend_ms = context.suspend_current_queue_time_ms or self._settings.suspend_current_queue_time_ms
            await asyncio.sleep(suspend_ms / 1000)

    def _finish(self, lease: QueueLease, batch: list[MessageExt], consumed: int) -> None:
        """A batch consumed or dead-lettered: the queue may commit up to its smallest unfinished offset."""
        offset = lease.pq.remove_messages(batch)
        self.consumed_ok += consumed
        if offset >= 0:
            self._store.update_offset(lease.mq, offset, increase_only=True)
        self._fetcher.grant(lease, len(batch), sum(m.store_size for m in batch))
    async def _exhausted(self, batch: list[MessageExt]) -> bool:
        """Past max reconsume times: move the batch to the DLQ (True once the broker has all of it)."""
        limit = self._settings.max_reconsume_times
        if limit < 0 or any(m.reconsume_times < limit for m in batch):
            return False
        for msg in batch:
            if not await self._send_back.send_back(msg, delay_level=-1):
                return False
        log.warning("orderly messages moved to DLQ",
                    event="orderly_dlq", queue=batch[0].message_queue, count=len(batch))
        return True


def _lapsed(lease: QueueLease) -> bool:
    return lease.lock is not None and lease.lock.lapsed()
