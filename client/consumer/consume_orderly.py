"""ConsumeMessageOrderlyService: one consume task per queue, messages strictly in offset order.

A queue is consumed only while this client holds its broker lock (the queue is
PULLING in QueueOwnership). SUSPEND_CURRENT_QUEUE_A_MOMENT puts the batch back
and retries it after the suspend time, with reconsume_times increased; when
max_reconsume_times is set (>= 0) and reached, the batch goes to the DLQ and
the queue moves on (RocketMQ's default for orderly is to retry forever).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
from collections.abc import Callable

from client.consumer.consume_concurrently import (
    SKIPPED,
    SUSPENDED_RETRY_S,
    call_listener,
    for_listener,
)
from client.consumer.listener import ConsumeOrderlyContext, MessageListenerOrderly
from client.consumer.offset_store import OffsetStore
from client.consumer.queue_state import OwnedQueue
from client.consumer.send_back import SendBackService
from client.message import ConsumeOrderlyStatus, MessageExt
from client.settings import PushConsumerSettings

log = logging.getLogger("tidemark.client.consume")


class ConsumeMessageOrderlyService:
    def __init__(self, *, listener: MessageListenerOrderly, settings: PushConsumerSettings,
                 executor: concurrent.futures.ThreadPoolExecutor, offset_store: OffsetStore,
                 send_back: SendBackService, suspended: Callable[[], bool] = lambda: False) -> None:
        self._listener = listener
        self._settings = settings
        self._executor = executor
        self._store = offset_store
        self._send_back = send_back
        self._suspended = suspended
        self._running: dict[OwnedQueue, asyncio.Task] = {}
        self.consumed_ok = 0
        self.suspended = 0
        self.dead_lettered = 0

    def submit(self, oq: OwnedQueue, msgs: list[MessageExt]) -> None:
        if oq in self._running:
            return  # the running task picks the new messages up; one task per queue
        oq.begin_batch()
        task = asyncio.get_running_loop().create_task(self._consume_queue(oq, oq.epoch_of_cache),
                                                      name=f"consume-orderly:{oq.mq}")
        self._running[oq] = task

    def resume(self) -> None:
        """Nothing is held: each queue's task waits while the consumer is suspended."""

    async def shutdown(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _consume_queue(self, oq: OwnedQueue, cache_epoch: int) -> None:
        try:
            while oq.pulling and oq.epoch_of_cache == cache_epoch:
                batch = oq.pq.take_messages(self._settings.consume_message_batch_max_size)
                if not batch:
                    break
                context = ConsumeOrderlyContext(message_queue=oq.mq)
                status = await asyncio.get_running_loop().run_in_executor(
                    self._executor, call_listener, self._listener, [for_listener(m) for m in batch], context,
                    lambda: not oq.pulling or oq.epoch_of_cache != cache_epoch or self._suspended())
                if status is SKIPPED:
                    oq.pq.make_messages_consume_again(batch)
                    if self._suspended() and oq.pulling:
                        await asyncio.sleep(SUSPENDED_RETRY_S)
                        continue
                    return
                if not oq.accepts_results or oq.epoch_of_cache != cache_epoch:
                    return
                if status is ConsumeOrderlyStatus.SUCCESS:
                    self._commit(oq, len(batch))
                    continue
                if not isinstance(status, ConsumeOrderlyStatus):
                    log.error("orderly listener returned %r; treating it as SUSPEND_CURRENT_QUEUE_A_MOMENT "
                              "event=listener_bad_status queue=%s", status, oq.mq)
                if await self._exhausted(batch):
                    self.dead_lettered += len(batch)
                    if not oq.accepts_results or oq.epoch_of_cache != cache_epoch:
                        return
                    self._commit(oq, 0)
                    continue
                self.suspended += 1
                oq.pq.make_messages_consume_again(
                    [dataclasses.replace(m, reconsume_times=m.reconsume_times + 1) for m in batch])
                suspend_ms = context.suspend_current_queue_time_ms or self._settings.suspend_current_queue_time_ms
                await asyncio.sleep(suspend_ms / 1000)
        finally:
            self._running.pop(oq, None)
            oq.end_batch()
            # Also after a reset (new cache epoch): the re-pulled messages were dispatched while this
            # task still ran, so nobody else will start consuming them.
            if oq.pulling and oq.pq.msg_count:
                self.submit(oq, [])

    def _commit(self, oq: OwnedQueue, consumed: int) -> None:
        offset = oq.pq.commit()
        self.consumed_ok += consumed
        if offset >= 0:
            self._store.update_offset(oq.mq, offset, increase_only=True)

    async def _exhausted(self, batch: list[MessageExt]) -> bool:
        """Past max reconsume times: move the batch to the DLQ (True once the broker has all of it)."""
        limit = self._settings.max_reconsume_times
        if limit < 0 or any(m.reconsume_times < limit for m in batch):
            return False
        for msg in batch:
            if not await self._send_back.send_back(msg, delay_level=-1):
                return False
        log.warning("orderly messages moved to DLQ event=orderly_dlq queue=%s count=%d", batch[0].message_queue,
                    len(batch))
        return True
