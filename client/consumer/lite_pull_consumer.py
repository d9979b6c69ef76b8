"""PullConsumer (RocketMQ's DefaultLitePullConsumer): the application polls.

Two modes: subscribe(topic) joins the group and gets queues by rebalance (with
the same ownership handover as the push consumer), or assign(queues) reads
exactly those queues with no group coordination. Its ConsumerCore's fetcher
fills a buffer; poll() hands out one fetched batch at a time and advances the
queue's consumed offset; commit() (or auto commit every auto_commit_interval_s,
until the application commits itself) stores consumed offsets on the broker.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterable, Mapping
from typing import Any

from tidemark.client import tracing
from tidemark.client.consumer.blocking import BlockingConsumer
from tidemark.client.consumer.core import ConsumerCore
from tidemark.client.consumer.early_connection import EarlyConnection
from tidemark.client.consumer.lease import QueueLease
from tidemark.client.errors import ClientStateError, InvalidArgumentError
from tidemark.client.message import MessageExt, MessageQueue
from tidemark.client.namespacing import Names
from tidemark.client.runtime import ClientState, Lifecycle, LoopThread
from tidemark.client.selector import MessageSelector
from tidemark.client.settings import PullConsumerSettings, build, unique_instance
from tidemark.common.logs import get_logger
from tidemark.common.protocol import InvalidNameError, check_topic_name
from tidemark.common.scheduler import Scheduler

log = get_logger("tidemark.client.pull_consumer")

Fetched = tuple[QueueLease, list[MessageExt]]


class AsyncLitePullConsumer(ConsumerCore):
    consume_type = "CONSUME_ACTIVELY"
    commit_start_offset = False

    def __init__(self, settings: PullConsumerSettings, subscriptions: dict[str, MessageSelector]) -> None:
        super().__init__(settings, subscriptions)
        self.settings: PullConsumerSettings = settings
        self.auto_commit = settings.auto_commit
        self.paused: set[MessageQueue] = set()
        # Offset after the last message poll() returned, per queue; it reaches the offset store (and so
        # the broker) only through commit() or auto commit.
        self.consumed: dict[MessageQueue, int] = {}
        # Fetched batches in arrival order; batches of paused queues wait in _held, in order, until resume.
        self._ready: collections.deque[Fetched] = collections.deque()
        self._held: dict[MessageQueue, collections.deque[Fetched]] = {}
        self._arrived = asyncio.Event()

    def schedule_commits(self, sched: Scheduler) -> None:
        sched.every("auto-commit", self.settings.auto_commit_interval_s, self._auto_commit)

    # -- hooks -------------------------------------------------------------------------------

    async def lease_started(self, lease: QueueLease) -> None:
        self._consumed(lease.mq, lease.start_offset)
        await super().lease_started(lease)

    def deliver(self, lease: QueueLease, msgs: list[MessageExt]) -> None:
        if lease.mq in self.paused:
            self._held.setdefault(lease.mq, collections.deque()).append((lease, msgs))
        else:
            self._ready.append((lease, msgs))
            self._arrived.set()

    def caught_up(self, lease: QueueLease, offset: int) -> None:
        if offset > self.consumed.get(lease.mq, -1):
            self._consumed(lease.mq, offset)

    def forget(self, lease: QueueLease) -> None:
        held = self._held.get(lease.mq)
        if held and all(item[0] is lease for item in held):
            del self._held[lease.mq]

    # -- the application's calls (on the loop) -----------------------------------------------

    def _consumed(self, mq: MessageQueue, offset: int) -> None:
        self.consumed[mq] = offset
        if self.auto_commit:
            self.offset_store.update_offset(mq, offset, increase_only=False)

    def pause(self, mqs: Iterable[MessageQueue]) -> None:
        self.paused.update(mqs)

    def resume(self, mqs: Iterable[MessageQueue]) -> None:
        for mq in mqs:
            self.paused.discard(mq)
            held = self._held.pop(mq, None)
            if held:
                self._ready.extend(held)
                self._arrived.set()

    async def poll(self, timeout_s: float) -> list[MessageExt]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            while self._ready:
                lease, msgs = self._ready.popleft()
                if not lease.active:
                    continue  # the queue moved away, was reset or seeked: this batch is stale
                mq = lease.mq
                if mq in self.paused:
                    self._held.setdefault(mq, collections.deque()).append((lease, msgs))
                    continue
                offset = lease.pq.remove_messages(msgs)
                self._consumed(mq, offset if offset >= 0 else msgs[-1].queue_offset + 1)
                self.fetcher.grant(lease, len(msgs), sum(m.store_size for m in msgs))
                return msgs
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            self._arrived.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()
            except TimeoutError:
                return []

    def _lease(self, mq: MessageQueue) -> QueueLease:
        oq = self.ownership.get(mq)
        if oq is None or not oq.pulling or oq.lease is None:
            raise InvalidArgumentError(f"{mq} is not assigned to this consumer")
        return oq.lease

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        self._lease(mq)  # assigned to us, or a specific error
        conn = await self.cluster.connection(mq.broker_name)
        low, high = await conn.min_offset(mq), await conn.max_offset(mq)
        if not low <= offset <= high:
            raise InvalidArgumentError(f"seek offset {offset} is outside [{low}, {high}] for {mq}")
        self._held.pop(mq, None)
        current = self._lease(mq)  # an admin reset may have replaced the lease while we asked
        await self.ownership.restart(current, offset, current.reset_generation, record=False)

    async def seek_edge(self, mq: MessageQueue, *, end: bool) -> None:
        conn = await self.cluster.connection(mq.broker_name)
        await self.seek(mq, await (conn.max_offset(mq) if end else conn.min_offset(mq)))

    async def committed(self, mq: MessageQueue) -> int:
        conn = await self.cluster.connection(mq.broker_name)
        return (await conn.query_consumer_offset(self.settings.group, mq))[0]

    async def commit(self, offsets: Mapping[MessageQueue, int] | None, sync: bool) -> None:
        if offsets is None:
            offsets = {mq: self.consumed[mq] for mq in self.ownership.pulling() if mq in self.consumed}
        for mq, offset in offsets.items():
            self._lease(mq)
            if offset < 0:
                raise InvalidArgumentError(f"commit offset must be >= 0, got {offset} for {mq}")
        for mq, offset in offsets.items():
            self.offset_store.update_offset(mq, offset, increase_only=False)
        if sync:
            for mq in offsets:
                await self.offset_store.persist(mq)
        else:
            await self.offset_store.persist_all(self.ownership.assigned())

    async def _auto_commit(self) -> None:
        if self.auto_commit:
            await self.offset_store.persist_all(self.ownership.assigned())


class PullConsumer(BlockingConsumer):
    """Synchronous lite pull consumer.

        with PullConsumer(group="g", brokers="127.0.0.1:10911") as c:   # after subscribe()/assign()
            ...
        c = PullConsumer(group="g"); c.assign(queues); c.start(); c.seek(q, 0); msgs = c.poll(1.0)
    """

    def __init__(self, settings: PullConsumerSettings | None = None, /, **overrides: Any) -> None:
        self.settings: PullConsumerSettings = unique_instance(
            build(PullConsumerSettings, settings, overrides))  # type: ignore[assignment]
        self._subscriptions: dict[str, MessageSelector] = {}
        self._assigned: set[MessageQueue] | None = None
        # namespace=: the topics and queues the application names are wrapped, what it gets back is bare.
        self._names = Names(self.settings.namespace)
        self._loop = LoopThread(f"pull-consumer-{self.settings.group}")
        self._life = Lifecycle("consumer")
        self._core: AsyncLitePullConsumer | None = None
        self._early = EarlyConnection(self.settings, self._loop, self._life)  # connect()'s, until start()

    @property
    def state(self) -> ClientState:
        """Where the consumer is in its lifecycle (CREATED, STARTING, RUNNING, STOPPING, SHUTDOWN);
        readable from any thread."""
        return self._life.state

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        """Read `topic`'s messages that `expression` selects (a tag expression: "*" or "" for all, "a || b"
        for those tags; or a MessageSelector, e.g. `MessageSelector.by_sql("amount > 100")`, which the
        broker evaluates on the properties) from the queues the group's rebalance gives this consumer
        (RocketMQ's subscribe()). Subscribing again replaces the expression.

        Before start() only, and not mixed with assign(): ClientStateError; InvalidArgumentError for a
        bad topic name or expression. Whether the topic exists is checked by start() (NotFoundError)."""
        if self._assigned is not None:
            raise ClientStateError("subscribe() and assign() cannot be mixed")
        topic = self._names.topic(topic)
        try:
            check_topic_name(topic)
        except InvalidNameError as e:
            raise InvalidArgumentError(str(e)) from None
        selector = MessageSelector.of(expression)
        self._life.require(ClientState.CREATED, action="subscribe")
        self._subscriptions[topic] = selector

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Read exactly these queues (no rebalance); may be called again while running."""
        if self._subscriptions:
            raise ClientStateError("subscribe() and assign() cannot be mixed")
        queues = set(queues)
        if not all(isinstance(q, MessageQueue) for q in queues):
            raise InvalidArgumentError("assign() takes MessageQueue objects")
        queues = {self._names.queue(q) for q in queues}
        self._assigned = queues
        if self._life.state is ClientState.RUNNING:
            self._run(self._require().assign(queues))

    def connect(self) -> PullConsumer:
        """Open the connections to the brokers (through the name servers when set) before start(); returns
        self. Optional, as PushConsumer.connect(): start() connects by itself, but then the loop thread,
        gRPC's first channel and each broker's first answer are part of start()'s time.

        The consumer stays CREATED (subscribe() or assign() as before); a subscribed one's group does not
        hear of it until start(). The routes of the topics subscribed or assigned by then are read too
        (NotFoundError for one that does not exist). A no-op when connected already, also by a connect()
        under way on another thread, which it waits for (as start() does). ClientStateError after start();
        when no broker can be reached, the discovery's error, or RequestTimeoutError after
        2 * request_timeout_s, and the consumer is left as before (connect() or start() may be called
        again). shutdown() closes the connections of a consumer connected and never started."""
        self._early.open(self._subscriptions or {q.topic for q in self._assigned or ()})
        return self

    def start(self) -> PullConsumer:
        """Start fetching; returns self (RocketMQ's DefaultLitePullConsumer.start()).

        Needs subscribe() or assign() first (ClientStateError otherwise, and for a consumer started
        before). Finds the brokers and checks that every subscribed topic exists (NotFoundError).
        Subscribed, it joins the group and runs the first rebalance; assigned, it takes exactly the
        assigned queues. When start() returns, the queues it could take (their lock granted, when
        locking) have their start offsets, and fetching fills poll()'s buffer. On any error, or
        RequestTimeoutError after 4 * request_timeout_s + 5 s, the consumer is shut down and cannot be
        started again: a new PullConsumer is needed. A shutdown() on another thread meanwhile gives the
        start up: what it opened is closed, and start() raises ClientStateError."""
        self._life.require(ClientState.CREATED, action="start")
        if not self._subscriptions and self._assigned is None:
            raise ClientStateError("subscribe() or assign() before start()")
        core = AsyncLitePullConsumer(self.settings, self._subscriptions)
        self._start_with(core, lambda cluster: core.start(assigned=self._assigned, cluster=cluster))
        return self

    def shutdown(self) -> None:
        """Stop fetching, hand every queue back, leave the group (when subscribed), close; idempotent.

        Each queue's final commit is what the offset store holds: the offsets poll() reached under auto
        commit, else the last commit() (what was polled since is read again).
        Batches fetched but not polled are dropped. Never started, the consumer just goes to SHUTDOWN,
        closing the connections of connect(); one whose connect() is still under way (on another thread)
        is shut down, and that connect() closes what it opened; one whose start() is under way has its start
        given up, and is SHUTDOWN when this returns."""
        self._shut_down()

    def _require(self) -> AsyncLitePullConsumer:
        self._life.require(ClientState.RUNNING, action="use the consumer")
        return self._core

    def _run(self, coro, timeout: float | None = None):
        return self._loop.run(coro, timeout=timeout or self.settings.request_timeout_s * 4 + 5)

    def poll(self, timeout: float | None = None) -> list[MessageExt]:
        """The next fetched batch (one queue, in offset order), or [] after timeout seconds."""
        core = self._require()
        wait = self.settings.poll_timeout_s if timeout is None else timeout
        msgs = self._names.bare_messages(self._run(core.poll(wait), timeout=wait + 5))
        if tracing.ENABLED and msgs:
            tracing.received(msgs, self.settings)
        return msgs

    def seek(self, mq: MessageQueue, offset: int) -> None:
        """Continue reading mq at offset (within [min, max] of the queue)."""
        self._run(self._require().seek(self._names.queue(mq), offset))

    def seek_to_begin(self, mq: MessageQueue) -> None:
        """Continue reading mq from the oldest message the broker still stores (its min offset;
        RocketMQ's seekToBegin). As with seek(): InvalidArgumentError unless mq is in assignment(),
        and batches of mq fetched but not yet polled are dropped."""
        self._run(self._require().seek_edge(self._names.queue(mq), end=False))

    def seek_to_end(self, mq: MessageQueue) -> None:
        """Continue reading mq at its end (its max offset; RocketMQ's seekToEnd): only messages stored
        from now on. As with seek(): InvalidArgumentError unless mq is in assignment(), and batches of
        mq fetched but not yet polled are dropped."""
        self._run(self._require().seek_edge(self._names.queue(mq), end=True))

    def committed(self, mq: MessageQueue) -> int:
        """The group's committed offset on the broker (-1 when none)."""
        return self._run(self._require().committed(self._names.queue(mq)))

    def commit(self, offsets: Mapping[MessageQueue, int] | None = None, *, sync: bool = True) -> None:
        """Commit consumed offsets (or the given ones); turns auto commit off from then on."""
        core = self._require()
        if core.auto_commit:
            log.info("manual commit, auto commit off", event="auto_commit_off", group=self.settings.group)
            core.auto_commit = False
        if offsets is not None:
            offsets = {self._names.queue(mq): offset for mq, offset in offsets.items()}
        self._run(core.commit(offsets, sync))

    def assignment(self) -> set[MessageQueue]:
        """The queues this consumer reads now (RocketMQ's assignment()): those assign() named or the
        rebalance gave it, once started; queues still waiting for their lock or being handed back are
        not in it. A new set each call."""
        return set(self._names.bare_queues(self._loop.call(self._require().ownership.pulling, timeout=5)))

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues on every broker, sorted, asked for now rather than from the
        cached route (RocketMQ's fetchMessageQueues): what assign() takes. NotFoundError when no broker
        has the topic, a retriable UnavailableError when none has it but some could not be asked."""
        return self._names.bare_queues(self._run(self._require().cluster.read_queues(self._names.topic(topic),
                                                                                     refresh=True)))

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """Stop returning batches of these queues from poll() (fetching continues up to the flow limit)."""
        core, queues = self._require(), [self._names.queue(q) for q in queues]
        self._loop.call(lambda: core.pause(queues), timeout=5)

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        """Undo pause() for these queues (RocketMQ's resume()): their batches held meanwhile go back to
        poll(), after those already waiting; queues not paused are left as they are."""
        core, queues = self._require(), [self._names.queue(q) for q in queues]
        self._loop.call(lambda: core.resume(queues), timeout=5)
