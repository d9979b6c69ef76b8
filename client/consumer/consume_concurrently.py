"""ConsumeMessageConcurrentlyService: listener batches on a thread pool, results back on the loop.

After a batch, the messages up to ack_index count as consumed; the rest are
sent back for retry (CLUSTERING) and, once the broker has them, count as
consumed too, so a failing message never blocks the queue's commit offset.
Messages that could not be sent back stay in the ProcessQueue and are consumed
again locally after local_retry_delay_s; the commit offset stays at them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
from collections.abc import Callable, Sequence

from client.consumer.listener import (
    ConsumeConcurrentlyContext,
    MessageListenerConcurrently,
    split_by_ack_index,
)
from client.consumer.offset_store import OffsetStore
from client.consumer.queue_state import OwnedQueue
from client.consumer.send_back import SendBackService
from client.message import ConsumeConcurrentlyStatus, MessageExt, MessageModel
from client.settings import PushConsumerSettings
from tidemark.protocol import PropertyKey, is_retry_topic

log = logging.getLogger("tidemark.client.consume")


def for_listener(msg: MessageExt) -> MessageExt:
    """A retried message shows its original topic to the listener (RocketMQ's resetRetryAndNamespace)."""
    if is_retry_topic(msg.topic):
        origin = msg.properties.get(PropertyKey.RETRY_TOPIC)
        if origin:
            return dataclasses.replace(msg, topic=origin)
    return msg


# call_listener's answer for a batch whose queue was dropped or reset (or the consumer suspended)
# while it waited for a thread.
SKIPPED = object()
# How often an orderly queue task looks again while the consumer is suspended.
SUSPENDED_RETRY_S = 0.2


def call_listener(listener, msgs: Sequence[MessageExt], context, skip=None) -> object:
    """Run a user listener on a consume thread; an exception counts as a failure, like RocketMQ.

    `skip` is checked on the thread, right before the listener: a batch queued behind slow ones must
    not run once its queue is moving away (RocketMQ's ConsumeRequest.run checks isDropped there too).
    """
    if skip is not None and skip():
        return SKIPPED
    try:
        return listener(list(msgs), context)
    except Exception:
        log.exception("listener raised, the batch will be retried event=listener_error queue=%s size=%d",
                      context.message_queue, len(msgs))
        return None


class ConsumeMessageConcurrentlyService:
    def __init__(self, *, listener: MessageListenerConcurrently, settings: PushConsumerSettings,
                 executor: concurrent.futures.ThreadPoolExecutor, offset_store: OffsetStore,
                 send_back: SendBackService, suspended: Callable[[], bool] = lambda: False) -> None:
        self._listener = listener
        self._settings = settings
        self._executor = executor
        self._store = offset_store
        self._send_back = send_back
        self._suspended = suspended
        # Batches skipped while suspended; resume() hands them to the listener again.
        self._held: list[tuple[OwnedQueue, list[MessageExt], int]] = []
        self._tasks: set[asyncio.Task] = set()
        self.consumed_ok = 0
        self.consumed_failed = 0

    def submit(self, oq: OwnedQueue, msgs: list[MessageExt]) -> None:
        size = self._settings.consume_message_batch_max_size
        for i in range(0, len(msgs), size):
            self._spawn(oq, msgs[i:i + size], delay_s=0.0)

    def _spawn(self, oq: OwnedQueue, batch: list[MessageExt], delay_s: float) -> None:
        oq.begin_batch()
        task = asyncio.get_running_loop().create_task(self._consume(oq, batch, oq.epoch_of_cache, delay_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def resume(self) -> None:
        held, self._held = self._held, []
        for oq, batch, cache_epoch in held:
            if oq.pulling and oq.epoch_of_cache == cache_epoch:
                self._spawn(oq, batch, delay_s=0.0)

    async def shutdown(self) -> None:
        self._held.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _consume(self, oq: OwnedQueue, batch: list[MessageExt], cache_epoch: int, delay_s: float) -> None:
        try:
            if delay_s:
                await asyncio.sleep(delay_s)
            if oq.pq.dropped or oq.epoch_of_cache != cache_epoch:
                return  # the queue is moving away or was reset: the next owner/offset takes over
            context = ConsumeConcurrentlyContext(message_queue=oq.mq)
            view = [for_listener(m) for m in batch]
            result = await asyncio.get_running_loop().run_in_executor(
                self._executor, call_listener, self._listener, view, context,
                lambda: oq.pq.dropped or oq.epoch_of_cache != cache_epoch or self._suspended())
            if result is SKIPPED:
                if self._suspended() and not oq.pq.dropped and oq.epoch_of_cache == cache_epoch:
                    self._held.append((oq, batch, cache_epoch))  # consumed after resume()
                return  # stays in the ProcessQueue: the final commit stops before it
            if not isinstance(result, ConsumeConcurrentlyStatus):
                if result is not None:
                    log.error("listener returned %r, not a ConsumeConcurrentlyStatus; treating it as "
                              "RECONSUME_LATER event=listener_bad_status queue=%s", result, oq.mq)
                else:
                    log.error("listener returned None; return ConsumeConcurrentlyStatus.CONSUME_SUCCESS or "
                              "RECONSUME_LATER. Treating it as RECONSUME_LATER event=listener_bad_status queue=%s",
                              oq.mq)
                result, context.ack_index = ConsumeConcurrentlyStatus.RECONSUME_LATER, None
            await self._process_result(oq, batch, result, context, cache_epoch)
        finally:
            oq.end_batch()

    async def _process_result(self, oq: OwnedQueue, batch: list[MessageExt], status: ConsumeConcurrentlyStatus,
                              context: ConsumeConcurrentlyContext, cache_epoch: int) -> None:
        if not oq.accepts_results or oq.epoch_of_cache != cache_epoch:
            # The queue was released, lost or reset meanwhile: its committed offset does not include this
            # batch, so whoever reads the queue next consumes it again; a send-back would duplicate it.
            return
        ok = split_by_ack_index(len(batch), status, context.ack_index)
        failed = batch[ok:]
        self.consumed_ok += ok
        self.consumed_failed += len(failed)
        keep: list[MessageExt] = []
        if failed and self._settings.message_model is MessageModel.CLUSTERING:
            for msg in failed:
                if not await self._send_back.send_back(msg, context.delay_level_when_next_consume):
                    keep.append(msg)
        elif failed:
            log.warning("broadcast consumption failed, messages dropped event=broadcast_drop queue=%s count=%d",
                        oq.mq, len(failed))
        if not oq.accepts_results or oq.epoch_of_cache != cache_epoch:
            return
        kept = {m.queue_offset for m in keep}
        offset = oq.pq.remove_messages([m for m in batch if m.queue_offset not in kept])
        if offset >= 0:
            self._store.update_offset(oq.mq, offset, increase_only=True)
        if keep:
            self._spawn(oq, keep, delay_s=self._settings.local_retry_delay_s)
