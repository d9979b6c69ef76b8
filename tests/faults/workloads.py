"""Clients that record their history: producers, consumer groups and an offset observer.

Each workload is a thread of the test process driving Tidemark's real client
library (or the official RocketMQ 5 client, for pop) against real brokers,
usually through a FaultProxy. Every operation goes into the run's History
(history.py) with a unique body value `<run>.<worker>.<n>`, so the checker
can match what was acknowledged, stored and delivered.

A send's outcome is recorded as the application would read it: OK with the
queue and offset the SendResult names; FAIL when the error says the broker
refused it (a bad request, a permission, an unknown topic, a failed
precondition: nothing was stored); INFO otherwise. Workloads never re-send a value: every retry is
the client library's own, so a duplicate in the read-back is the client's or
the broker's, never the test's.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tidemark.client import (
    Admin,
    AlreadyExistsError,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyStatus,
    FailedPreconditionError,
    InvalidArgumentError,
    LocalTransactionState,
    Message,
    MessageQueue,
    NotFoundError,
    PermissionDeniedError,
    Producer,
    PullConsumer,
    PushConsumer,
    SelectMessageQueueByHash,
    TidemarkError,
    TransactionProducer,
    UnauthenticatedError,
)

from .history import History, QueueKey

__all__ = ["Clients", "OffsetObserver", "PipelinedProducerWorkload", "PopGroup", "ProducerWorkload", "PullGroup", "PushGroup", "TransactionalWorkload",
           "Workload", "read_back", "wait_drained"]


@dataclass
class Clients:
    """How workloads reach the cluster: broker addresses or name servers, and client settings for all."""

    run_id: str
    history: History
    brokers: tuple[str, ...] = ()
    namesrv: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)

    def options(self, **extra: Any) -> dict[str, Any]:
        where = {"namesrv": ",".join(self.namesrv)} if self.namesrv else {"brokers": ",".join(self.brokers)}
        return {**where, **self.settings, **extra}


class Workload(threading.Thread):
    """A worker thread with a stop flag; an exception that escapes it is kept for the run's report."""

    consumes = False  # consumers run on after the producers stop, until they drained their topics
    # Workloads whose clients take a while to start (a consumer's start() joins its group) say when they
    # have (`started()`); the faults begin only then. A start made during a fault fails by design (start()
    # checks the topics and runs the first rebalance), which would be the harness's doing, not a finding.
    starts_slowly = False

    def __init__(self, clients: Clients, name: str) -> None:
        super().__init__(name=f"{clients.run_id}-{name}", daemon=True)
        self.clients = clients
        self.history = clients.history
        self.worker = name
        self.stopping = threading.Event()
        self.crash: BaseException | None = None
        self.ready = threading.Event()  # its clients are started (or it crashed trying)

    def run(self) -> None:
        if not self.starts_slowly:
            self.ready.set()
        try:
            self.work()
        except BaseException as e:  # reported by the scenario as a finding, never swallowed
            self.crash = e
        finally:
            self.ready.set()

    def started(self) -> None:
        self.ready.set()

    def work(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 30.0) -> None:
        self.stopping.set()
        self.join(timeout)


def _queue(mq: MessageQueue) -> QueueKey:
    return (mq.topic, mq.broker_name, mq.queue_id)


