"""Admin: topics, offsets, groups and messages across every broker (RocketMQ's MQAdmin).

Synchronous; used by the `tidemark` CLI and the Spark connector's driver side.
Calls that concern a topic go to the brokers holding it and merge the answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from tidemark.client.dead_letters import Requeued, advanced, requeue_copy, requeue_start
from tidemark.client.errors import (
    ClientStateError,
    InvalidArgumentError,
    NotFoundError,
    TidemarkError,
)
from tidemark.client.message import MessageExt, MessageQueue, PullResult
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.client.remoting.connection import BrokerConnection
from tidemark.client.runtime import LoopThread
from tidemark.client.settings import ClientSettings, build
from tidemark.client.types import (
    AclRuleInfo,
    BrokerInfo,
    BrokerStatus,
    ClusterBroker,
    CommitOffsetsResult,
    GroupConfig,
    GroupDescription,
    GroupSummary,
    HalfMessage,
    OffsetChange,
    OffsetCommit,
    ProducerInfo,
    QueueStats,
    ResetTarget,
    TopicConfig,
    TopicQueueStats,
    TopicRoute,
    UserInfo,
)
from tidemark.logs import get_logger
from tidemark.protocol import dlq_topic

log = get_logger("tidemark.client.admin")

T = TypeVar("T")


class Admin:
    def __init__(self, settings: ClientSettings | None = None, /, **overrides: Any) -> None:
        self.settings: ClientSettings = build(ClientSettings, settings, overrides)  # type: ignore[assignment]
        self._loop = LoopThread("admin")
        self._cluster: BrokerCluster | None = None

    def start(self) -> Admin:
        if self._cluster is not None:
            return self
        self._loop.start()
        s = self.settings

        async def connect() -> BrokerCluster:
            cluster = BrokerCluster.for_settings(s)
            try:
                await cluster.discover()
            except BaseException:
                await cluster.close()
                raise
            return cluster

        try:
            self._cluster = self._loop.run(connect(), timeout=s.request_timeout_s * 2)
        except BaseException:
            self._loop.stop()
            raise
        return self

    def shutdown(self) -> None:
        if self._cluster is not None:
            cluster, self._cluster = self._cluster, None
            self._loop.run(cluster.close(), timeout=self.settings.request_timeout_s)
        self._loop.stop()

    def __enter__(self) -> Admin:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def cluster(self) -> BrokerCluster:
        if self._cluster is None:
            raise ClientStateError("admin client is not started")
        return self._cluster

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self._loop.run(coro, timeout=timeout or self.settings.request_timeout_s * 4 + 30)

    async def _brokers(self) -> dict[str, BrokerConnection]:
        return await self.cluster.discover()

    async def _for_topic(self, topic: str) -> list[BrokerConnection]:
        route = await self.cluster.route(topic, refresh=True)
        return [await self.cluster.connection(d.broker_name) for d in route.queue_datas]

    async def _conn(self, mq: MessageQueue) -> BrokerConnection:
        return await self.cluster.connection(mq.broker_name)

    async def _read(self, mq: MessageQueue, call: Callable[[BrokerConnection], Awaitable[T]]) -> T:
        """A read of the queue's broker that goes to its replica at once when it finds the master gone."""
        return await self.cluster.read(mq.broker_name, call)

    # -- brokers ---------------------------------------------------------------

    def brokers(self) -> list[BrokerInfo]:
        async def go() -> list[BrokerInfo]:
            return [await c.broker_info() for c in (await self._brokers()).values()]
        return self._run(go())

    def broker_status(self) -> list[BrokerStatus]:
        """Version, uptime, store size, flush mode, role, clients and counts of every broker (brokerStatus):
        replicas too, those the name servers know and those given in the broker list."""
        async def go() -> list[BrokerStatus]:
            addresses = [b.address for b in await self.cluster.cluster()]
            addresses += [a for a in self.settings.brokers or () if a not in addresses]
            found = [await self.cluster.connection_at(a).broker_status() for a in addresses]
            unique = {(s.broker_name, s.broker_id, s.broker_addr): s for s in found}
            return sorted(unique.values(), key=lambda s: (s.broker_name, s.broker_id))
        return self._run(go())

    def broker_status_at(self, address: str) -> BrokerStatus:
        """brokerStatus of the one broker at `address` (UnavailableError when it does not answer)."""
        async def go() -> BrokerStatus:
            return await self.cluster.connection_at(address).broker_status()
        return self._run(go())

    def cluster_list(self) -> list[ClusterBroker]:
        """Every broker with its cluster, role and last registration (see BrokerCluster.cluster)."""
        return self._run(self.cluster.cluster())

    def promote(self, address: str) -> BrokerInfo:
        """Make the replica at `address` the master of its broker name (`tidemark broker promote`)."""
        async def go() -> BrokerInfo:
            return await self.cluster.connection_at(address).promote()
        return self._run(go())

    def update_broker_permission(self, broker_name: str, *, readable: bool, writable: bool) -> BrokerInfo:
        async def go() -> BrokerInfo:
            return await (await self.cluster.connection(broker_name)).update_broker_permission(
                readable=readable, writable=writable)
        return self._run(go())

    def delete_expired_commitlog(self) -> int:
        async def go() -> int:
            return sum([await c.delete_expired_commitlog() for c in (await self._brokers()).values()])
        return self._run(go())

    # -- topics ----------------------------------------------------------------

    def create_topic(self, name: str, queue_nums: int, *, brokers: Sequence[str] | None = None) -> list[TopicConfig]:
        """Create a topic with queue_nums queues on each named broker (default: every broker)."""
        async def go() -> list[TopicConfig]:
            conns = await self._brokers()
            targets = [await self.cluster.connection(b) for b in brokers] if brokers else list(conns.values())
            created = [await c.create_topic(name, queue_nums) for c in targets]
            self.cluster.forget_route(name)
            return created
        return self._run(go())

    def update_topic(self, name: str, **changes: Any) -> list[TopicConfig]:
        async def go() -> list[TopicConfig]:
            return [await c.update_topic(name, **changes) for c in await self._for_topic(name)]
        return self._run(go())

    def delete_topic(self, name: str) -> None:
        async def go() -> None:
            for c in await self._for_topic(name):
                await c.delete_topic(name)
            self.cluster.forget_route(name)
        self._run(go())

    def list_topics(self, *, include_system: bool = False) -> dict[str, list[tuple[str, TopicConfig]]]:
        """topic -> [(broker name, config)] over every broker."""
        async def go() -> dict[str, list[tuple[str, TopicConfig]]]:
            out: dict[str, list[tuple[str, TopicConfig]]] = {}
            for name, c in sorted((await self._brokers()).items()):
                for t in await c.list_topics(include_system=include_system):
                    out.setdefault(t.name, []).append((name, t))
            return dict(sorted(out.items()))
        return self._run(go())

    def route(self, topic: str) -> TopicRoute:
        return self._run(self.cluster.route(topic, refresh=True))

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues of a topic on every broker, sorted."""
        return self.route(topic).read_queues()

    def topic_stats(self, topic: str) -> list[TopicQueueStats]:
        async def go() -> list[TopicQueueStats]:
            rows: list[TopicQueueStats] = []
            for c in await self._for_topic(topic):
                rows.extend(await c.topic_stats(topic))
            return sorted(rows, key=lambda r: r.queue)
        return self._run(go())

    # -- offsets ---------------------------------------------------------------

    def min_offset(self, mq: MessageQueue) -> int:
        return self._run(self._call_mq(mq, "min_offset"))

    def max_offset(self, mq: MessageQueue) -> int:
        return self._run(self._call_mq(mq, "max_offset"))

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._run(self._call_mq(mq, "search_offset", timestamp_ms))

    async def _call_mq(self, mq: MessageQueue, method: str, *args: Any) -> Any:
        return await self._read(mq, lambda c: getattr(c, method)(mq, *args))

    def offsets(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, tuple[int, int]]:
        """(min offset, max offset) of many queues in one round of calls."""
        async def one(mq: MessageQueue) -> tuple[int, int]:
            async def bounds(c: BrokerConnection) -> tuple[int, int]:
                return await c.min_offset(mq), await c.max_offset(mq)
            return await self._read(mq, bounds)

        async def go() -> dict[MessageQueue, tuple[int, int]]:
            values = await asyncio.gather(*(one(mq) for mq in mqs))
            return dict(zip(mqs, values, strict=True))
        return self._run(go())

    def committed(self, group: str, mq: MessageQueue) -> int:
        """The group's committed offset for a queue, -1 when none."""
        async def go() -> int:
            return (await self._read(mq, lambda c: c.query_consumer_offset(group, mq)))[0]
        return self._run(go())

    def commit(self, group: str, offsets: Mapping[MessageQueue, int], *, sync: bool = True) -> CommitOffsetsResult:
        """Commit offsets for a group (acknowledged per queue when sync, else over the oneway stream)."""
        async def go() -> CommitOffsetsResult:
            applied = rejected = 0
            rejections = []
            by_broker: dict[str, list[OffsetCommit]] = {}
            for mq, offset in offsets.items():
                by_broker.setdefault(mq.broker_name, []).append(OffsetCommit(group, mq, offset))
            for broker, commits in by_broker.items():
                conn = await self.cluster.connection(broker)
                if sync:
                    for c in commits:
                        await conn.update_consumer_offset(c)
                    applied += len(commits)
                else:
                    result = await conn.commit_offsets(commits)
                    applied += result.applied
                    rejected += result.rejected
                    rejections.extend(result.rejections)
            return CommitOffsetsResult(applied, rejected, rejections)
        return self._run(go())

    def reset_offset(self, group: str, topic: str, target: ResetTarget, value: int = 0, *,
                     queue: MessageQueue | None = None, dry_run: bool = False) -> list[OffsetChange]:
        async def go() -> list[OffsetChange]:
            if queue is not None:
                return await (await self._conn(queue)).reset_offset(
                    group, topic, target, value, queue_id=queue.queue_id, dry_run=dry_run)
            changes: list[OffsetChange] = []
            for c in await self._for_topic(topic):
                changes.extend(await c.reset_offset(group, topic, target, value, dry_run=dry_run))
            return sorted(changes, key=lambda ch: ch.queue)
        return self._run(go())

    def consume_stats(self, group: str, topic: str = "") -> list[QueueStats]:
        """Per-queue progress of a group on every broker (NotFoundError when no broker knows it)."""
        async def go() -> list[QueueStats]:
            rows: list[QueueStats] = []
            conns = await self._for_topic(topic) if topic else list((await self._brokers()).values())
            found = False
            for c in conns:
                try:
                    rows.extend(await c.consume_stats(group, topic))
                    found = True
                except NotFoundError:
                    continue
            if not found:
                raise NotFoundError(f"group {group!r} has no offsets on any broker")
            return sorted(rows, key=lambda r: r.queue)
        return self._run(go())

    # -- groups ----------------------------------------------------------------

    def list_transactions(self, group: str = "") -> list[HalfMessage]:
        """Half messages waiting for their transaction's end (of one producer group, if given), every broker."""
        async def go() -> list[HalfMessage]:
            found = [h for c in (await self._brokers()).values() for h in await c.list_transactions(group)]
            return sorted(found, key=lambda h: (h.broker_name, h.half_offset))
        return self._run(go())

    def list_producers(self, topic: str = "") -> list[ProducerInfo]:
        """Idempotent producers the brokers remember (of those that wrote to `topic`), broker by broker."""
        async def go() -> list[ProducerInfo]:
            conns = await self._for_topic(topic) if topic else list((await self._brokers()).values())
            found = [p for c in conns for p in await c.list_producers(topic)]
            return sorted(found, key=lambda p: (p.broker_name, p.producer_id))
        return self._run(go())

    def list_groups(self, topic: str = "") -> list[GroupSummary]:
        async def go() -> list[GroupSummary]:
            merged: dict[str, GroupSummary] = {}
            conns = await self._for_topic(topic) if topic else list((await self._brokers()).values())
            for c in conns:
                for g in await c.list_groups(topic):
                    prev = merged.get(g.group)
                    if prev is None:
                        merged[g.group] = g
                    else:
                        merged[g.group] = GroupSummary(g.group, tuple(sorted(set(prev.topics) | set(g.topics))),
                                                       max(prev.member_count, g.member_count),
                                                       prev.message_model if prev.member_count else g.message_model)
            return [merged[k] for k in sorted(merged)]
        return self._run(go())

    def describe_group(self, group: str) -> GroupDescription:
        async def go() -> GroupDescription:
            members: dict[str, Any] = {}
            locks = []
            found = False
            for c in (await self._brokers()).values():
                try:
                    d = await c.describe_group(group)
                except NotFoundError:
                    continue
                found = True
                members.update({m.client_id: m.merged(members.get(m.client_id)) for m in d.members})
                locks.extend(d.locks)
            if not found:
                raise NotFoundError(f"group {group!r} is unknown on every broker")
            return GroupDescription(group, tuple(members[k] for k in sorted(members)),
                                    tuple(sorted(locks, key=lambda lk: lk.queue)))
        return self._run(go())

    def consumer_ids(self, group: str) -> list[str]:
        async def go() -> list[str]:
            ids: set[str] = set()
            for c in (await self._brokers()).values():
                ids.update(await c.consumer_ids(group))
            return sorted(ids)
        return self._run(go())

    def delete_group(self, group: str) -> None:
        async def go() -> None:
            deleted = False
            for c in (await self._brokers()).values():
                try:
                    await c.delete_group(group)
                    deleted = True
                except NotFoundError:
                    continue
            if not deleted:
                raise NotFoundError(f"group {group!r} is unknown on every broker")
        self._run(go())

    def group_config(self, group: str) -> GroupConfig:
        async def go() -> GroupConfig:
            return await (await self.cluster.any_connection()).group_config(group)
        return self._run(go())

    def update_group_config(self, group: str, *, dry_run: bool = False, **changes: Any) -> list[GroupConfig]:
        """Change a group's settings on every broker (creating its config, as RocketMQ's updateSubGroup);
        every broker checks the change before any applies it. dry_run: the configs it would give."""
        async def go() -> list[GroupConfig]:
            conns = list((await self._brokers()).values())
            planned = [await c.update_group_config(group, dry_run=True, **changes) for c in conns]
            if dry_run:
                return planned
            return [await c.update_group_config(group, dry_run=False, **changes) for c in conns]
        return self._run(go())

    async def _on_topic_brokers(self, topic: str, call: Callable[[BrokerConnection, bool], Awaitable[list[T]]],
                                *, dry_run: bool, missing: str) -> list[T]:
        """call(conn, dry_run) on the brokers holding `topic`, a dry run on all of them first so a broker's
        refusal changes nothing anywhere; brokers answering NOT_FOUND are skipped (NotFoundError if all do)."""
        conns = []
        planned: list[T] = []
        for c in await self._for_topic(topic):
            try:
                planned.extend(await call(c, True))
                conns.append(c)
            except NotFoundError:
                continue
        if not conns:
            raise NotFoundError(missing)
        if dry_run:
            return planned
        return [row for c in conns for row in await call(c, False)]

    def delete_group_offsets(self, group: str, topic: str, *, dry_run: bool = False) -> list[OffsetChange]:
        """Remove a group's committed offsets of one topic (Kafka's --delete-offsets); refused
        (FailedPreconditionError) while live members of the group subscribe to the topic."""
        async def go() -> list[OffsetChange]:
            changes = await self._on_topic_brokers(
                topic, lambda c, dry: c.delete_group_offsets(group, topic, dry_run=dry), dry_run=dry_run,
                missing=f"group {group!r} has no offsets for topic {topic!r} on any broker")
            return sorted(changes, key=lambda ch: ch.queue)
        return self._run(go())

    def clone_group_offsets(self, src_group: str, dest_group: str, topic: str, *,
                            dry_run: bool = False) -> list[OffsetChange]:
        """dest_group's offsets of `topic` become src_group's (RocketMQ's cloneGroupOffset), as admin resets."""
        async def go() -> list[OffsetChange]:
            changes = await self._on_topic_brokers(
                topic, lambda c, dry: c.clone_group_offsets(src_group, dest_group, topic, dry_run=dry),
                dry_run=dry_run, missing=f"group {src_group!r} has no offsets for topic {topic!r} on any broker")
            return sorted(changes, key=lambda ch: ch.queue)
        return self._run(go())

    # -- messages --------------------------------------------------------------

    def pull(self, mq: MessageQueue, offset: int, *, max_nums: int = 32, suspend_ms: int = 0,
             subscription: str = "*") -> PullResult:
        """Read a queue without a group (nothing is committed)."""
        async def go() -> PullResult:
            return await self._read(mq, lambda c: c.pull("", mq, offset, max_nums=max_nums, suspend_ms=suspend_ms,
                                                         subscription=subscription))
        return self._run(go(), timeout=self.settings.request_timeout_s + suspend_ms / 1000 + 5)

    def view_message(self, mq: MessageQueue, offset: int) -> MessageExt:
        async def go() -> MessageExt:
            return await self._read(mq, lambda c: c.view_message(mq.topic, mq.queue_id, offset))
        return self._run(go())

    def query_message_by_id(self, msg_id: str, topic: str = "") -> list[MessageExt]:
        """Messages stored with this msg id (RocketMQ's queryMsgById): the original and any retry or
        dead-letter copy, oldest first, from the brokers holding `topic` (every broker without one).
        NotFoundError when none has it; InvalidArgumentError for a malformed id."""
        async def go() -> list[MessageExt]:
            conns = await self._for_topic(topic) if topic else list((await self._brokers()).values())
            found = [m for c in conns for m in await c.query_message_by_id(msg_id, topic)]
            if not found:
                where = f"topic {topic!r}" if topic else "any broker"
                raise NotFoundError(f"no message with msg id {msg_id} in {where}")
            return sorted(found, key=lambda m: (m.store_timestamp, m.broker_name, m.commit_log_offset))
        return self._run(go())

    def query_message_by_key(self, topic: str, key: str, begin_ms: int, end_ms: int,
                             max_num: int = 64) -> list[MessageExt]:
        async def go() -> list[MessageExt]:
            found: list[MessageExt] = []
            for c in await self._for_topic(topic):
                found.extend(await c.query_message_by_key(topic, key, begin_ms, end_ms, max_num))
            return sorted(found, key=lambda m: m.store_timestamp)[:max_num]
        return self._run(go())

    # -- dead letters ----------------------------------------------------------

    def dead_letters(self, group: str, limit: int = 1000) -> list[MessageExt]:
        """The messages in %DLQ%<group> (oldest first per queue), at most `limit`."""
        out: list[MessageExt] = []
        for mq, (low, high) in self.offsets(self._dlq_queues(group)).items():
            out.extend(self._read_queue(mq, low, high, limit - len(out)))
        return out[:limit]

    def _dlq_queues(self, group: str) -> list[MessageQueue]:
        topic = dlq_topic(group)
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
        async def go() -> Any:
            conn = await self.cluster.connection(message.broker_name)
            return await conn.send_back(group, message, delay_level=delay_level,
                                        max_reconsume_times=max_reconsume_times)
        return self._run(go())

    # -- users and ACL rules ---------------------------------------------------
    # Each broker keeps its own users and rules (RocketMQ's mqadmin applies them per broker or cluster):
    # changes go to every broker, or the named ones; lists say which brokers hold each entry.

    async def _targets(self, brokers: Sequence[str] | None) -> list[tuple[str, BrokerConnection]]:
        if brokers:
            return [(b, await self.cluster.connection(b)) for b in brokers]
        return sorted((await self._brokers()).items())

    async def _where_found(self, call: Callable[[BrokerConnection], Awaitable[T]]) -> list[tuple[str, T]]:
        """call() on every broker; the answers of those that did not answer NOT_FOUND (NotFoundError if none)."""
        found: list[tuple[str, T]] = []
        missing: NotFoundError | None = None
        for name, c in await self._targets(None):
            try:
                found.append((name, await call(c)))
            except NotFoundError as e:
                missing = e
        if not found and missing is not None:
            raise missing
        return found

    @staticmethod
    def _merge(entries: list[tuple[str, Any]]) -> list[Any]:
        """Equal entries from several brokers as one, with the brokers' names."""
        where: dict[Any, list[str]] = {}
        for broker, entry in entries:
            where.setdefault(entry, []).append(broker)
        return [replace(entry, brokers=tuple(brokers)) for entry, brokers in where.items()]

    def create_user(self, name: str, secret_key: str, *, super_user: bool = False,
                    brokers: Sequence[str] | None = None) -> UserInfo:
        """Create a user (access key `name`) on every broker, or the named ones."""
        async def go() -> UserInfo:
            done = [(b, await c.create_user(name, secret_key, super_user=super_user))
                    for b, c in await self._targets(brokers)]
            return self._merge(done)[0]
        return self._run(go())

    def update_user(self, name: str, *, secret_key: str | None = None,
                    super_user: bool | None = None) -> UserInfo:
        """Change a user's secret key and/or super-user flag on every broker that has the user."""
        async def go() -> UserInfo:
            return self._merge(await self._where_found(
                lambda c: c.update_user(name, secret_key=secret_key, super_user=super_user)))[0]
        return self._run(go())

    def delete_user(self, name: str) -> int:
        """Delete a user and its ACL rules on every broker that has it; the number of rules deleted."""
        async def go() -> int:
            return sum(n for _b, n in await self._where_found(lambda c: c.delete_user(name)))
        return self._run(go())

    def list_users(self) -> list[UserInfo]:
        async def go() -> list[UserInfo]:
            entries = [(b, u) for b, c in await self._targets(None) for u in await c.list_users()]
            return sorted(self._merge(entries), key=lambda u: (u.name, u.brokers))
        return self._run(go())

    def create_acl(self, user: str, resource: str, actions: Sequence[str], decision: str, *,
                   source_ips: Sequence[str] = (), brokers: Sequence[str] | None = None) -> AclRuleInfo:
        """Add a rule for `user` on every broker (or the named ones): resource `Topic:NAME`, `Topic:PREFIX*`,
        `Group:NAME`, `Cluster`...; actions Pub, Sub, Create, Update, Delete, Get, List, All; Allow or Deny."""
        async def go() -> AclRuleInfo:
            done = [(b, await c.create_acl(user, resource, actions, decision, source_ips))
                    for b, c in await self._targets(brokers)]
            return self._merge(done)[0]
        return self._run(go())

    def delete_acl(self, user: str, resource: str | None = None) -> int:
        """Delete a user's rules (all, or those on `resource`) on every broker; how many were deleted."""
        async def go() -> int:
            return sum(n for _b, n in await self._where_found(lambda c: c.delete_acl(user, resource)))
        return self._run(go())

    def list_acls(self, user: str | None = None) -> list[AclRuleInfo]:
        async def go() -> list[AclRuleInfo]:
            entries = [(b, r) for b, c in await self._targets(None) for r in await c.list_acls(user)]
            return self._merge(entries)
        return self._run(go())
