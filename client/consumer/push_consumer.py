"""PushConsumer: subscribe, register a listener, start; messages arrive on the consume threads.

The asyncio core (AsyncPushConsumer) is a ConsumerCore whose fetched
messages go to a consume service: concurrent (listener batches on the consume
threads, ack_index, retry by send-back) or orderly (under the queue's lock,
in offset order per message group: consume_orderly.py). Commits ride on the fetch stream's
credit frames and are persisted every persist_consumer_offset_interval_s.
The synchronous PushConsumer runs the core on its own loop thread.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from tidemark.client import tracing
from tidemark.client.consumer.blocking import BlockingConsumer
from tidemark.client.consumer.consume_concurrently import (
    ConsumeMessageConcurrentlyService,
    calling_lease,
    forget_calling_lease,
)
from tidemark.client.consumer.consume_orderly import ConsumeMessageOrderlyService
from tidemark.client.consumer.consume_pool import ConsumeThreadPool
from tidemark.client.consumer.core import ConsumerCore
from tidemark.client.consumer.early_connection import EarlyConnection
from tidemark.client.consumer.fetcher import FetchLimits
from tidemark.client.consumer.lease import QueueLease
from tidemark.client.consumer.listener import MessageListenerConcurrently, MessageListenerOrderly
from tidemark.client.consumer.send_back import SendBackService
from tidemark.client.errors import ClientStateError, InvalidArgumentError, RequestTimeoutError
from tidemark.client.message import MessageExt, MessageQueue
from tidemark.client.namespacing import Names
from tidemark.client.runtime import ClientState, Lifecycle, LoopThread
from tidemark.client.selector import MessageSelector
from tidemark.client.settings import PushConsumerSettings, build, unique_instance
from tidemark.common.logs import get_logger
from tidemark.common.protocol import (
    InvalidNameError,
    check_topic_name,
    retry_topic,
)

log = get_logger("tidemark.client.consumer")


class AsyncPushConsumer(ConsumerCore):
    consume_type = "CONSUME_PASSIVELY"
    commit_start_offset = True

    def __init__(self, settings: PushConsumerSettings, subscriptions: dict[str, MessageSelector],
                 listener: MessageListenerConcurrently | MessageListenerOrderly, *, orderly: bool) -> None:
        super().__init__(settings, subscriptions)
        self.settings: PushConsumerSettings = settings
        self._listener = listener
        self.orderly = orderly
        # Set by PushConsumer.suspend() from any thread; read by the fetcher and the consume threads.
        self.suspended = False

    @property
    def locking(self) -> bool:
        return self.clustering and (self.settings.queue_locking or self.orderly)

    @property
    def piggyback(self) -> bool:
        return self.clustering

    def held(self) -> bool:
        return self.suspended

    def fetch_limits(self) -> FetchLimits:
        s = self.settings
        return FetchLimits(s.pull_threshold_for_queue, s.pull_threshold_size_for_queue,
                           None if self.orderly else s.consume_concurrently_max_span, s.pull_batch_size)

    def assemble(self) -> None:
        s = self.settings
        if self.clustering:
            # Created by the first send-back: routes of user topics are checked before this.
            self.subscriptions.setdefault(retry_topic(s.group), MessageSelector.by_tag("*"))
        # -1 (default): the broker's group config decides (retry_max_times, 16 unless changed).
        self.send_back = SendBackService(cluster=self.cluster, group=s.group, client_id=self.client_id,
                                         max_reconsume_times=max(s.max_reconsume_times, 0))
        self.pool = ConsumeThreadPool(max_threads=s.consume_thread_max, name=f"ConsumeMessageThread_{s.group}",
                                      loop=asyncio.get_running_loop(), on_drained=self._apply_finished)
        common = dict(listener=self._listener, settings=s, pool=self.pool, offset_store=self.offset_store,
                      send_back=self.send_back, fetcher=self.fetcher, suspended=lambda: self.suspended)
        self.consume_service: ConsumeMessageConcurrentlyService | ConsumeMessageOrderlyService = (
            ConsumeMessageOrderlyService(**common, on_death=self._consume_task_died,
                                         on_lock_lapsed=self._lock_lapsed) if self.orderly
            else ConsumeMessageConcurrentlyService(**common, clustering=self.clustering))
        log.info("consumer starting",
                 event="consumer_start", group=s.group, client_id=self.client_id, model=s.message_model.value,
                 orderly=self.orderly, locking=self.locking, strategy=self.strategy.name,
                 topics=",".join(sorted(self.subscriptions)))

    def _apply_finished(self) -> None:
        self.consume_service.apply_finished()

    def deliver(self, lease: QueueLease, msgs: list[MessageExt]) -> None:
        self.consume_service.submit(lease, msgs)

    def caught_up(self, lease: QueueLease, offset: int) -> None:
        self.offset_store.update_offset(lease.mq, offset, increase_only=True)

    async def drain(self, lease: QueueLease) -> None:
        if not lease.running:
            return
        with self.pool.hurried():  # the queue's next owner waits for this: no collect interval in between
            idle = await lease.wait_idle(self.settings.drain_timeout_s)
        if not idle:
            log.warning("drain timed out",
                        event="drain_timeout", group=self.settings.group, queue=lease.mq, running=lease.running)

    async def finish_running(self) -> None:
        """Without locks, with await_termination_ms_when_shutdown: fetching stops and the batches already
        fetched finish (their completions taken at once), up to that long, so that the offsets release_all
        persists count them. (With locks, each queue handed back drains its own.)"""
        wait_s = self.settings.await_termination_ms_when_shutdown / 1000
        if wait_s <= 0 or self.ownership.locking:
            return
        leases = self.ownership.leases()
        for lease in leases:
            self.fetcher.stop(lease)
        with self.pool.hurried():
            idle = await asyncio.gather(*(lease.wait_idle(wait_s) for lease in leases))
        if not all(idle):
            log.warning("listener batches still running at shutdown",
                        event="shutdown_wait_timeout", group=self.settings.group,
                        queues=[str(lease.mq) for lease, done in zip(leases, idle, strict=True) if not done])

    def let_go(self, lease: QueueLease, thread: threading.Thread) -> bool:
        """Loop thread: a listener on `thread`, one of this consumer's consume threads, shuts the consumer
        down from inside its call on `lease`. The drains and the pool's shutdown stop waiting for that
        batch, which ends only once the shutdown has returned: uncommitted, as one that outlived
        drain_timeout_s. False when `thread` is not this consumer's (a listener of another consumer), or
        was let go of already (a second shutdown() after one whose call to the loop timed out, but ran)."""
        if not self.pool.excuse(thread):
            return False
        lease.batch_finished()
        log.info("a listener shuts its consumer down: its batch is not waited for",
                 event="shutdown_from_listener", group=self.settings.group, queue=lease.mq)
        return True

    def _consume_task_died(self, lease: QueueLease, error: BaseException) -> None:
        self.ownership.lose_lease(lease, f"consume task died: {error!r}")

    def _lock_lapsed(self, lease: QueueLease) -> None:
        """An orderly queue's workers stopped for its lapsed lock: have it renewed, then start them again."""
        self.ownership.lock_lapsed(lease, self._consume_again)

    def _consume_again(self) -> None:
        if not self.suspended:
            self.consume_service.resume()

    def resume(self) -> None:
        """Loop thread: undo suspend(), hand held batches to the listener and held credit to the brokers."""
        self.suspended = False
        self.consume_service.resume()
        self.fetcher.resume()

    async def stop_parts(self) -> None:
        await self.consume_service.shutdown()
        await asyncio.to_thread(self.pool.shutdown)

    async def abandon_parts(self) -> None:
        # (the parts exist once assemble() ran: a start may fail before)
        if hasattr(self, "consume_service"):
            await self.consume_service.shutdown()
        if hasattr(self, "pool"):
            self.pool.stop()


