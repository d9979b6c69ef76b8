"""ConsumeMessageConcurrentlyService: listener batches on the consume threads, results back per wake-up.

A frame's messages are cut into listener batches (consume_message_batch_max_size,
1 by default) and handed to the consume threads in one go. A thread checks the
batch's lease right before calling the listener (a batch queued behind slow
ones must not run once its queue moves away, as RocketMQ's ConsumeRequest
checks isDropped) and reports back; the event loop applies everything that
finished since its last wake-up per lease: one ProcessQueue removal, one
offset update, one credit grant.

After a batch, the messages up to ack_index count as consumed; the rest are
sent back for retry (CLUSTERING) and, once the broker has them, count as
consumed too, so a failing message never blocks the queue's commit offset.
Messages that could not be sent back stay in the ProcessQueue and are consumed
again locally after local_retry_delay_s; the commit offset stays at them.

While the consumer is suspended, batches not yet started are held (not
consumed, not committed) until resume(), and a batch's failed part is held
too rather than sent back: suspending means "stop here", so what did not
succeed waits for resume() or for the queue's next owner.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from functools import partial

from tidemark.client.consumer.consume_pool import ConsumeThreadPool
from tidemark.client.consumer.fetcher import Fetcher
from tidemark.client.consumer.lease import QueueLease
from tidemark.client.consumer.listener import (
    ConsumeConcurrentlyContext,
    MessageListenerConcurrently,
    split_by_ack_index,
)
from tidemark.client.consumer.offset_store import OffsetStore
from tidemark.client.consumer.send_back import SendBackService
from tidemark.client.message import ConsumeConcurrentlyStatus, MessageExt
from tidemark.client.settings import PushConsumerSettings
from tidemark.common.logs import get_logger
from tidemark.common.protocol import PropertyKey, is_retry_topic
from tidemark.common.scheduler import TaskSet

log = get_logger("tidemark.client.consume")


def for_listener(msg: MessageExt) -> MessageExt:
    """A retried message shows its original topic to the listener (RocketMQ's resetRetryAndNamespace)."""
    if is_retry_topic(msg.topic):
        origin = msg.properties.get(PropertyKey.RETRY_TOPIC)
        if origin:
            return msg.replace(topic=origin)
    return msg


# call_listener's answer for a batch whose lease stopped counting (or the consumer was suspended)
# while it waited for a thread.
SKIPPED = object()


class _Calling(threading.local):
    """The lease whose batch this consume thread's listener call runs (None outside a call)."""

    lease: QueueLease | None = None


_calling = _Calling()


def call_listener(listener, msgs: Sequence[MessageExt], context, lease: QueueLease) -> object:
    """Run a user listener on a consume thread; anything it raises counts as a failure, like RocketMQ's
    catch of Throwable (even SystemExit: on a consume thread there is nobody else to handle it)."""
    _calling.lease = lease
    try:
        return listener(list(msgs), context)  # a copy: the listener may keep or change its list
    except BaseException:
        log.exception("listener raised, the batch will be retried",
                      event="listener_error", queue=context.message_queue, size=len(msgs))
        return None
    finally:
        _calling.lease = None


def calling_lease() -> QueueLease | None:
    """Inside a listener call: the lease of the batch that this consume thread runs (a shutdown() the
    listener makes lets go of it, see PushConsumer.shutdown); None on any other thread."""
    return _calling.lease


def forget_calling_lease() -> None:
    """The listener call's batch was let go of: a second shutdown() from it has nothing to let go."""
    _calling.lease = None


def checked_status(result: object, mq: object) -> ConsumeConcurrentlyStatus:
    """A listener's answer as a status; anything else is RECONSUME_LATER (and logged)."""
    if isinstance(result, ConsumeConcurrentlyStatus):
        return result
    if result is None:
        log.error("listener returned None; return ConsumeConcurrentlyStatus.CONSUME_SUCCESS or RECONSUME_LATER. Treating it as RECONSUME_LATER", event="listener_bad_status", queue=mq)
    else:
        log.error("listener returned %r, not a ConsumeConcurrentlyStatus; treating it as RECONSUME_LATER", result,
                  event="listener_bad_status", queue=mq)
    return ConsumeConcurrentlyStatus.RECONSUME_LATER


class ConsumeMessageConcurrentlyService:
    def __init__(self, *, listener: MessageListenerConcurrently, settings: PushConsumerSettings,
                 pool: ConsumeThreadPool, offset_store: OffsetStore, send_back: SendBackService,
                 fetcher: Fetcher, clustering: bool, suspended: Callable[[], bool]) -> None:
        self._listener = listener
        self._batch_size = settings.consume_message_batch_max_size
        self._local_retry_delay_s = settings.local_retry_delay_s
        self._pool = pool
        self._store = offset_store
        self._send_back = send_back
        self._fetcher = fetcher
        self._clustering = clustering
        self._suspended = suspended
        # Finished messages per lease since the last drain; applied in one go by apply_finished().
        self._finished: dict[QueueLease, list[MessageExt]] = {}
        # Batches not started (or failed) while suspended; resume() hands them to the listener again.
        self._held: list[tuple[QueueLease, list[MessageExt]]] = []
        self._tasks = TaskSet("consume_retry_error", "retry of failed messages failed", log)
        self.consumed_ok = 0
        self.consumed_failed = 0

    # -- loop side ---------------------------------------------------------------------------

    def submit(self, lease: QueueLease, msgs: list[MessageExt]) -> None:
        if not lease.active:
            return  # draining or ended: left in the ProcessQueue, the final commit stops before them
        size = self._batch_size
        batches = [msgs[i:i + size] for i in range(0, len(msgs), size)] if size < len(msgs) else [msgs]
        lease.running += len(batches)
        self._pool.submit([partial(self._consume, lease, batch) for batch in batches])

    def resume(self) -> None:
        held, self._held = self._held, []
        for lease, batch in held:
            self.submit(lease, batch)  # (one whose queue moved away meanwhile is left to its next owner)

    async def shutdown(self) -> None:
        self._held.clear()
        await self._tasks.close()

    def apply_finished(self) -> None:
        """After a wake-up's completions: per lease, forget the finished messages, move the offset,
        give the room back to the broker."""
        finished, self._finished = self._finished, {}
        for lease, msgs in finished.items():
            if not lease.counts or not msgs:
                continue
            offset = lease.pq.remove_messages(msgs)
            if offset >= 0:
                self._store.update_offset(lease.mq, offset, increase_only=True)
            self._fetcher.grant(lease, len(msgs), sum(m.store_size for m in msgs))

    def _done(self, lease: QueueLease, batch: list[MessageExt], result: object,
              context: ConsumeConcurrentlyContext | None) -> None:
        """One batch's outcome (loop thread)."""
        lease.batch_finished()
        if not lease.counts:
            # Released, lost or reset meanwhile: the committed offset does not include this batch, so
            # whoever reads the queue next consumes it again; a send-back would duplicate it.
            return
        if result is ConsumeConcurrentlyStatus.CONSUME_SUCCESS and context.ack_index is None:
            self.consumed_ok += len(batch)
            finished = self._finished.get(lease)
            if finished is None:
                self._finished[lease] = list(batch)
            else:
                finished.extend(batch)
            return
        if result is SKIPPED:
            # Not started. A released queue keeps it in the ProcessQueue (the final commit stops before
            # it); an active one holds it until resume(), or runs it now if resume() came meanwhile.
            if lease.active:
                if self._suspended():
                    self._held.append((lease, batch))
                else:
                    self.submit(lease, batch)
            return
        status = checked_status(result, lease.mq)
        if result is None or status is not result:
            context.ack_index = None
        ok = split_by_ack_index(len(batch), status, context.ack_index)
        self.consumed_ok += ok
        if ok:
            self._finished.setdefault(lease, []).extend(batch[:ok])
        failed = batch[ok:]
        if not failed:
            return
        self.consumed_failed += len(failed)
        if self._suspended():
            self._held.append((lease, failed))
        elif self._clustering:
            lease.batch_started()  # the send-back runs as part of the batch: a handover waits for it
            self._tasks.spawn(self._retry(lease, failed, context.delay_level_when_next_consume))
        else:
            log.warning("broadcast consumption failed, messages dropped",
                        event="broadcast_drop", queue=lease.mq, count=len(failed))
            self._finished.setdefault(lease, []).extend(failed)

    async def _retry(self, lease: QueueLease, failed: list[MessageExt], delay_level: int) -> None:
        try:
            keep = [msg for msg in failed if not await self._send_back.send_back(msg, delay_level)]
        finally:
            lease.batch_finished()
        if not lease.counts:
            return
        kept = {id(m) for m in keep}
        sent = [m for m in failed if id(m) not in kept]
        if sent:
            self._finished.setdefault(lease, []).extend(sent)
            self.apply_finished()
        if keep:
            await asyncio.sleep(self._local_retry_delay_s)
            self.submit(lease, keep)

    # -- consume threads ---------------------------------------------------------------------

    def _consume(self, lease: QueueLease, batch: list[MessageExt]):
        # A draining lease still runs what was handed out before the drain: batches run concurrently, so one
        # not started yet may lie before a later one already consumed, and skipping it left a gap: the final
        # commit stops at the skipped message and the next owner consumed the later ones again (a thread that
        # had taken a batch and lost the CPU before this check while another ran the rest of the frame:
        # test_consumer_groups' handover, 12 duplicates once in a full suite). An ended lease counts nothing.
        if not lease.counts or self._suspended():
            return partial(self._done, lease, batch, SKIPPED, None)
        context = ConsumeConcurrentlyContext(message_queue=lease.mq)
        view = [for_listener(m) for m in batch] if is_retry_topic(lease.mq.topic) else batch
        result = call_listener(self._listener, view, context, lease)
        return partial(self._done, lease, batch, result, context)
