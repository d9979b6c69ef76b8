"""ConsumeMessageOrderlyService: one consume task per lease, messages strictly in offset order.

A queue is consumed only while this client holds its broker lock (its lease
is ACTIVE). SUSPEND_CURRENT_QUEUE_A_MOMENT puts the batch back and retries it
after the suspend time, with reconsume_times increased; when
max_reconsume_times is set (>= 0) and reached, the batch goes to the DLQ and
the queue moves on (RocketMQ's default for orderly is to retry forever).

The task is supervised: if it dies of an unexpected error, `on_death` drops
the queue's lease (the consumer re-acquires it through rebalance).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tidemark.client.consumer.consume_concurrently import SKIPPED, call_listener, for_listener
from tidemark.client.consumer.consume_pool import ConsumeThreadPool
from tidemark.client.consumer.fetcher import Fetcher
from tidemark.client.consumer.lease import QueueLease
from tidemark.client.consumer.listener import ConsumeOrderlyContext, MessageListenerOrderly
from tidemark.client.consumer.offset_store import OffsetStore
from tidemark.client.consumer.send_back import SendBackService
from tidemark.client.message import ConsumeOrderlyStatus, MessageExt
from tidemark.client.settings import PushConsumerSettings
from tidemark.common.logs import get_logger
from tidemark.common.protocol import is_retry_topic

log = get_logger("tidemark.client.consume")

# How often a lease's task looks again while the consumer is suspended.
SUSPENDED_RETRY_S = 0.2


class ConsumeMessageOrderlyService:
    def __init__(self, *, listener: MessageListenerOrderly, settings: PushConsumerSettings,
                 pool: ConsumeThreadPool, offset_store: OffsetStore, send_back: SendBackService, fetcher: Fetcher,
                 suspended: Callable[[], bool], on_death: Callable[[QueueLease, BaseException], None]) -> None:
        self._listener = listener
        self._settings = settings
        self._pool = pool
        self._store = offset_store
        self._send_back = send_back
        self._fetcher = fetcher
        self._suspended = suspended
        self._on_death = on_death
        self._running: dict[QueueLease, asyncio.Task] = {}
        self.consumed_ok = 0
        self.consumed_failed = 0  # messages of batches that asked to suspend the queue (tried again)
        self.dead_lettered = 0

    def submit(self, lease: QueueLease, msgs: list[MessageExt]) -> None:
        """The lease's messages are in its ProcessQueue already; make sure its task runs."""
        if lease in self._running or not lease.active:
            return  # the running task picks the new messages up; one task per lease
        lease.batch_started()
        task = asyncio.get_running_loop().create_task(self._consume_queue(lease), name=f"consume-orderly:{lease.mq}")
        self._running[lease] = task
        task.add_done_callback(lambda t: self._task_done(lease, t))

    def resume(self) -> None:
        """Nothing is held: each lease's task waits while the consumer is suspended."""

    def apply_finished(self) -> None:
        """Orderly results are applied by each lease's task as it goes."""

    async def shutdown(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _task_done(self, lease: QueueLease, task: asyncio.Task) -> None:
        self._running.pop(lease, None)
        lease.batch_finished()
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.error("orderly consume task died", event="consume_task_died", queue=lease.mq, exc_info=error)
            self._on_death(lease, error)
        elif lease.active and lease.pq.has_temp_message():
            # Messages arrived while the task was finishing: nobody else will start consuming them.
            self.submit(lease, [])

    def _call(self, lease: QueueLease, batch: list[MessageExt], context: ConsumeOrderlyContext) -> object:
        """On a consume thread: skip when the lease stopped being active or the consumer is suspended."""
        if not lease.active or self._suspended():
            return SKIPPED
        view = [for_listener(m) for m in batch] if is_retry_topic(lease.mq.topic) else batch
        return call_listener(self._listener, view, context)

    async def _consume_queue(self, lease: QueueLease) -> None:
        pq = lease.pq
        while lease.active:
            batch = pq.take_messages(self._settings.consume_message_batch_max_size)
            if not batch:
                return
            context = ConsumeOrderlyContext(message_queue=lease.mq)
            status = await self._pool.run(lambda b=batch, c=context: self._call(lease, b, c))
            if status is SKIPPED:
                pq.make_messages_consume_again(batch)
                if self._suspended() and lease.active:
                    await asyncio.sleep(SUSPENDED_RETRY_S)
                    continue
                return
            if not lease.counts:
                return
            if status is ConsumeOrderlyStatus.SUCCESS:
                self._commit(lease, batch, consumed=len(batch))
                continue
            if not isinstance(status, ConsumeOrderlyStatus):
                log.error("orderly listener returned %r; treating it as SUSPEND_CURRENT_QUEUE_A_MOMENT", status,
                          event="listener_bad_status", queue=lease.mq)
            if await self._exhausted(batch):
                self.dead_lettered += len(batch)
                if not lease.counts:
                    return
                self._commit(lease, batch, consumed=0)
                continue
            self.consumed_failed += len(batch)
            pq.make_messages_consume_again([m.replace(reconsume_times=m.reconsume_times + 1) for m in batch])
            suspend_ms = context.suspend_current_queue_time_ms or self._settings.suspend_current_queue_time_ms
            await asyncio.sleep(suspend_ms / 1000)

    def _commit(self, lease: QueueLease, batch: list[MessageExt], consumed: int) -> None:
        offset = lease.pq.commit()
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
