"""Admin's message calls: read a queue without a group, look messages up by position, msg id or key,
move dead letters back, and see what producers left on the brokers (RocketMQ's queryMsgById,
queryMsgByKey, queryMsgByOffset, consumeMessage, the DLQ tools, and the transaction and idempotent
producer state).

Dead letters are read through the queues' offsets and requeued under a mark kept as the group's offset
on its DLQ, so this mixin builds on TopicAdmin and GroupAdmin. A mixin of Admin
(tidemark.client.admin); use it through Admin.
"""

from __future__ import annotations

import time
from typing import Any

from tidemark.client.admin_groups import GroupAdmin
from tidemark.client.admin_topics import TopicAdmin
from tidemark.client.dead_letters import Requeued, advanced, requeue_copy, requeue_start
from tidemark.client.errors import InvalidArgumentError, NotFoundError, TidemarkError
from tidemark.client.message import MessageExt, MessageQueue, PullResult
from tidemark.client.selector import MessageSelector
from tidemark.client.types import Delivery, HalfMessage, ProducerInfo
from tidemark.common.logs import get_logger
from tidemark.common.protocol import dlq_topic

__all__ = ["MessageAdmin"]

log = get_logger("tidemark.client.admin")


class MessageAdmin(TopicAdmin, GroupAdmin):
    """Messages: group-less reads, lookups, dead letters, send-back, half messages and producers."""

    def pull(self, mq: MessageQueue, offset: int, *, max_nums: int = 32, suspend_ms: int = 0,
             subscription: str | MessageSelector = "*") -> PullResult:
        """Read a queue without a group (nothing is committed); `subscription` a tag expression or a
        MessageSelector (`MessageSelector.by_sql(...)`: only the messages whose properties satisfy it)."""
        selector, mq = MessageSelector.of(subscription), self._names.queue(mq)

        async def go() -> PullResult:
            return await self._read(mq, lambda c: c.pull("", mq, offset, max_nums=max_nums, suspend_ms=suspend_ms,
                                                         subscription=selector.expression,
                                                         expression_type=selector.expression_type))
        return self._run(go(), timeout=self.settings.request_timeout_s + suspend_ms / 1000 + 5)

    def view_message(self, mq: MessageQueue, offset: int) -> MessageExt:
        """The message at `offset` of a queue (RocketMQ's queryMsgByOffset).

        NotFoundError when the queue holds no message there (the error says which offsets it holds)
        or its broker has no such topic; InvalidArgumentError for a negative offset or a queue id the
        topic does not have."""
        mq = self._names.queue(mq)

        async def go() -> MessageExt:
            return await self._read(mq, lambda c: c.view_message(mq.topic, mq.queue_id, offset))
        return self._run(go())

    def query_message_by_id(self, msg_id: str, topic: str = "") -> list[MessageExt]:
        """Messages stored with this msg id (RocketMQ's queryMsgById): the original and any retry or
        dead-letter copy, oldest first, from the brokers holding `topic` (every broker without one).
        NotFoundError when none has it; InvalidArgumentError for a malformed id."""
        topic = self._names.topic(topic)

        async def go() -> list[MessageExt]:
            conns = await self._for_topic(topic) if topic else list((await self._brokers()).values())
            found = [m for c in conns for m in await c.query_message_by_id(msg_id, topic)]
            if not found:
                where = f"topic {topic!r}" if topic else "any broker"
                raise NotFoundError(f"no message with msg id {msg_id} in {where}")
            return sorted(found, key=lambda m: (m.store_timestamp, m.broker_name, m.commit_log_offset))
        return self._run(go())

    def deliveries(self, mq: MessageQueue, offset: int) -> list[Delivery]:
        """The recent reads that handed the message at `offset` of a queue to a group's client: group, client
        id, when (a Delivery each, oldest first). The broker keeps the last few dozen reads per queue, in
        memory, so an older delivery is not there. InvalidArgumentError for a negative offset or a queue id
        the topic does not have; NotFoundError when the queue's broker has no such topic."""
        mq = self._names.queue(mq)

        async def go() -> list[Delivery]:
            return await self._read(mq, lambda c: c.deliveries(mq.topic, mq.queue_id, offset))
        return self._run(go())

    def query_message_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int,
                             max_num: int = 64) -> list[MessageExt]:
        """Messages of `topic` whose keys include `key`, stored between begin_ms and end_ms (epoch ms;
        end_ms 0: now), oldest first, at most max_num (RocketMQ's queryMsgByKey). There is no key index:
        each broker scans its queues from begin_ms, so a long range costs more.

        [] when none matches; NotFoundError when no broker has the topic; InvalidArgumentError for an
        empty key or an empty or negative range."""
        topic = self._names.topic(topic)

        async def go() -> list[MessageExt]:
            found: list[MessageExt] = []
            for c in await self._for_topic(topic):
                found.extend(await c.query_message_by_key(topic, key, begin_ms, end_ms, max_num))
            return sorted(found, key=lambda m: m.store_timestamp)[:max_num]
        return self._run(go())

    # -- dead letters --------------------------------------------------------------

    def dead_letters(self, group: str, limit: int = 1000) -> list[MessageExt]:
        """The messages in %DLQ%<group> (oldest first per queue), at most `limit`."""
        out: list[MessageExt] = []
        for mq, (low, high) in self.offsets(self._dlq_queues(group)).items():
            out.extend(self._read_queue(mq, low, high, limit - len(out)))
        return out[:limit]

    def _dlq_queues(self, group: str) -> list[MessageQueue]:
        topic = dlq_topic(self._names.group(group))
        try:
            return self.fetch_message_queues(topic)
        except NotFoundError:
            raise NotFoundError(f"group {group!r} has no dead-letter queue ({topic} does not exist)") from None

    def _read_queue(self, mq: MessageQueue, offset: int, high: int, limit: int) -> list[MessageExt]:
        out: list[MessageExt] = []
        while offset < high and len(out) < limit:
            result = self.pull(mq, offset, max_nums=64)
            out.extend(result.messages)
            if result.next_begin_offset <= offset:
                break
            offset = result.next_begin_offset
        return out[:limit]

    def requeue_dead_letters(self, group: str, msg_id: str | None = None, *, dry_run: bool = False) -> list[Requeued]:
        """Send DLQ messages back to their original topics as fresh copies (dry_run: only say which, and where
        they wait): every one past the mark, or the one with msg_id (even if it was requeued before). The
        group's offset on its DLQ is the mark (tidemark.client.dead_letters): it moves over what was sent
        from it, so requeueing all twice sends nothing the second time. A message sent alone by msg_id past
        the mark is sent again by a later requeue of all; two requeues of all at once may send the same ones."""
        group = self._names.group(group)
        ranges = self.offsets(self._dlq_queues(group))
        marks = {mq: requeue_start(low, self.committed(group, mq)) for mq, (low, _high) in ranges.items()}
        if msg_id is None:
            dead = [m for mq, mark in marks.items() for m in self._read_queue(mq, mark, ranges[mq][1], 1_000_000)]
        else:
            dead = [m for m in self.dead_letters(group, limit=1_000_000) if m.msg_id == msg_id]
            if not dead:
                raise InvalidArgumentError(f"no message with msg id {msg_id} in {dlq_topic(group)}")
        if dry_run:
            return [Requeued(m.msg_id, requeue_copy(m).topic, m.message_queue, m.queue_offset) for m in dead]
        if dead:
            self.commit(group, marks)  # a requeue that may not record what it sent (ACLs) sends nothing
        moved: dict[MessageQueue, int] = {}

        async def go() -> list[Requeued]:
            out = []
            for m in dead:
                copy = requeue_copy(m)
                queues = await self.cluster.await_write_queues(
                    copy.topic, time.monotonic() + self.settings.request_timeout_s)
                target = queues[len(out) % len(queues)]
                conn = await self.cluster.master_connection(target.broker_name)
                (result,) = await conn.send(copy.topic, [copy], queue_id=target.queue_id)
                out.append(Requeued(m.msg_id, copy.topic, result.message_queue, result.queue_offset))
                mq = MessageQueue(m.topic, m.broker_name, m.queue_id)
                mark = advanced(moved.get(mq, marks[mq]), m.queue_offset)
                if mark != marks[mq]:
                    moved[mq] = mark
            return out
        try:
            out = self._run(go(), timeout=self.settings.request_timeout_s * (len(dead) + 4) + 30)
        except BaseException:
            if moved:  # also after a failure: what was sent stays sent, and the failure is what the user sees
                try:
                    self.commit(group, moved)
                except TidemarkError as e:
                    log.warning("requeued dead letters could not be marked: a later requeue sends them again",
                                event="dlq_mark_failed", group=group, error=str(e))
            raise
        if moved:
            self.commit(group, moved)
        return out

    def send_back(self, group: str, message: MessageExt, *, delay_level: int = 0,
                  max_reconsume_times: int = 0) -> Any:
        """Hand a consumed message back for redelivery to `group`, as a consumer's failed message is
        (RocketMQ's consumerSendMsgBack): a copy goes to %RETRY%<group> after the delay of `delay_level`
        (0: level 3 plus the times it was reconsumed, capped at the last level), or to %DLQ%<group> once it
        has been reconsumed max_reconsume_times (0: the group's retry_max_times) or when delay_level < 0.

        Returns a SendBackResult: the topic, queue, offset, delay level and reconsume times of the copy.
        NotFoundError when the message's broker no longer holds it; InvalidArgumentError for a negative
        max_reconsume_times."""
        group = self._names.group(group)

        async def go() -> Any:
            conn = await self.cluster.connection(message.broker_name)
            return await conn.send_back(group, message, delay_level=delay_level,
                                        max_reconsume_times=max_reconsume_times)
        return self._run(go())

    # -- what producers left on the brokers ---------------------------------------

    def list_transactions(self, group: str = "") -> list[HalfMessage]:
        """Half messages waiting for their transaction's end (of one producer group, if given), every broker."""
        group = self._names.group(group)

        async def go() -> list[HalfMessage]:
            found = [h for c in (await self._brokers()).values() for h in await c.list_transactions(group)]
            return sorted(found, key=lambda h: (h.broker_name, h.half_offset))
        return self._run(go())

    def list_producers(self, topic: str = "") -> list[ProducerInfo]:
        """Idempotent producers the brokers remember (of those that wrote to `topic`), broker by broker."""
        topic = self._names.topic(topic)

        async def go() -> list[ProducerInfo]:
            conns = await self._for_topic(topic) if topic else list((await self._brokers()).values())
            found = [p for c in conns for p in await c.list_producers(topic)]
            return sorted(found, key=lambda p: (p.broker_name, p.producer_id))
        return self._run(go())
