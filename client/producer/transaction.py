"""TransactionProducer: RocketMQ's transactional messages, a local transaction and a send that succeed or fail
together.

    producer = TransactionProducer(brokers=..., producer_group="orders", topics=["Orders"],
                                   check_local_transaction=lambda msg: state_of(msg.keys))
    producer.start()
    result = producer.send_message_in_transaction(Message("Orders", body, keys=order_id),
                                                  execute_local_transaction=save_order, arg=order)

`send_message_in_transaction` sends a **half message** (stored, invisible to
consumers), runs `execute_local_transaction(msg, arg)`, and ends the
transaction with what it returns: COMMIT_MESSAGE (the message becomes
visible on its topic), ROLLBACK_MESSAGE (it never does) or UNKNOW (decide
later). A callback that raises counts as UNKNOW. A half message left without
an end (UNKNOW, a producer that died, an end that never arrived) is
**checked**: past the broker's transaction timeout, the broker asks a live
producer of the same group, on one of the topics it declared or sent to,
through a watch stream each producer keeps open with every broker; that
producer runs `check_local_transaction(msg)` on its check thread pool and
ends the transaction with the answer (UNKNOW: asked again later, up to the
broker's transaction_check_max times, then rolled back).

The callbacks must answer from the application's own state (the row the local
transaction wrote, keyed by the message's keys or transaction id), never from
memory of the send: the producer that is asked may not be the one that sent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tidemark.client.errors import InvalidArgumentError, TidemarkError
from tidemark.client.message import Message, MessageExt, MessageQueue, SendResult
from tidemark.client.producer.producer import Producer
from tidemark.client.remoting.connection import BrokerConnection
from tidemark.client.settings import ProducerSettings
from tidemark.common.logs import get_logger
from tidemark.common.protocol import PropertyKey, check_group_name

log = get_logger("tidemark.client.transaction")

RECONNECT_S = 1.0  # a broken watch is opened again after this long


class LocalTransactionState(enum.Enum):
    """RocketMQ's names, its spelling of UNKNOW included."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """The half message's send result (its queue offset is the half's, on the broker's half topic), what
    the local transaction answered, and the transaction id (the message id)."""

    send_result: SendResult
    local_transaction_state: LocalTransactionState
    transaction_id: str

    @property
    def msg_id(self) -> str:
        return self.send_result.msg_id

    @property
    def message_queue(self) -> MessageQueue:
        return self.send_result.message_queue


ExecuteLocalTransaction = Callable[[Message, Any], LocalTransactionState]
CheckLocalTransaction = Callable[[MessageExt], LocalTransactionState]


class TransactionProducer(Producer):
    """A Producer that also sends transactional messages (send_message_in_transaction) and answers checks."""

    def __init__(self, settings: ProducerSettings | None = None, /, *,
                 check_local_transaction: CheckLocalTransaction, topics: Iterable[str] = (),
                 check_threads: int = 4, **overrides: Any) -> None:
        super().__init__(settings, **overrides)
        group = self.settings.producer_group
        try:
            check_group_name(group)
        except ValueError as e:
            raise InvalidArgumentError(f"a TransactionProducer needs a producer_group: {e}") from None
        if not callable(check_local_transaction):
            raise InvalidArgumentError("check_local_transaction must be a function msg -> LocalTransactionState")
        if check_threads < 1:
            raise InvalidArgumentError(f"check_threads must be >= 1, got {check_threads}")
        self._check_local = check_local_transaction
        self._topics: set[str] = {self._names.topic(t) for t in topics}  # stored names (namespace=)
        self._checks = concurrent.futures.ThreadPoolExecutor(check_threads, thread_name_prefix="transaction-check")
        self._watches: dict[str, asyncio.Task] = {}  # broker address -> its watch task

    def start(self) -> TransactionProducer:
        super().start()
        try:
            self._loop.run(self._watch_all(), timeout=self.settings.request_timeout_s * 2)
        except BaseException:
            self.shutdown()
            raise
        return self

    def shutdown(self) -> None:
        if self._watches:
            async def stop() -> None:
                for task in self._watches.values():
                    task.cancel()
                await asyncio.gather(*self._watches.values(), return_exceptions=True)
                self._watches.clear()
            try:
                self._loop.run(stop(), timeout=10)
            except Exception:  # the loop may be gone already
                pass
        super().shutdown()
        self._checks.shutdown(wait=False, cancel_futures=True)

    def send_message_in_transaction(self, message: Message, execute_local_transaction: ExecuteLocalTransaction,
                                    arg: Any = None) -> TransactionSendResult:
        """Send the half message, run the local transaction, end the transaction with its answer."""
        if message.delay_level:
            raise InvalidArgumentError("a transactional message cannot be delayed")
        group, topic = self.settings.producer_group, self._names.topic(message.topic)
        half = Message(topic=topic, body=message.body, tags=message.tags, keys=message.keys, flag=message.flag,
                       properties={**message.properties, PropertyKey.TRANSACTION_PREPARED: "true",
                                   PropertyKey.PRODUCER_GROUP: group})
        if topic not in self._topics:
            self._topics.add(topic)
            self._loop.run(self._watch_all(restart=True), timeout=self.settings.request_timeout_s * 2)
        sent = self.send(half)
        try:
            state = _checked_state(execute_local_transaction(message, arg), "execute_local_transaction")
        except Exception:
            log.exception("execute_local_transaction raised: the transaction stays open until a check decides",
                          event="local_transaction_failed", msg_id=sent.msg_id)
            state = LocalTransactionState.UNKNOW
        if state is not LocalTransactionState.UNKNOW:
            try:
                self._loop.run(self._end(sent.message_queue.broker_name, topic, sent.msg_id, sent.queue_offset,
                                         state), timeout=self.settings.request_timeout_s * 2)
            except TidemarkError as e:
                # RocketMQ ends a transaction one way (oneway): a lost end is what checks are for.
                log.warning("ending transaction %s failed (%s): a check will decide", sent.msg_id, e,
                            event="end_transaction_failed")
        return TransactionSendResult(sent, state, sent.msg_id)

    async def _end(self, broker_name: str, topic: str, msg_id: str, half_offset: int, state: LocalTransactionState,
                   *, from_check: bool = False) -> None:
        conn = await self._core.cluster.master_connection(broker_name)
        await conn.end_transaction(self.settings.producer_group, topic, msg_id, half_offset,
                                   state is LocalTransactionState.COMMIT_MESSAGE, from_check=from_check)

    # -- checks ----------------------------------------------------------------------------------

    async def _watch_all(self, *, restart: bool = False) -> None:
        """A watch on every broker (again, with the new topic set, when `restart`)."""
        if not self._topics:
            return
        for conn in (await self._core.cluster.discover()).values():
            task = self._watches.get(conn.address)
            if task is not None and not task.done() and not restart:
                continue
            if task is not None:
                task.cancel()
            self._watches[conn.address] = asyncio.get_running_loop().create_task(
                self._watch(conn), name=f"transaction-checks:{conn.address}")

    async def _watch(self, conn: BrokerConnection) -> None:
        """Take checks from one broker, for as long as the producer runs; reopen a broken watch."""
        topics = sorted(self._topics)
        while True:
            try:
                async for half_offset, message in conn.watch_transaction_checks(
                        self.settings.producer_group, self.settings.client_id, topics):
                    asyncio.get_running_loop().run_in_executor(self._checks, self._answer, conn.broker_name or "",
                                                               half_offset, message)
            except TidemarkError as e:
                log.debug("transaction check watch broke; reopening", event="transaction_watch_broken",
                          broker=conn.address, error=e)
            await asyncio.sleep(RECONNECT_S)

    def _answer(self, broker_name: str, half_offset: int, message: MessageExt) -> None:
        """On a check thread: ask the application, then end the transaction with its answer."""
        try:
            state = _checked_state(self._check_local(self._names.bare_message(message)), "check_local_transaction")
        except Exception:
            log.exception("check_local_transaction raised: asked again later", event="transaction_check_failed",
                          msg_id=message.msg_id)
            return
        if state is LocalTransactionState.UNKNOW:
            return
        try:
            future = asyncio.run_coroutine_threadsafe(
                self._end(broker_name, message.topic, message.msg_id, half_offset, state, from_check=True),
                self._loop.loop)
            future.result(self.settings.request_timeout_s * 2)
        except (TidemarkError, concurrent.futures.TimeoutError, RuntimeError) as e:
            log.warning("answering the check of %s failed (%s): asked again later", message.msg_id, e,
                        event="transaction_check_answer_failed")


def _checked_state(state: object, callback: str) -> LocalTransactionState:
    if not isinstance(state, LocalTransactionState):
        log.warning("%s returned %r, not a LocalTransactionState: taken as UNKNOW", callback, state,
                    event="local_transaction_state_invalid")
        return LocalTransactionState.UNKNOW
    return state


__all__ = ["LocalTransactionState", "TransactionProducer", "TransactionSendResult"]