class _Pace:
    """At most `rate` operations per second (0: as fast as the client goes)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic()

    def wait(self, stopping: threading.Event) -> None:
        if self.interval:
            self.next += self.interval
            delay = self.next - time.monotonic()
            if delay > 0:
                stopping.wait(delay)
            else:
                self.next = time.monotonic()  # behind (a fault held us up): do not burst to catch up


class ProducerWorkload(Workload):
    """Synchronous sends of unique values from one Producer shared by `threads` threads.

    `fifo_keys` > 0: each value carries one of that many keys (the sharding key: SelectMessageQueueByHash
    puts a key on one queue), and a thread sends its keys one after another, so the checker can see that
    each key's acknowledged sends are stored in acknowledgement order."""

    def __init__(self, clients: Clients, name: str, topic: str, *, threads: int = 2, rate: float = 100.0,
                 idempotence: bool = True, fifo_keys: int = 0, **settings: Any) -> None:
        super().__init__(clients, name)
        self.topic = topic
        self.threads = threads
        self.rate = rate
        self.fifo_keys = fifo_keys
        self.producer_settings = {"enable_idempotence": idempotence, **settings}

    def work(self) -> None:
        with Producer(**self.clients.options(**self.producer_settings)) as producer:
            senders = [threading.Thread(target=self._send_loop, args=(producer, i), daemon=True)
                       for i in range(self.threads)]
            for t in senders:
                t.start()
            for t in senders:
                t.join()

    def _send_loop(self, producer: Producer, index: int) -> None:
        process = f"{self.worker}/{index}"
        pace = _Pace(self.rate / self.threads)
        selector = SelectMessageQueueByHash() if self.fifo_keys else None
        n = 0
        while not self.stopping.is_set():
            value = f"{self.clients.run_id}.{process}.{n}"
            key = f"{process}#{n % self.fifo_keys}" if self.fifo_keys else ""
            n += 1
            self.history.invoke_send(process, value, self.topic, key=key)
            try:
                result = producer.send(Message(self.topic, value.encode(), keys=key or value), selector=selector,
                                       arg=key or None)
            except Exception as e:
                self.history.send_failed(process, value, self.topic, e, definite=_definite(e))
            else:
                self.history.send_ok(process, value, _queue(result.message_queue), result.queue_offset, key=key)
            pace.wait(self.stopping)


class PipelinedProducerWorkload(Workload):
    """send_async in bursts of `burst` messages to one queue at a time (the topic's queues in turn), every
    message a batch of its own (batch_size 1), so that up to max_in_flight_per_queue batches of one queue are
    on their way together; the burst's futures are then awaited and recorded in the order sent.

    With idempotence each value carries its queue as key (sent one after another, for the checker's FIFO
    rule): an idempotent producer stores a queue's batches in the order they were sent, retries included.
    Without it, batches in flight together may be stored out of order (Kafka's rule too): no key."""

    def __init__(self, clients: Clients, name: str, topic: str, *, burst: int = 10, rate: float = 400.0,
                 idempotence: bool = True, **settings: Any) -> None:
        super().__init__(clients, name)
        self.topic = topic
        self.burst = burst
        self.rate = rate
        self.idempotence = idempotence
        self.producer_settings = {"enable_idempotence": idempotence, "batch_size": 1, **settings}

    def work(self) -> None:
        with Producer(**self.clients.options(**self.producer_settings)) as producer:
            queues = producer.fetch_publish_message_queues(self.topic)
            pace = _Pace(self.rate / self.burst)
            n = turn = 0
            while not self.stopping.is_set():
                mq = queues[turn % len(queues)]
                turn += 1
                key = f"{self.worker}#{mq.queue_id}" if self.idempotence else ""
                pending = []
                for _ in range(self.burst):
                    value = f"{self.clients.run_id}.{self.worker}.{n}"
                    n += 1
                    self.history.invoke_send(self.worker, value, self.topic, key=key)
                    try:
                        future = producer.send_async(Message(self.topic, value.encode(), keys=key or value), queue=mq)
                    except Exception as e:
                        self.history.send_failed(self.worker, value, self.topic, e, definite=_definite(e))
                    else:
                        pending.append((value, future))
                for value, future in pending:
                    try:
                        result = future.result(120)
                    except Exception as e:
                        self.history.send_failed(self.worker, value, self.topic, e, definite=_definite(e))
                    else:
                        self.history.send_ok(self.worker, value, _queue(result.message_queue), result.queue_offset,
                                             key=key)
                pace.wait(self.stopping)


# What an application may read as "nothing was stored": the broker refused the request itself. (The
# checker's own reading of the error classes, not the library's: the library is what is under test.)
_REFUSALS = (InvalidArgumentError, NotFoundError, AlreadyExistsError, FailedPreconditionError, PermissionDeniedError,
             UnauthenticatedError)


def _definite(error: BaseException) -> bool:
    return isinstance(error, _REFUSALS) and not getattr(error, "retriable", False)


def committed_value(value: str) -> bool:
    """The transactional workload's local rule: which values its local transaction commits (3 of 4)."""
    return int(value.rsplit(".", 1)[1]) % 4 != 3