class PushConsumer(BlockingConsumer):
    """Synchronous push consumer.

        consumer = PushConsumer(group="orders", brokers="127.0.0.1:10911")
        consumer.subscribe("Orders", "paid || shipped")
        consumer.register_message_listener(lambda msgs, ctx: ConsumeConcurrentlyStatus.CONSUME_SUCCESS)
        consumer.start(); ...; consumer.shutdown()
    """

    def __init__(self, settings: PushConsumerSettings | None = None, /, **overrides: Any) -> None:
        self.settings: PushConsumerSettings = unique_instance(
            build(PushConsumerSettings, settings, overrides))  # type: ignore[assignment]
        self._subscriptions: dict[str, MessageSelector] = {}
        self._listener: Any = None
        self._orderly = False
        # namespace=: the topics the application names are wrapped, what its listener gets is bare.
        self._names = Names(self.settings.namespace)
        self._loop = LoopThread(f"push-consumer-{self.settings.group}")
        self._life = Lifecycle("consumer")
        self._core: AsyncPushConsumer | None = None
        self._early = EarlyConnection(self.settings, self._loop, self._life)  # connect()'s, until start()

    @property
    def state(self) -> ClientState:
        """Where the consumer is in its lifecycle (CREATED, STARTING, RUNNING, STOPPING, SHUTDOWN);
        readable from any thread, a listener's too."""
        return self._life.state

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        """Consume `topic`'s messages that `expression` selects: a tag expression ("*" or "" for all,
        "a || b" for those tags; RocketMQ's subscribe(topic, subExpression)) or a MessageSelector
        (`MessageSelector.by_sql("region = 'eu'")`: an SQL92 condition on the message's properties, which
        the broker evaluates). Subscribing again replaces the expression.

        Before start() only (ClientStateError after); InvalidArgumentError for a bad topic name or
        expression (an SQL92 one names the column). Whether the topic exists is checked by start()
        (NotFoundError)."""
        self._life.require(ClientState.CREATED, action="subscribe")
        topic = self._names.topic(topic)
        try:
            check_topic_name(topic)
        except InvalidNameError as e:
            raise InvalidArgumentError(str(e)) from None
        self._subscriptions[topic] = MessageSelector.of(expression)

    def register_message_listener(self, listener: MessageListenerConcurrently) -> None:
        """A concurrent listener: (msgs, context) -> ConsumeConcurrentlyStatus."""
        self._set_listener(listener, orderly=False)

    def register_message_listener_orderly(self, listener: MessageListenerOrderly) -> None:
        """An orderly listener: (msgs, context) -> ConsumeOrderlyStatus. Order is kept per message group
        (Message.message_group; messages without one: per queue), and a suspended batch holds back only
        its group."""
        self._set_listener(listener, orderly=True)

    def _set_listener(self, listener: Any, *, orderly: bool) -> None:
        self._life.require(ClientState.CREATED, action="register a listener")
        if not callable(listener):
            raise InvalidArgumentError(f"listener must be callable, got {type(listener).__name__}")
        if tracing.ENABLED:
            listener = tracing.traced_listener(listener, self.settings)
        self._listener, self._orderly = self._names.listener(listener), orderly

    def connect(self) -> PushConsumer:
        """Open the connections to the brokers (through the name servers when set) before start(); returns
        self. Optional: start() connects by itself, but what connect() did is no longer part of start()'s
        time, the join (the consumer's loop thread, gRPC's first channel, the first answer of each broker:
        about 10 ms of a 22 ms join on a quiet machine, docs/benchmarks.md). RocketMQ's clients have this
        from their process-wide MQClientInstance, already connected when a consumer of the process joins.

        The consumer stays CREATED (subscribe and register as before); nobody in the group hears of it
        until start(). The routes of the topics subscribed by then are read too (NotFoundError for one that
        does not exist). A no-op when connected already, also by a connect() under way on another thread,
        which it waits for (as start() does). ClientStateError after start(); when no broker can be reached,
        the discovery's error (as Producer.start()), or RequestTimeoutError after 2 * request_timeout_s, and
        the consumer is left as before (connect() or start() may be called again). shutdown() closes the
        connections of a consumer connected and never started."""
        self._early.open(self._subscriptions)
        return self

    def start(self) -> PushConsumer:
        """Join the group and start consuming; returns self (RocketMQ's DefaultMQPushConsumer.start()).

        Needs a listener and a subscription (ClientStateError otherwise, and for a consumer started
        before). Finds the brokers, checks that every subscribed topic exists (NotFoundError), loads
        the offsets, heartbeats and runs the first rebalance: when start() returns, the queues it could
        take (their lock granted, when locking) have their start offsets, and the listener may have
        been called already (on the consume threads). Clustering consumers also subscribe to the
        group's retry topic. On any error, or RequestTimeoutError after 4 * request_timeout_s + 5 s,
        the consumer is shut down and cannot be started again: a new PushConsumer is needed. A shutdown() on
        another thread meanwhile gives the start up: what it opened is closed, and start() raises
        ClientStateError."""
        self._life.require(ClientState.CREATED, action="start")
        if self._listener is None:
            raise ClientStateError("register a message listener before start()")
        if not self._subscriptions:
            raise ClientStateError("subscribe to at least one topic before start()")
        core = AsyncPushConsumer(self.settings, self._subscriptions, self._listener, orderly=self._orderly)
        self._start_with(core, lambda cluster: core.start(cluster=cluster))
        return self

    def shutdown(self) -> None:
        """Graceful: queues are drained, committed and released; idempotent, and SHUTDOWN when it returns,
        also beside another thread's shutdown(). A consumer connected (connect()) and never started only
        closes its connections; one whose connect() is still under way (on another thread) is shut down,
        and that connect() closes what it opened; one whose start() is under way (on another thread) has
        its start given up.

        A listener may call it from inside its call (consume until something, then stop). Its own batch
        is then not waited for, since it ends only after this returns: it is not committed, and its
        messages go to whoever reads the queue next, as those of a batch that outlives drain_timeout_s."""
        self._let_go_of_caller()
        self._shut_down()

    def _let_go_of_caller(self) -> None:
        """On a consume thread of this consumer, inside a listener call: that batch is let go of (see
        shutdown())."""
        lease, core = calling_lease(), self._core
        if lease is None or core is None or not self._loop.running:
            return
        thread = threading.current_thread()
        try:
            if self._loop.call(lambda: core.let_go(lease, thread), timeout=5):
                forget_calling_lease()
        except ClientStateError:  # the loop stopped meanwhile: another thread's shutdown is over
            pass
        except RequestTimeoutError:  # a loop that busy: let_go most likely ran all the same (its first step)
            log.warning("a listener's shutdown() had no answer in 5 s on letting go of its batch; if it was not "
                        "let go of, the shutdown waits for it (drain_timeout_s)", event="shutdown_let_go_timeout",
                        group=self.settings.group, queue=lease.mq)

    def _running(self, action: str) -> AsyncPushConsumer:
        self._life.require(ClientState.STARTING, ClientState.RUNNING, action=action)
        core = self._core
        if core is None:
            raise ClientStateError(f"cannot {action}: the consumer is {self._life.state.value}")
        return core

    def suspend(self) -> None:
        """Stop fetching and stop handing messages to the listener (RocketMQ's suspend()).

        Safe from any thread, including a listener, from the moment start() is called: batches not
        yet started wait, uncommitted, until resume() (or go to the queue's next owner after shutdown()),
        and a failed batch's messages wait too instead of being sent back for retry."""
        self._running("suspend").suspended = True

    def resume(self) -> None:
        """Undo suspend() (RocketMQ's resume()): fetching goes on, the brokers get the credit held back
        meanwhile, and the batches held while suspended go to the listener.

        Safe from any thread, a listener's included; ClientStateError before start() or after shutdown()."""
        core = self._running("resume")
        self._loop.call(core.resume, timeout=5)

    def owned_queues(self) -> list[MessageQueue]:
        """The queues this consumer reads now, sorted: rebalance gave them to it, their lock is held
        (when locking) and their start offset fixed. Queues still waiting for their lock, or draining
        before they go to another consumer, are not listed. ClientStateError unless started."""
        core = self._running("list owned queues")
        return self._names.bare_queues(self._loop.call(core.ownership.pulling, timeout=5))

    def persist_offsets(self) -> None:
        """Commit every owned queue's progress now (normally every persist_consumer_offset_interval_s)."""
        core = self._running("persist offsets")
        self._loop.run(core.persist_offsets(), timeout=self.settings.request_timeout_s * 4)

    def stats(self) -> dict[str, int]:
        """Counters since start(), read together on the consumer's loop (one consistent snapshot).

        consumed_ok / consumed_failed: messages the listener consumed / did not (a retried message counts
        at each attempt); cached_messages: fetched and not yet consumed, over the owned queues;
        rebalances: rebalance passes; rebalance_changes: how often a pass changed a topic's queues;
        handovers: queues handed to their next owner after draining and a final commit (locking mode);
        pending_unlocks: queues handed back whose unlock failed and is being asked again;
        unlock_retries: the calls that asked again; owned_queues: len(owned_queues()); sent_back: failed
        messages the broker took back for retry (or its DLQ); retry_fallbacks: those sent to the retry
        topic directly because the send-back failed. ClientStateError unless started."""
        core = self._running("read stats")

        def collect() -> dict[str, int]:
            service = core.consume_service
            return {"consumed_ok": service.consumed_ok, "consumed_failed": service.consumed_failed,
                    "cached_messages": sum(le.pq.msg_count for le in core.ownership.leases()),
                    "rebalances": core.rebalance.rebalances, "rebalance_changes": core.rebalance.changes,
                    "handovers": core.ownership.handovers,
                    "pending_unlocks": core.ownership.pending_unlocks,
                    "unlock_retries": core.ownership.unlock_retries, "owned_queues": len(core.ownership.pulling()),
                    "sent_back": core.send_back.sent_back, "retry_fallbacks": core.send_back.fallback_sends}
        return self._loop.call(collect, timeout=5)
