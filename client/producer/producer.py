"""Producer: send (sync), send_async, send_oneway, batches, queue selectors and retries.

Without a selector, queues are used round-robin across the topic's writable
queues on every broker; a retriable failure is retried (default twice) on a
queue of another broker when there is one, as RocketMQ's producer does. With a
selector (ordered messages) retries stay on the selected queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from typing import Any

from client.errors import ClientStateError, InvalidArgumentError, TidemarkError
from client.message import Message, MessageQueue, SendResult
from client.producer.selector import MessageQueueSelector
from client.remoting.cluster import BrokerCluster
from client.runtime import LoopThread
from client.settings import ProducerSettings, build
from tidemark.protocol import InvalidNameError, MessageIdGenerator, PropertyKey, check_topic_name

log = logging.getLogger("tidemark.client.producer")


def check_message(message: Message, max_size: int) -> None:
    """RocketMQ's Validators.checkMessage: topic name, non-empty body, size limit."""
    if not isinstance(message, Message):
        raise InvalidArgumentError(f"expected a client.Message, got {type(message).__name__}")
    try:
        check_topic_name(message.topic)
    except InvalidNameError as e:
        raise InvalidArgumentError(str(e)) from None
    if len(message.body) == 0:
        raise InvalidArgumentError("message body must not be empty")
    if len(message.body) > max_size:
        raise InvalidArgumentError(f"message body is {len(message.body)} bytes; max_message_size is {max_size}")


class AsyncProducer:
    """The asyncio core; use `Producer` from synchronous code."""

    def __init__(self, settings: ProducerSettings) -> None:
        self.settings = settings
        self._cluster: BrokerCluster | None = None
        self._ids = MessageIdGenerator()
        self._next = 0

    async def start(self) -> None:
        s = self.settings
        # Back-pressure for send_async: beyond this many requests in flight, new ones wait their turn
        # (unbounded, a burst overloads the channel and calls start failing).
        self.async_slots = asyncio.Semaphore(s.max_async_in_flight)
        self._cluster = BrokerCluster(s.brokers, timeout_s=s.request_timeout_s, route_ttl_s=s.route_refresh_interval_s)
        await self._cluster.discover()

    async def shutdown(self) -> None:
        if self._cluster is not None:
            await self._cluster.close()
            self._cluster = None

    @property
    def cluster(self) -> BrokerCluster:
        if self._cluster is None:
            raise ClientStateError("producer is not started")
        return self._cluster

    def _with_id(self, message: Message) -> Message:
        if message.properties.get(PropertyKey.UNIQ_KEY):
            return message
        props = dict(message.properties)
        props[PropertyKey.UNIQ_KEY] = self._ids.next()
        return Message(topic=message.topic, body=message.body, tags=message.tags, keys=message.keys,
                       properties=props, delay_level=message.delay_level, flag=message.flag)

    async def send_batch(self, messages: Sequence[Message], *, queue: MessageQueue | None = None,
                         selector: MessageQueueSelector | None = None, arg: Any = None,
                         timeout: float | None = None) -> list[SendResult]:
        if not messages:
            raise InvalidArgumentError("a batch needs at least one message")
        topic = messages[0].topic
        for m in messages:
            check_message(m, self.settings.max_message_size)
            if m.topic != topic:
                raise InvalidArgumentError(f"all messages of a batch must share a topic ({topic!r} vs {m.topic!r})")
        messages = [self._with_id(m) for m in messages]
        timeout = timeout or self.settings.send_msg_timeout_s
        attempts = 1 + self.settings.retry_times_when_send_failed
        last_broker = None
        error: TidemarkError | None = None
        for attempt in range(attempts):
            target = queue or await self._select(topic, messages[0], selector, arg, avoid=last_broker)
            try:
                conn = await self.cluster.connection(target.broker_name)
                return await conn.send(topic, messages, queue_id=target.queue_id,
                                       born_host=self.settings.client_ip, timeout=timeout)
            except TidemarkError as e:
                if not e.retriable or attempt == attempts - 1:
                    raise
                error = e
                last_broker = target.broker_name
                self.cluster.forget_route(topic)
                log.warning("send failed, retrying event=send_retry topic=%s broker=%s attempt=%d error=%s",
                            topic, target.broker_name, attempt + 1, e)
        raise error if error else AssertionError("unreachable")

    async def _select(self, topic: str, message: Message, selector: MessageQueueSelector | None, arg: Any,
                      avoid: str | None) -> MessageQueue:
        mqs = await self.cluster.write_queues(topic)
        if not mqs:
            raise InvalidArgumentError(f"topic {topic!r} has no writable queue")
        if selector is not None:
            return selector.select(mqs, message, arg)
        candidates = [q for q in mqs if q.broker_name != avoid] or mqs
        self._next += 1
        return candidates[self._next % len(candidates)]