class TransactionalWorkload(Workload):
    """Transactional sends: the local transaction commits 3 values of 4 and rolls back the rest, and the
    check answers by the same rule (from the value, as an application answers from its own state).

    A committed send is OK without an offset (the acknowledgement names the half message's offset, not
    where the message becomes visible); a rolled-back one is FAIL (it must never become visible)."""

    def __init__(self, clients: Clients, name: str, topic: str, *, rate: float = 30.0, group: str = "",
                 **settings: Any) -> None:
        super().__init__(clients, name)
        self.topic = topic
        self.rate = rate
        self.group = group or f"{name}-txn"
        self.producer_settings = settings

    def work(self) -> None:
        def check(msg) -> LocalTransactionState:
            value = msg.body.decode()
            return (LocalTransactionState.COMMIT_MESSAGE if committed_value(value)
                    else LocalTransactionState.ROLLBACK_MESSAGE)

        def execute(msg, value) -> LocalTransactionState:
            if committed_value(value):
                return LocalTransactionState.COMMIT_MESSAGE
            return LocalTransactionState.ROLLBACK_MESSAGE

        producer = TransactionProducer(check_local_transaction=check, topics=[self.topic],
                                       **self.clients.options(producer_group=self.group, **self.producer_settings))
        producer.start()
        try:
            pace = _Pace(self.rate)
            n = 0
            while not self.stopping.is_set():
                value = f"{self.clients.run_id}.{self.worker}.{n}"
                n += 1
                self.history.invoke_send(self.worker, value, self.topic)
                try:
                    result = producer.send_message_in_transaction(Message(self.topic, value.encode(), keys=value),
                                                                  execute, value)
                except Exception as e:
                    self.history.send_failed(self.worker, value, self.topic, e, definite=False)
                else:
                    if result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE:
                        self.history.send_ok(self.worker, value, (self.topic, "", -1), -1)
                    else:
                        self.history.send_failed(self.worker, value, self.topic,
                                                 RuntimeError("rolled back"), definite=True)
                pace.wait(self.stopping)
        finally:
            producer.shutdown()


class PushGroup(Workload):
    """`consumers` PushConsumers of one group (concurrent or orderly listeners) recording deliveries. An
    orderly listener records its call's start too, and works `call_s` per call (so that two members
    calling at once would overlap); `addresses[i]`, when given, is how consumer i reaches the brokers (a
    proxy of its own: faults of one member)."""

    consumes = True
    starts_slowly = True

    def __init__(self, clients: Clients, group: str, topics: Iterable[str], *, consumers: int = 2,
                 orderly: bool = False, call_s: float = 0.0, addresses: Sequence[str] = (),
                 **settings: Any) -> None:
        super().__init__(clients, group)
        self.group = group
        self.topics = list(topics)
        self.count = consumers
        self.orderly = orderly
        self.call_s = call_s
        self.addresses = list(addresses)
        self.consumer_settings = {"consume_from_where": ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                                  "persist_consumer_offset_interval_s": 1.0, "rebalance_interval_s": 2.0,
                                  **settings}

    def work(self) -> None:
        consumers = []
        try:
            for i in range(self.count):
                consumers.append(self._start(i))
            self.started()
            self.stopping.wait()
        finally:
            for c in consumers:
                c.shutdown()

    def _start(self, index: int) -> PushConsumer:
        process = f"{self.group}/{index}"
        history, group, call_s = self.history, self.group, self.call_s
        where = {"brokers": self.addresses[index]} if self.addresses else {}
        consumer = PushConsumer(**self.clients.options(group=group, instance_name=f"{self.clients.run_id}-{index}",
                                                       **where, **self.consumer_settings))

        def record(msgs) -> None:
            for m in msgs:
                history.delivered(process, group, m.body.decode("utf-8", "replace"),
                                  (m.topic, m.broker_name, m.queue_id), m.queue_offset)

        def concurrently(msgs, ctx):
            record(msgs)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        def orderly(msgs, ctx):
            m = msgs[0]
            history.call_started(process, group, m.body.decode("utf-8", "replace"),
                                 (m.topic, m.broker_name, m.queue_id), m.queue_offset)
            if call_s:
                time.sleep(call_s)
            record(msgs)
            return ConsumeOrderlyStatus.SUCCESS

        for topic in self.topics:
            consumer.subscribe(topic)
        if self.orderly:
            consumer.register_message_listener_orderly(orderly)
        else:
            consumer.register_message_listener(concurrently)
        return consumer.start()


