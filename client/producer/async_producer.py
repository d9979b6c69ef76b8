"""AsyncProducer: the producer's asyncio core, on the client's loop thread.

It holds the routes, the Produce streams and the RecordAccumulator's sender, and
applies the sending rules once for every entry point of the blocking `Producer`
(producer.py): routing (round-robin, a selector, a message group's queue),
retries on another broker's queue, and the idempotent producer's sequences
(up to max_in_flight_per_queue batches of a queue in flight, in sequence order;
a batch whose answer was lost goes again with the same sequence,
docs/exactly-once.md).
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Sequence
from typing import Any

from tidemark.client.errors import (
    BrokerUnreachableError,
    ClientStateError,
    InternalError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    SequenceGapError,
    TidemarkError,
    UnknownProducerError,
)
from tidemark.client.message import Message, MessageQueue, SendResult
from tidemark.client.producer.accumulator import ProducerBatch, RecordAccumulator
from tidemark.client.producer.attempts import Doubt, Outcome, Tries, back_off, outcome_of, pause
from tidemark.client.producer.selector import MessageQueueSelector
from tidemark.client.producer.sequences import ProducerSequences, Slot
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.settings import ProducerSettings
from tidemark.common.logs import get_logger
from tidemark.common.protocol import (
    MessageIdGenerator,
    PropertyKey,
)

log = get_logger("tidemark.client.producer")


class AsyncProducer:
    """The asyncio core: routes, streams, the sender of accumulated batches. Use `Producer` from sync code."""

    def __init__(self, settings: ProducerSettings) -> None:
        self.settings = settings
        self._cluster: BrokerCluster | None = None
        self._ids = MessageIdGenerator()
        self._next = 0
        self.sequences = ProducerSequences(settings.producer_key, settings.producer_epoch,
                                           settings.max_in_flight_per_queue) if settings.enable_idempotence else None
        self._inflight: set[asyncio.Task] = set()
        self._busy: collections.Counter[str] = collections.Counter()  # accumulated batches in flight, by broker
        self._wakeup: asyncio.Event | None = None
        self._sender: asyncio.Task | None = None
        self.accumulator: RecordAccumulator | None = None
        # Back-pressure for send_async/send_oneway: beyond this many unanswered messages, callers wait.
        # Taken per message by the caller, given back per batch when its answer came.
        self.slots = threading.Semaphore(settings.max_async_in_flight)

    async def start(self) -> None:
        s = self.settings
        self._cluster = await BrokerCluster.connect(s)
        loop = asyncio.get_running_loop()
        wakeup = self._wakeup = asyncio.Event()
        self.accumulator = RecordAccumulator(batch_size=s.batch_size, linger_s=s.linger_ms / 1000,
                                             born_host=s.client_ip, max_batch_bytes=s.max_message_size,
                                             wake=lambda: loop.call_soon_threadsafe(wakeup.set), busy=self._busy)
        self._sender = loop.create_task(self._send_accumulated(), name="producer-sender")

    async def shutdown(self, timeout_s: float) -> None:
        """Send what is still accumulated (bounded by timeout_s), then close the connections."""
        if self.accumulator is not None:
            pending = self.accumulator.close()
            for batch in pending:
                self._spawn(batch)
        if self._inflight:
            done, late = await asyncio.wait(self._inflight, timeout=timeout_s)
            for task in late:
                task.cancel()
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        if self._cluster is not None:
            await self._cluster.close()
            self._cluster = None

    @property
    def cluster(self) -> BrokerCluster:
        if self._cluster is None:
            raise ClientStateError("producer is not started")
        return self._cluster

    # -- record batches ----------------------------------------------------------------------

    async def send_records(self, topic: str, data: bytes, msg_ids: Sequence[str], *,
                           queue: MessageQueue | None, selector: MessageQueueSelector | None, arg: Any,
                           first: Message | None, timeout: float | None,
                           prefer: MessageQueue | None = None) -> list[SendResult]:
        """Send one encoded batch to one queue, retrying retriable failures; results per message."""
        target, offset = await self.send_encoded(topic, data, len(msg_ids), queue=queue, selector=selector, arg=arg,
                                                 first=first, timeout=timeout, prefer=prefer)
        return [SendResult(msg_id, target, offset + i if offset >= 0 else -1) for i, msg_id in enumerate(msg_ids)]

    async def send_encoded(self, topic: str, data: bytes | memoryview, count: int, *,
                           queue: MessageQueue | None, selector: MessageQueueSelector | None, arg: Any,
                           first: Message | None, timeout: float | None,
                           prefer: MessageQueue | None = None) -> tuple[MessageQueue, int]:
        """Send `count` encoded records to one queue, retrying retriable failures: the queue and the first
        offset (-1: a duplicate older than the broker remembers).

        `queue` pins every attempt to one queue; `prefer` is only the first attempt's (an accumulated
        batch's sticky queue), retries then avoid its broker like any unpinned send."""
        timeout = timeout or self.settings.send_msg_timeout_s
        attempts = 1 + self.settings.retry_times_when_send_failed
        avoid = None
        tries = Tries(attempts)
        deadline = time.monotonic() + timeout  # waiting for a writable queue takes at most one timeout
        doubt = Doubt()
        in_doubt_at: tuple[str, TidemarkError] | None = None  # a sequenced attempt there may have stored it
        while True:
            try:
                target = queue or (prefer if tries.made == 0 and prefer is not None else
                                   await self._select(topic, first, selector, arg, avoid=avoid, deadline=deadline))
            except TidemarkError as e:
                doubt.raise_final(e)
            if in_doubt_at is not None and target.broker_name == in_doubt_at[0]:
                # Its queue started a new epoch when the batch left it: any queue of that broker name (its
                # promoted replica holds the batch if the master did) would store it a second time. The
                # application gets the doubt ("may have been stored") instead.
                doubt.raise_final(doubt.first or in_doubt_at[1])
            try:
                if self.sequences is None:
                    tries.made += 1
                    conn = await self.cluster.master_connection(target.broker_name)
                    offset = await conn.produce_stream().send(topic, target.queue_id, count, data, timeout)
                else:
                    offset = await self._send_sequenced(target, data, count, timeout, tries, doubt,
                                                        deadline, pinned=queue is not None or selector is not None)
                return target, offset
            except TidemarkError as e:
                doubt.saw(e)
                if e.retriable:
                    self.cluster.suspect(target.broker_name)
                if not e.retriable or tries.spent:
                    doubt.raise_final(e)
                avoid = target.broker_name
                if self.sequences is not None and outcome_of(e) is Outcome.UNKNOWN:
                    in_doubt_at = (target.broker_name, e)
                self.cluster.forget_route(topic)
                await back_off(e, tries.made - 1)
                log.warning("send failed, retrying",
                            event="send_retry", topic=topic, broker=target.broker_name, attempt=tries.made,
                            error=e)

    async def _send_sequenced(self, target: MessageQueue, data: bytes, count: int, timeout: float,
                              tries: Tries, doubt: Doubt, deadline: float, *, pinned: bool = False) -> int:
        """An idempotent producer's send to one queue (counting its attempts in `tries`): the first offset.

        Up to max_in_flight_per_queue batches of a queue are on their way at once, in sequence order
        (sequences.py has the rules). Retries that may find the batch already stored (a timeout, an
        overloaded broker, a reset mid-call, the only broker restarting) go to the same queue with the
        same numbers, after every earlier batch of the queue is settled, so the broker answers the second
        as a duplicate. A broker that went away while others serve the topic raises: the caller moves the
        batch to another broker's queue, where it is stored twice if the first broker had kept it.
        Whenever the batch leaves this queue after an attempt that may have been stored, the queue starts
        a new epoch (a sequence never carries two different batches)."""
        sequences = self.sequences
        state = sequences.queue(target)
        slot: Slot | None = None
        stored = False
        try:
            while True:
                tries.made += 1
                if slot is not None:
                    await state.turn(slot)
                try:
                    conn = await self.cluster.master_connection(target.broker_name)
                    producer_id = await sequences.producer_id(
                        target.broker_name, lambda key, conn=conn: conn.init_producer(key, target.topic))
                    if slot is None:
                        slot = await state.admit(count, producer_id)
                    elif not slot.doubt and state.stale(slot, producer_id):
                        state.renumber(slot, producer_id)
                    # No await between numbering and this write: batches reach the stream in sequence order.
                    offset = await conn.produce_stream().send(target.topic, target.queue_id, count, data, timeout,
                                                              sequence=slot.numbers)
                except (SequenceGapError, ProducerFencedError) as e:
                    if slot is None:
                        raise
                    if isinstance(e, ProducerFencedError) and not state.stale(slot, slot.producer_id):
                        raise  # a newer producer with our key writes the queue: refused, nothing stored
                    # Not stored under these numbers. Ours to recover from unless the batch was the oldest
                    # of its queue with current numbers: then the broker lost the queue's state.
                    lost = isinstance(e, SequenceGapError) and state.head(slot) and not state.stale(slot, producer_id)
                    state.failed(slot, doubt=False)
                    if lost:
                        if tries.spent:
                            raise
                        state.new_epoch()
                    else:
                        tries.made -= 1  # its turn had not come: not an attempt of its own
                    continue
                except OutOfOrderSequenceError:
                    if slot is None:
                        raise
                    state.failed(slot, doubt=False)  # nothing was stored; the broker holds no usable sequence
                    if tries.spent:
                        raise
                    state.new_epoch()
                    continue
                except UnknownProducerError:
                    if slot is None:
                        raise
                    state.failed(slot, doubt=False)
                    if tries.spent:
                        raise
                    sequences.forget_broker(target.broker_name, producer_id)
                    continue
                except BaseException as e:
                    if outcome_of(e) is Outcome.REFUSED:
                        raise  # nothing stored by this attempt (the caller knows of earlier ones)
                    if slot is not None:
                        state.failed(slot, doubt=True)
                    if isinstance(e, TidemarkError):
                        doubt.saw(e)
                        if e.retriable:
                            self.cluster.suspect(target.broker_name)
                    if not await self._same_sequence_again(e, target, tries, deadline, pinned):
                        raise
                    await pause(tries.made)
                    continue
                stored = True
                return offset
        finally:
            if slot is not None:
                state.settle(slot, stored=stored)

    async def _same_sequence_again(self, error: BaseException, target: MessageQueue, tries: Tries,
                                   deadline: float, pinned: bool) -> bool:
        """Whether a send whose outcome is unknown goes to the same queue again (with the same sequence):
        a retriable error or an internal one, while attempts remain. A broker that cannot be reached (no
        connection, or its master failed over) is left for another broker name that takes writes
        (availability first: stored twice if the first had it), unless the send is pinned to its queue
        (an explicit queue, a selector's key), which would come back to it under a new sequence. Otherwise
        (another queue of the same broker name would store it twice for nothing) the batch waits, until
        `deadline`, for its broker to come back or its replica to be promoted (then the retriable
        UnavailableError of a topic with no writable queue)."""
        if not isinstance(error, TidemarkError) or tries.spent:
            return False
        if not (error.retriable or isinstance(error, InternalError)):
            return False
        if not (isinstance(error, BrokerUnreachableError) or self.cluster.is_down(target.broker_name)):
            return True  # a call cut off mid-way, a timeout, an overload: the broker is there
        if not pinned and await self._elsewhere(target):
            return False
        queues = await self.cluster.await_write_queues(target.topic, deadline)
        return any(q.broker_name == target.broker_name for q in queues)

    async def _elsewhere(self, target: MessageQueue) -> bool:
        """Whether another broker has a writable queue of the target's topic."""
        try:
            return any(q.broker_name != target.broker_name for q in await self.cluster.write_queues(target.topic))
        except TidemarkError:
            return False

    async def send_messages(self, messages: Sequence[Message], *, queue: MessageQueue | None,
                            selector: MessageQueueSelector | None, arg: Any,
                            timeout: float | None) -> list[SendResult]:
        """The unary SendMessage path: delayed messages and retry topics (the broker rewrites those)."""
        topic = messages[0].topic
        messages = [self._with_id(m) for m in messages]
        timeout = timeout or self.settings.send_msg_timeout_s
        attempts = 1 + self.settings.retry_times_when_send_failed
        avoid = None
        deadline = time.monotonic() + timeout  # waiting for a writable queue takes at most one timeout
        doubt = Doubt()
        for attempt in range(attempts):
            try:
                target = queue or await self._select(topic, messages[0], selector, arg, avoid=avoid,
                                                     deadline=deadline)
            except TidemarkError as e:
                doubt.raise_final(e)
            try:
                conn = await self.cluster.master_connection(target.broker_name)
                return await conn.send(topic, messages, queue_id=target.queue_id, born_host=self.settings.client_ip,
                                       timeout=timeout)
            except TidemarkError as e:
                doubt.saw(e)
                if not e.retriable or attempt == attempts - 1:
                    doubt.raise_final(e)
                avoid = target.broker_name
                self.cluster.forget_route(topic)
                await back_off(e, attempt)
        raise AssertionError("unreachable")

    def _with_id(self, message: Message) -> Message:
        if message.properties.get(PropertyKey.UNIQ_KEY):
            return message
        props = {**message.properties, PropertyKey.UNIQ_KEY: self._ids.next()}
        return Message(topic=message.topic, body=message.body, tags=message.tags, keys=message.keys,
                       properties=props, delay_level=message.delay_level, flag=message.flag)

    async def _select(self, topic: str, message: Message | None, selector: MessageQueueSelector | None, arg: Any,
                      avoid: str | None, deadline: float) -> MessageQueue:
        """A writable queue of the topic. While it has none (its master down, a promotion under way) the
        route is asked for again at once and then a few times a second until `deadline`: a retriable
        UnavailableError then, not an input error."""
        mqs = await self.cluster.await_write_queues(topic, deadline)
        if selector is not None:
            return selector.select(mqs, message, arg)
        candidates = [q for q in mqs if q.broker_name != avoid] or mqs
        self._next += 1
        return candidates[self._next % len(candidates)]

    # -- the sender of accumulated batches ---------------------------------------------------

    async def _send_accumulated(self) -> None:
        accumulator, wakeup = self.accumulator, self._wakeup
        limit, busy = self.settings.max_in_flight_requests, self._busy
        while True:
            wakeup.clear()
            free = limit - len(self._inflight)
            if free > 0:
                for batch in accumulator.drain(free, busy):
                    self._spawn(batch)
            delay = accumulator.next_ready_in(busy) if len(self._inflight) < limit else None
            if delay == 0:
                continue
            if delay is None:
                await wakeup.wait()
            else:
                try:
                    async with asyncio.timeout(delay):
                        await wakeup.wait()
                except TimeoutError:
                    pass

    def _spawn(self, batch: ProducerBatch) -> None:
        task = asyncio.get_running_loop().create_task(self._send_batch(batch))
        self._inflight.add(task)
        broker = batch.mq.broker_name
        self._busy[broker] += 1
        task.add_done_callback(lambda t: self._sent(t, broker))

    def _sent(self, task: asyncio.Task, broker: str) -> None:
        self._inflight.discard(task)
        self._busy[broker] -= 1
        if not self._busy[broker]:
            del self._busy[broker]
        if self._wakeup is not None:
            self._wakeup.set()

    async def _send_batch(self, batch: ProducerBatch) -> None:
        # Slots go back before the callbacks run: a callback may send again (and must find room).
        try:
            results = await self.send_records(
                batch.mq.topic, bytes(batch.builder.buffer), batch.msg_ids, queue=None if batch.sticky else batch.mq,
                selector=None, arg=None, first=None, timeout=None, prefer=batch.mq)
        except asyncio.CancelledError:
            self.slots.release(batch.count)
            batch.finish(None, ClientStateError("the producer shut down before the message was sent"))
            raise
        except Exception as e:
            self.slots.release(batch.count)
            batch.finish(None, e)
            return
        self.slots.release(batch.count)
        batch.finish(results)
