"""RecordAccumulator: send_async/send_oneway messages gathered into per-queue batches (Kafka's idea).

The caller's thread encodes each message once, into the batch of its queue,
under one lock; the producer's event loop drains batches and sends each as one
Produce request. Nothing crosses threads per message: the loop is woken only
when a batch is full or when the first message arrives while the sender sleeps.

A batch is ready when it holds batch_size bytes, or once it is linger_ms old
(0: at once) and no earlier request to its broker is unanswered: Nagle's
rule, natural batching. At low load every message leaves at once, one round
trip; under load the messages that arrive while a request is on its way
leave together when its answer comes, so batches grow with the load and the
cost per message (a request and an answer on each side, a delivery) falls
instead of the machine running out of CPU on one-message requests. Full
batches do not wait: up to max_in_flight_requests travel together.
Messages without a queue or selector stick to one queue of their
topic until its batch is drained, then move to the next queue (Kafka's sticky
partitioner): big batches without giving up the spread over queues.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

from tidemark.client.message import MessageQueue, SendResult
from tidemark.common.logs import get_logger
from tidemark.common.records import HEADER_SIZE, RecordBatchBuilder

# What one record adds besides body and properties: its header, topic and born host (both bounded).
_RECORD_ROOM = HEADER_SIZE + 512
log = get_logger("tidemark.client.producer")

SendCallback = Callable[[SendResult | None, Exception | None], None]
_PENDING, _RUNNING, _FINISHED = "PENDING", "RUNNING", "FINISHED"  # concurrent.futures' state names


class SendFuture(concurrent.futures.Future):
    """A concurrent.futures.Future that shares its batch's condition.

    A Future makes a Condition (and an RLock) of its own, which costs more than
    encoding a small message; one per batch does the same job: the batch's
    results are set under one acquisition, which wakes every waiter of the batch,
    and each re-checks its own future. `resolve` mirrors Future.set_result /
    set_exception field for field (the class's fields have been stable since
    concurrent.futures appeared).
    """

    def __init__(self, condition: threading.Condition) -> None:  # noqa: D107 - same fields as Future's
        self._condition = condition
        self._state = _PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks = []

    @staticmethod
    def resolve(condition: threading.Condition, futures: Sequence[SendFuture], results: Sequence[object] | None,
                error: BaseException | None = None) -> None:
        """Finish every future of a batch: with its result, or all with `error` (cancelled ones stay)."""
        finished = []
        with condition:
            for i, future in enumerate(futures):
                if future._state is not _PENDING and future._state is not _RUNNING:
                    continue
                if error is None:
                    future._result = results[i]
                    for waiter in future._waiters:
                        waiter.add_result(future)
                else:
                    future._exception = error
                    for waiter in future._waiters:
                        waiter.add_exception(future)
                future._state = _FINISHED
                if future._done_callbacks:
                    finished.append(future)
            condition.notify_all()
        for future in finished:
            future._invoke_callbacks()


@dataclass(eq=False)
class ProducerBatch:
    """Encoded records of one queue and what waits on each of them."""

    mq: MessageQueue
    builder: RecordBatchBuilder
    created: float
    sticky: bool  # the queue was the producer's choice, so a retry may use another one
    msg_ids: list[str] = field(default_factory=list)
    futures: list[SendFuture] = field(default_factory=list)
    # send_async callbacks, called straight from the sender (not through the futures' callbacks).
    callbacks: list[tuple[int, SendCallback]] = field(default_factory=list)
    condition: threading.Condition = field(default_factory=threading.Condition)

    def finish(self, results: Sequence[SendResult] | None, error: BaseException | None = None) -> None:
        """Hand every message its result (or the batch's error): futures first, then callbacks."""
        SendFuture.resolve(self.condition, self.futures, results, error)
        for index, callback in self.callbacks:
            try:
                if error is None:
                    callback(results[index], None)
                else:
                    callback(None, error)
            except Exception:
                log.exception("send callback raised", event="send_callback_error")

    @property
    def count(self) -> int:
        return self.builder.count

    @property
    def size(self) -> int:
        return len(self.builder.buffer)


class RecordAccumulator:
    def __init__(self, *, batch_size: int, linger_s: float, born_host: str, wake: Callable[[], None],
                 max_batch_bytes: int = 4 * 1024 * 1024, clock: Callable[[], float] = time.monotonic,
                 busy: Container[str] = ()) -> None:
        self._batch_size = batch_size
        # An open batch this big leaves even while its broker has a request in flight: under a heavy load
        # requests keep pipelining (max_in_flight_requests) instead of waiting for answers one at a time.
        self._busy_size = max(1, batch_size // 16)
        # A batch never grows past this (the broker's max_message_size: RocketMQ's limit on a batch).
        self._max_batch_bytes = max_batch_bytes
        self._linger_s = linger_s
        self._born_host = born_host
        self._wake = wake  # thread-safe: asks the sender to look at the accumulator
        # The brokers with a request of the sender's in flight (its own view, read from the caller's thread):
        # their new batches wait for that answer, which wakes the sender anyway.
        self._busy = busy
        self._clock = clock
        self._lock = threading.Lock()
        self._open: dict[MessageQueue, ProducerBatch] = {}
        self._full: list[ProducerBatch] = []
        self._sticky: dict[str, int] = {}
        self._wake_pending = False
        self._closed = False

    def append(self, queues: Sequence[MessageQueue], mq: MessageQueue | None, body: bytes, properties: bytes,
               *, msg_id: str, tags_code: int, flag: int, callback: SendCallback | None = None) -> SendFuture:
        """Add one encoded message and return its future; mq None: the topic's sticky queue among `queues`
        (sorted, non-empty)."""
        now = self._clock()
        with self._lock:
            if self._closed:
                raise RuntimeError("the producer is shut down")
            sticky = mq is None
            if sticky:
                topic = queues[0].topic
                mq = queues[self._sticky.get(topic, 0) % len(queues)]
            batch = self._open.get(mq)
            if batch is not None and batch.size + len(body) + len(properties) + _RECORD_ROOM > self._max_batch_bytes:
                self._seal(mq, batch)  # the message would take the batch past the limit: it starts the next
                if sticky:
                    mq = queues[self._sticky.get(topic, 0) % len(queues)]
                batch = self._open.get(mq)
            if batch is None:
                batch = self._open[mq] = ProducerBatch(mq, RecordBatchBuilder(mq.topic, self._born_host), now,
                                                       sticky)
            before = batch.size
            batch.builder.append(body, properties, tags_code=tags_code, flag=flag,
                                 born_timestamp=time.time_ns() // 1_000_000)
            future = SendFuture(batch.condition)
            if callback is not None:
                batch.callbacks.append((len(batch.futures), callback))
            batch.msg_ids.append(msg_id)
            batch.futures.append(future)
            wake = False
            if batch.size >= self._batch_size:
                self._seal(mq, batch)
                wake = True
            elif before < self._busy_size <= batch.size:
                wake = True  # big enough to leave while its broker has a request in flight
            elif batch.count == 1:
                # A new batch: the sender sends it now (linger 0) or arms its linger timer. Not while its
                # broker has a request in flight: the batch gathers messages until the answer, whose arrival
                # wakes the sender (a wake-up now would find it waiting: at 5,000 msg/s, a hop to the loop
                # thread for nothing with almost every batch). The check comes after the batch is in place,
                # and the sender marks the broker idle before it drains: either the drain after the answer
                # finds this batch, or this check finds the broker idle and wakes the sender.
                wake = mq.broker_name not in self._busy
            if wake and not self._wake_pending:
                self._wake_pending = True
            else:
                wake = False
        if wake:
            self._wake()
        return future

    def _seal(self, mq: MessageQueue, batch: ProducerBatch) -> None:
        del self._open[mq]
        self._full.append(batch)
        self._advance(batch)

    def _advance(self, batch: ProducerBatch) -> None:
        """A sticky queue's batch left: the topic's next messages go to the next queue."""
        if batch.sticky:
            topic = batch.mq.topic
            self._sticky[topic] = self._sticky.get(topic, 0) + 1

    def drain(self, limit: int, busy: Container[str] = ()) -> list[ProducerBatch]:
        """Up to `limit` ready batches, oldest full ones first (loop thread). `busy`: the broker names with
        a request in flight, whose open batches go on gathering messages."""
        now = self._clock()
        with self._lock:
            self._wake_pending = False
            out = self._full[:limit]
            del self._full[:limit]
            if len(out) < limit:
                for mq, batch in list(self._open.items()):
                    if len(out) >= limit:
                        break
                    if now - batch.created >= self._linger_s and (mq.broker_name not in busy
                                                                  or batch.size >= self._busy_size):
                        del self._open[mq]
                        self._advance(batch)
                        out.append(batch)
            return out

    def next_ready_in(self, busy: Container[str] = ()) -> float | None:
        """Seconds until the oldest open batch of an idle broker is ready (0: ready now); None when none is
        pending (a batch waiting for its broker's answer is woken by it)."""
        with self._lock:
            if self._full:
                return 0.0
            created = [b.created for mq, b in self._open.items()
                       if mq.broker_name not in busy or b.size >= self._busy_size]
            if not created:
                return None
            return max(0.0, min(created) + self._linger_s - self._clock())

    def close(self) -> list[ProducerBatch]:
        """Refuse new messages and hand back every pending batch."""
        with self._lock:
            self._closed = True
            out = self._full + list(self._open.values())
            self._full, self._open = [], {}
            return out