class PullGroup(Workload):
    """One lite PullConsumer of a group, polling and auto-committing."""

    consumes = True
    starts_slowly = True

    def __init__(self, clients: Clients, group: str, topics: Iterable[str], **settings: Any) -> None:
        super().__init__(clients, group)
        self.group = group
        self.topics = list(topics)
        self.consumer_settings = {"consume_from_where": ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
                                  "auto_commit_interval_s": 1.0, "rebalance_interval_s": 2.0, **settings}

    def work(self) -> None:
        consumer = PullConsumer(**self.clients.options(group=self.group, instance_name=f"{self.clients.run_id}-pull",
                                                       **self.consumer_settings))
        for topic in self.topics:
            consumer.subscribe(topic)
        consumer.start()
        self.started()
        process = f"{self.group}/pull"
        try:
            while not self.stopping.is_set():
                try:
                    msgs = consumer.poll(0.5)
                except TidemarkError:
                    continue  # a poll that met a fault: the consumer recovers by itself
                for m in msgs:
                    self.history.delivered(process, self.group, m.body.decode("utf-8", "replace"),
                                           (m.topic, m.broker_name, m.queue_id), m.queue_offset)
        finally:
            consumer.shutdown()


class PopGroup(Workload):
    """The official RocketMQ 5 client's SimpleConsumer (pop: receive, then ack within an invisible
    duration) of a group, as RocketMQ 5 applications consume. Pop deliveries carry no queue offset; an
    unacked message comes back after its invisible time, so every stored message must reach the group."""

    consumes = True
    starts_slowly = True

    def __init__(self, clients: Clients, group: str, topics: Iterable[str], *, address: str, home: str,
                 invisible_s: int = 15) -> None:
        super().__init__(clients, group)
        self.group = group
        self.topics = list(topics)
        self.address = address  # one broker's endpoint (the official client takes an endpoint, not a cluster)
        self.home = home
        self.invisible_s = invisible_s  # RocketMQ 5 allows 10 s .. 12 h
        self.errors: collections.Counter[str] = collections.Counter()  # failed receives, by error class

    def work(self) -> None:
        rmq = official_client(self.home)
        config = rmq.ClientConfiguration(self.address, rmq.Credentials(), request_timeout=3)
        consumer = rmq.SimpleConsumer(config, self.group, {t: rmq.FilterExpression() for t in self.topics},
                                      await_duration=1)
        consumer.startup()
        self.started()
        process = f"{self.group}/pop"
        try:
            while not self.stopping.is_set():
                try:
                    messages = consumer.receive(32, self.invisible_s)
                except Exception as e:  # the official client's own errors under faults: it recovers, we go on
                    self.errors[type(e).__name__] += 1
                    self.stopping.wait(0.2)
                    continue
                for m in messages:
                    self.history.delivered(process, self.group, m.body.decode("utf-8", "replace"), (m.topic, "", -1), -1)
                    try:
                        consumer.ack(m)
                    except Exception:  # unacked: delivered again after its invisible time
                        pass
        finally:
            consumer.shutdown()


_OFFICIAL: dict[str, Any] = {}


def official_client(home: str) -> Any:
    """The `rocketmq` package (rocketmq-python-client), imported once with HOME at `home`: at import it makes
    ~/logs/rocketmq_python/ and logs there, not in the user's home."""
    if "rocketmq" not in _OFFICIAL:
        import importlib
        import os

        before = os.environ.get("HOME")
        os.environ["HOME"] = home
        try:
            _OFFICIAL["rocketmq"] = importlib.import_module("rocketmq")
        finally:
            if before is None:
                del os.environ["HOME"]
            else:
                os.environ["HOME"] = before
    return _OFFICIAL["rocketmq"]


