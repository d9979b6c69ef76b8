"""Producer: send (sync), send_async, send_oneway, batches, queue selectors and retries.

Every message is encoded once, in the caller's thread, in the store's record
layout (tidemark.common.records), and travels to the broker inside a record batch on
the connection's Produce stream. send/send_batch send their batch at once and
wait; send_async/send_oneway go through the RecordAccumulator, which gathers
messages per queue (linger_ms, batch_size) while up to max_in_flight_requests
batches are on their way.

Without a selector, sync sends use the topic's queues round-robin and async
sends stick to one queue per batch; a retriable failure is retried (default
twice) on a queue of another broker when there is one, as RocketMQ's producer
does. With a selector, an explicit queue or a message group (ordered messages:
a group's queue is picked by its hash) retries stay on that queue. Delayed messages and sends to retry
topics take the unary SendMessage path: the broker rewrites those.

This module is the blocking face (the caller's thread: checks, encoding, the hand-off to the loop);
async_producer.py is the asyncio core on the loop thread, where the sending rules live.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from tidemark.client import tracing
from tidemark.client.errors import (
    ClientStateError,
    InvalidArgumentError,
    TidemarkError,
)
from tidemark.client.message import Message, MessageQueue, SendResult
from tidemark.client.namespacing import Names
from tidemark.client.producer.accumulator import SendCallback
from tidemark.client.producer.async_producer import AsyncProducer
from tidemark.client.producer.encoding import (
    call_back,
    check_batch_size,
    check_message,
    encode_message,
    needs_unary,
)
from tidemark.client.producer.selector import MessageQueueSelector, route_by_group
from tidemark.client.runtime import BlockingClient, ClientState, Lifecycle, LoopThread
from tidemark.client.settings import ProducerSettings, build
from tidemark.common.logs import get_logger
from tidemark.common.protocol import (
    MessageIdGenerator,
)
from tidemark.common.records import RecordBatchBuilder

log = get_logger("tidemark.client.producer")


class Producer(BlockingClient):
    """Synchronous producer. `Producer(brokers="h:p")` or `Producer(ProducerSettings(...))`; a context manager."""

    def __init__(self, settings: ProducerSettings | None = None, /, **overrides: Any) -> None:
        self.settings: ProducerSettings = build(ProducerSettings, settings, overrides)  # type: ignore[assignment]
        self._core = AsyncProducer(self.settings)
        self._loop = LoopThread("producer")
        self._life = Lifecycle("producer")
        self._ids = MessageIdGenerator()
        self._names = Names(self.settings.namespace)  # application names in, bare names out
        self._checked_topics: set[str] = set()
        self._routes: dict[str, tuple[float, list[MessageQueue]]] = {}

    def start(self) -> Producer:
        """Find the brokers (through the name servers when set) and start the sender of send_async's
        batches; returns self (RocketMQ's DefaultMQProducer.start()). A no-op while running.

        When no broker can be reached the discovery's error is raised (a retriable UnavailableError, or
        the refusal itself: credentials, TLS), or RequestTimeoutError after 2 * request_timeout_s. The
        producer is then shut down: like start() after shutdown(), starting it again is a
        ClientStateError, and a new Producer is needed."""
        if self._life.state is ClientState.RUNNING:
            return self
        self._start_core(self._core.start, timeout=self.settings.request_timeout_s * 2)
        return self

    def shutdown(self) -> None:
        """Sends what send_async/send_oneway still hold (bounded by send_msg_timeout_s), then closes."""
        self._stop_core()

    def _core_stop(self) -> tuple[Callable[[], Coroutine[Any, Any, Any]], float]:
        wait = self.settings.send_msg_timeout_s
        return (lambda: self._core.shutdown(wait)), wait + self.settings.request_timeout_s + 5

    def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues on every broker, sorted."""
        self._life.require(ClientState.RUNNING, action="fetch queues")
        return self._names.bare_queues(self._loop.run(self._core.cluster.write_queues(self._names.topic(topic),
                                                                                      refresh=True),
                                                      timeout=self.settings.request_timeout_s * 2))

    def fetch_publish_message_queue(self, topic: str, queue_id: int) -> MessageQueue:
        """The writable queue `queue_id` of the topic (of the first broker holding one): InvalidArgumentError
        when the topic has no such queue, a retriable UnavailableError when it has but takes no writes now
        (its master is down or being replaced)."""
        self._life.require(ClientState.RUNNING, action="fetch queues")
        return self._names.bare_queue(self._loop.run(self._core.cluster.write_queue(self._names.topic(topic), queue_id),
                                                     timeout=self.settings.request_timeout_s * 2))

    # -- sending -----------------------------------------------------------------------------

    def send(self, message: Message, *, queue: MessageQueue | None = None,
             selector: MessageQueueSelector | None = None, arg: Any = None,
             timeout: float | None = None) -> SendResult:
        """Send one message and wait for the broker's answer."""
        return self.send_batch([message], queue=queue, selector=selector, arg=arg, timeout=timeout)[0]

    def send_batch(self, messages: Sequence[Message], *, queue: MessageQueue | None = None,
                   selector: MessageQueueSelector | None = None, arg: Any = None,
                   timeout: float | None = None) -> list[SendResult]:
        """Send messages of one topic as one batch: one queue, consecutive offsets."""
        if tracing.ENABLED:
            return tracing.send_traced(self._send_batch, messages, self.settings, queue=queue, selector=selector,
                                       arg=arg, timeout=timeout)
        return self._send_batch(messages, queue=queue, selector=selector, arg=arg, timeout=timeout)

    def _send_batch(self, messages: Sequence[Message], *, queue: MessageQueue | None,
                    selector: MessageQueueSelector | None, arg: Any, timeout: float | None) -> list[SendResult]:
        self._life.require(ClientState.RUNNING, action="send")
        if not messages:
            raise InvalidArgumentError("a batch needs at least one message")
        names = self._names
        messages, queue = [names.message(m) for m in messages], names.queue(queue)
        topic = messages[0].topic
        for m in messages:
            self._check(m)
            if m.topic != topic:
                raise InvalidArgumentError(f"all messages of a batch must share a topic ({topic!r} vs {m.topic!r})")
        selector = route_by_group(messages, queue, selector)
        s = self.settings
        # Every attempt, and the wait for a writable queue during a failover (one more timeout at most).
        wait = (timeout or s.send_msg_timeout_s) * (2 + s.retry_times_when_send_failed) + 1
        if needs_unary(messages[0]):
            if len(messages) > 1 and any(m.delay_level for m in messages):
                raise InvalidArgumentError("delayed messages cannot be sent in a batch")
            check_batch_size(sum(len(m.body) for m in messages), len(messages), s.max_message_size)
            return [names.bare_result(r) for r in self._loop.run(self._core.send_messages(
                messages, queue=queue, selector=selector, arg=arg, timeout=timeout), timeout=wait)]
        builder = RecordBatchBuilder(topic, s.client_ip)
        msg_ids = []
        now = time.time_ns() // 1_000_000
        for m in messages:
            msg_id, props, tags_code = encode_message(m, self._ids)
            builder.append(m.body, props, tags_code=tags_code, flag=m.flag, born_timestamp=now)
            msg_ids.append(msg_id)
        check_batch_size(len(builder.buffer), len(messages), s.max_message_size)
        return [names.bare_result(r) for r in self._loop.run(self._core.send_records(
            topic, bytes(builder.buffer), msg_ids, queue=queue, selector=selector, arg=arg, first=messages[0],
            timeout=timeout), timeout=wait)]

    def send_encoded_async(self, topic: str, data: bytes | memoryview, count: int, *, queue: MessageQueue | None = None,
                           selector: MessageQueueSelector | None = None,
                           arg: Any = None) -> concurrent.futures.Future[tuple[MessageQueue, int]]:
        """Send `count` records encoded by the caller (tidemark.common.records, topic as stored: no
        namespace) as one batch, without waiting: the future gets (queue, first offset). For writers that
        encode whole columns at once (the Spark sink); the same sending rules as send_batch's. `data` may be
        any bytes-like object (a view of the caller's buffer: it is copied once, into the request), left
        unchanged until the future is done."""
        self._life.require(ClientState.RUNNING, action="send")
        if self.settings.namespace:
            raise InvalidArgumentError("send_encoded_async takes records of a stored topic name: not with a namespace")
        try:
            data = memoryview(data).cast("B")  # (bytes, not items: a view of an array of ints counts its bytes)
        except TypeError as e:
            raise InvalidArgumentError(f"send_encoded_async takes a contiguous bytes-like object: {e}") from None
        check_batch_size(data.nbytes, count, self.settings.max_message_size)
        return self._loop.submit(self._core.send_encoded(topic, data, count, queue=queue, selector=selector, arg=arg,
                                                         first=None, timeout=None))

    def send_async(self, message: Message, callback: SendCallback | None = None, *,
                   queue: MessageQueue | None = None, selector: MessageQueueSelector | None = None,
                   arg: Any = None) -> concurrent.futures.Future[SendResult]:
        """Send without blocking: the message joins its queue's batch (linger_ms, batch_size).

        The future (and callback, on the producer's thread) gets the result or the error. Blocks only
        when max_async_in_flight messages are unanswered, and never when called from a send callback:
        there a message that would have to wait (for a slot or a route) goes on its own instead."""
        if tracing.ENABLED:
            return tracing.send_async_traced(self._send_async, message, callback, self.settings, queue=queue,
                                             selector=selector, arg=arg)
        return self._send_async(message, callback, queue=queue, selector=selector, arg=arg)

    def _send_async(self, message: Message, callback: SendCallback | None, *, queue: MessageQueue | None,
                    selector: MessageQueueSelector | None, arg: Any) -> concurrent.futures.Future[SendResult]:
        self._life.require(ClientState.RUNNING, action="send")
        names = self._names
        try:
            message, queue = names.message(message), names.queue(queue)
            self._check(message)
            selector = route_by_group((message,), queue, selector)
            from_callback = self._loop.on_own_thread
            queues = self._cached_queues(message.topic) if from_callback else None
            if needs_unary(message) or (from_callback and (queues is None or not self._core.slots.acquire(False))):
                future = names.bare_future(self._chain(self._loop.submit(self._core.send_messages(
                    [message], queue=queue, selector=selector, arg=arg, timeout=None))))
            else:
                msg_id, props, tags_code = encode_message(message, self._ids)
                if queues is None:
                    queues = self._write_queues(message.topic)
                    self._core.slots.acquire()
                try:
                    if queue is None and selector is not None:
                        queue = selector.select(queues, message, arg)
                    return names.bare_future(self._core.accumulator.append(
                        queues, queue, message.body, props, msg_id=msg_id, tags_code=tags_code, flag=message.flag,
                        callback=names.bare_callback(callback)))
                except RuntimeError:
                    self._core.slots.release()
                    raise ClientStateError("cannot send: the producer was shut down") from None
                except BaseException:
                    self._core.slots.release()
                    raise
        except TidemarkError as e:
            future = concurrent.futures.Future()
            future.set_exception(e)
        if callback is not None:
            future.add_done_callback(lambda f: call_back(callback, f))
        return future

    def send_oneway(self, message: Message, **kw: Any) -> None:
        """Send without waiting for or reporting the result (failures are only logged)."""
        future = self.send_async(message, **kw)
        future.add_done_callback(lambda f: f.exception() and log.warning("oneway send failed",
                                 event="send_oneway_failed", topic=message.topic, error=f.exception()))

    # -- helpers -----------------------------------------------------------------------------

    def _check(self, message: Message) -> None:
        if not isinstance(message, Message):
            raise InvalidArgumentError(f"expected a tidemark.client.Message, got {type(message).__name__}")
        body = message.body
        if message.topic in self._checked_topics and 0 < len(body) <= self.settings.max_message_size:
            return
        check_message(message, self.settings.max_message_size)
        self._checked_topics.add(message.topic)

    def _cached_queues(self, topic: str) -> list[MessageQueue] | None:
        """The cached writable queues, fresh or not (None if never fetched): for the loop's own thread."""
        cached = self._routes.get(topic)
        return None if cached is None else cached[1]

    def _write_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues, cached for route_refresh_interval_s (one loop round trip to refresh)."""
        cached = self._routes.get(topic)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self.settings.route_refresh_interval_s:
            return cached[1]
        queues = self._loop.run(self._core.cluster.write_queues(topic), timeout=self.settings.request_timeout_s * 2)
        if not queues:  # send_async does not wait out a failover: the future gets the retriable error
            raise self._core.cluster.no_writable_queue(topic)
        self._routes[topic] = (now, queues)
        return queues

    @staticmethod
    def _chain(source: concurrent.futures.Future) -> concurrent.futures.Future:
        """A future of one SendResult from a future of the unary path's result list."""
        target: concurrent.futures.Future = concurrent.futures.Future()

        def copy(f: concurrent.futures.Future) -> None:
            error = f.exception()
            if error is not None:
                target.set_exception(error)
            else:
                target.set_result(f.result()[0])
        source.add_done_callback(copy)
        return target


__all__ = ["AsyncProducer", "Producer", "check_message", "encode_message"]