class Producer:
    """Synchronous producer. `Producer(brokers="h:p")` or `Producer(ProducerSettings(...))`; a context manager."""

    def __init__(self, settings: ProducerSettings | None = None, /, **overrides: Any) -> None:
        self.settings: ProducerSettings = build(ProducerSettings, settings, overrides)  # type: ignore[assignment]
        self._core = AsyncProducer(self.settings)
        self._loop = LoopThread("producer")
        self._state = "CREATED"

    def start(self) -> Producer:
        if self._state == "RUNNING":
            return self
        if self._state == "SHUTDOWN":
            raise ClientStateError("producer was shut down; create a new one")
        self._loop.start()
        try:
            self._loop.run(self._core.start(), timeout=self.settings.request_timeout_s * 2)
        except BaseException:
            self._loop.stop()
            raise
        self._state = "RUNNING"
        return self

    def shutdown(self) -> None:
        if self._state != "RUNNING":
            self._state = "SHUTDOWN"
            return
        try:
            self._loop.run(self._core.shutdown(), timeout=self.settings.request_timeout_s)
        finally:
            self._loop.stop()
            self._state = "SHUTDOWN"

    def __enter__(self) -> Producer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _check(self) -> None:
        if self._state != "RUNNING":
            raise ClientStateError(f"producer is {self._state.lower()}; call start() first"
                                   if self._state == "CREATED" else "producer was shut down")

    def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues on every broker, sorted."""
        self._check()
        return self._loop.run(self._core.cluster.write_queues(topic, refresh=True),
                              timeout=self.settings.request_timeout_s * 2)

    def send(self, message: Message, *, queue: MessageQueue | None = None,
             selector: MessageQueueSelector | None = None, arg: Any = None,
             timeout: float | None = None) -> SendResult:
        """Send one message and wait for the broker's answer."""
        return self.send_batch([message], queue=queue, selector=selector, arg=arg, timeout=timeout)[0]

    def send_batch(self, messages: Sequence[Message], *, queue: MessageQueue | None = None,
                   selector: MessageQueueSelector | None = None, arg: Any = None,
                   timeout: float | None = None) -> list[SendResult]:
        """Send messages of one topic as one batch: one queue, consecutive offsets."""
        self._check()
        wait = (timeout or self.settings.send_msg_timeout_s) * (1 + self.settings.retry_times_when_send_failed) + 1
        return self._loop.run(self._core.send_batch(messages, queue=queue, selector=selector, arg=arg,
                                                    timeout=timeout), timeout=wait)

    def send_async(self, message: Message, callback: Callable[[SendResult | None, Exception | None], None] | None = None,
                   **kw: Any) -> concurrent.futures.Future[SendResult]:
        """Send without blocking; the future (and callback, on the producer's thread) gets the result."""
        self._check()
        future = self._loop.submit(self._send_one(message, **kw))
        if callback is not None:
            def done(f: concurrent.futures.Future[SendResult]) -> None:
                error = f.exception()
                callback(None if error else f.result(), error)  # type: ignore[arg-type]
            future.add_done_callback(done)
        return future

    def send_oneway(self, message: Message, **kw: Any) -> None:
        """Send without waiting for or reporting the result (failures are only logged)."""
        future = self.send_async(message, **kw)
        future.add_done_callback(lambda f: f.exception() and log.warning(
            "oneway send failed event=send_oneway_failed topic=%s error=%s", message.topic, f.exception()))

    async def _send_one(self, message: Message, **kw: Any) -> SendResult:
        async with self._core.async_slots:
            return (await self._core.send_batch([message], **kw))[0]


__all__ = ["AsyncProducer", "Producer", "check_message"]