class OffsetObserver(Workload):
    """Asks the brokers for each group's committed offsets every `interval` seconds (as an operator's
    dashboard would), recording each answer; failed asks are skipped."""

    def __init__(self, clients: Clients, groups: Mapping[str, Iterable[str]], *, interval: float = 0.5) -> None:
        super().__init__(clients, "offsets")
        self.groups = {g: list(t) for g, t in groups.items()}
        self.interval = interval

    def work(self) -> None:
        with Admin(**self.clients.options()) as admin:
            while not self.stopping.wait(self.interval):
                self.observe(admin)

    def observe_once(self, timeout: float = 60.0) -> None:
        """One more observation with a new Admin (after the faults healed)."""
        admin = _retry(lambda: Admin(**self.clients.options()).start(), time.monotonic() + timeout)
        try:
            self.observe(admin)
        finally:
            admin.shutdown()

    def observe(self, admin: Admin) -> None:
        for group, topics in self.groups.items():
            for topic in topics:
                try:
                    stats = admin.consume_stats(group, topic)
                except TidemarkError:
                    continue
                for s in stats:
                    if s.consumer_offset >= 0:
                        self.history.offset_seen("observer", group, _queue(s.queue), s.consumer_offset)


def read_back(clients: Clients, topics: Iterable[str], *, decode: Callable[[bytes], str] | None = None,
              timeout: float = 60.0) -> dict[QueueKey, list[tuple[int, str]]]:
    """Every queue of the topics read offset by offset from its broker: (offset, value) per entry. The
    cluster may still be healing (a broker restarting, name servers coming back): retriable failures are
    retried until `timeout`."""
    decode = decode or (lambda body: body.decode("utf-8", "replace"))
    out: dict[QueueKey, list[tuple[int, str]]] = {}
    deadline = time.monotonic() + timeout
    admin = _retry(lambda: Admin(**clients.options()).start(), deadline)
    try:
        for topic in topics:
            try:
                queues = _retry(lambda t=topic: admin.fetch_message_queues(t), deadline)
            except NotFoundError:
                continue
            for mq in queues:
                entries: list[tuple[int, str]] = []
                low, high = _retry(lambda mq=mq: admin.offsets([mq])[mq], deadline)
                offset = low
                while offset < high:
                    result = _retry(lambda o=offset, mq=mq: admin.pull(mq, o, max_nums=256), deadline)
                    if not result.messages:
                        if result.next_begin_offset > offset:  # entries nothing was read from (retention)
                            offset = result.next_begin_offset
                            continue
                        # Not readable yet (a sync master's reads end at what its replica holds): wait.
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"{mq} is readable up to {offset} only, {high} stored")
                        time.sleep(0.1)
                        continue
                    for m in result.messages:
                        entries.append((m.queue_offset, decode(m.body)))
                    offset = result.messages[-1].queue_offset + 1
                out[_queue(mq)] = entries
    finally:
        admin.shutdown()
    return out


def _retry(call: Callable[[], Any], deadline: float) -> Any:
    """A read-back call, retried through the last retriable failures of a healing cluster."""
    while True:
        try:
            return call()
        except TidemarkError as e:
            if not e.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def wait_drained(history: History, stored: Mapping[QueueKey, list[tuple[int, str]]],
                 groups: Mapping[str, Iterable[str]], timeout: float) -> dict[str, int]:
    """Wait until each group (-> its topics) was delivered every stored value of its topics; returns how
    many values each group still misses. `timeout` is how long the groups may go without a new delivery
    (a consumer still catching up on a loaded machine is slow, not stuck), within four times that in all."""
    start = time.monotonic()
    deadline, cap = start + timeout, start + 4 * timeout
    wanted = {g: {v for q, entries in stored.items() if q[0] in set(topics) for _, v in entries}
              for g, topics in groups.items()}
    last = None
    while True:
        delivered: dict[str, set[str]] = {g: set() for g in wanted}
        for e in history.events():
            if e.group in delivered:
                delivered[e.group].add(e.value)
        missing = {g: len(values - delivered[g]) for g, values in wanted.items()}
        now = time.monotonic()
        if last is not None and sum(missing.values()) < sum(last.values()):
            deadline = min(cap, now + timeout)  # progress: the stall clock starts again
        last = missing
        if not any(missing.values()) or now > deadline:
            return missing
        time.sleep(0.2)
