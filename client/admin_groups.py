"""Admin's consumer-group calls: a group's committed offsets and lag, resets, its members and its
config (RocketMQ's consumerProgress, resetOffsetByTime, consumerConnection, updateSubGroup,
deleteSubGroup, cloneGroupOffset).

A group's offsets live on the brokers holding its topics; its config on every broker. A mixin of
Admin (tidemark.client.admin); use it through Admin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from tidemark.client.admin_base import AdminBase
from tidemark.client.errors import NotFoundError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.connection import BrokerConnection
from tidemark.client.types import (
    CommitOffsetsResult,
    GroupConfig,
    GroupDescription,
    GroupSummary,
    OffsetChange,
    OffsetCommit,
    QueueStats,
    ResetTarget,
)

__all__ = ["GroupAdmin"]

T = TypeVar("T")


class GroupAdmin(AdminBase):
    """Consumer groups: offsets, progress, resets, members and config."""

    # -- offsets -----------------------------------------------------------------

    def committed(self, group: str, mq: MessageQueue) -> int:
        """The group's committed offset for a queue, -1 when none."""
        group, mq = self._names.group(group), self._names.queue(mq)

        async def go() -> int:
            return (await self._read(mq, lambda c: c.query_consumer_offset(group, mq)))[0]
        return self._run(go())

    def commit(self, group: str, offsets: Mapping[MessageQueue, int], *, sync: bool = True) -> CommitOffsetsResult:
        """Commit offsets for a group (acknowledged per queue when sync, else over the oneway stream)."""
        group, offsets = self._names.group(group), {self._names.queue(mq): o for mq, o in offsets.items()}

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
        """Move the group's committed offsets of `topic` (every queue on every broker holding it, or only
        `queue`) to `target`: EARLIEST or LATEST (value unused), TIMESTAMP (value in epoch ms: the first
        message stored at or after it), OFFSET (value itself, within each queue's [min, max]) or SHIFT_BY
        (value added to the committed offset, or to min without one, kept within [min, max]).

        A reset starts a new offset generation: running consumers of the group continue from the new
        offsets, and their commits of older positions are refused. dry_run: only say what would change.
        Returns the change of each queue (old offset -1: none was committed), sorted by queue.
        NotFoundError when no broker has the topic; InvalidArgumentError for an offset outside a queue's
        range or a negative timestamp. Brokers are reset one after another: one that refuses leaves
        those before it reset."""
        group, topic, queue = self._names.group(group), self._names.topic(topic), self._names.queue(queue)

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
        group, topic = self._names.group(group), self._names.topic(topic)

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
        group, topic = self._names.group(group), self._names.topic(topic)

        async def go() -> list[OffsetChange]:
            changes = await self._on_topic_brokers(
                topic, lambda c, dry: c.delete_group_offsets(group, topic, dry_run=dry), dry_run=dry_run,
                missing=f"group {group!r} has no offsets for topic {topic!r} on any broker")
            return sorted(changes, key=lambda ch: ch.queue)
        return self._run(go())

    def clone_group_offsets(self, src_group: str, dest_group: str, topic: str, *,
                            dry_run: bool = False) -> list[OffsetChange]:
        """dest_group's offsets of `topic` become src_group's (RocketMQ's cloneGroupOffset), as admin resets."""
        names = self._names
        src_group, dest_group, topic = names.group(src_group), names.group(dest_group), names.topic(topic)

        async def go() -> list[OffsetChange]:
            changes = await self._on_topic_brokers(
                topic, lambda c, dry: c.clone_group_offsets(src_group, dest_group, topic, dry_run=dry),
                dry_run=dry_run, missing=f"group {src_group!r} has no offsets for topic {topic!r} on any broker")
            return sorted(changes, key=lambda ch: ch.queue)
        return self._run(go())

    # -- groups ------------------------------------------------------------------

    def list_groups(self, topic: str = "") -> list[GroupSummary]:
        """Every group the brokers know (of those with offsets on `topic`, if given), sorted by name: its
        topics, its member count and message model, merged over the brokers.

        NotFoundError when `topic` is given and no broker has it."""
        topic = self._names.topic(topic)

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
        """A group's live members (client id, host, subscriptions, owned queues, model) merged over the
        brokers, the queue locks they hold (RocketMQ's consumerConnection), and for a pop group (RocketMQ 5
        clients) what each queue has in flight: received, not yet acked (`pop_queues`).

        NotFoundError when no broker knows the group."""
        group = self._names.group(group)

        async def go() -> GroupDescription:
            members: dict[str, Any] = {}
            locks, pop_queues = [], []
            found = False
            for c in (await self._brokers()).values():
                try:
                    d = await c.describe_group(group)
                except NotFoundError:
                    continue
                found = True
                members.update({m.client_id: m.merged(members.get(m.client_id)) for m in d.members})
                locks.extend(d.locks)
                pop_queues.extend(d.pop_queues)
            if not found:
                raise NotFoundError(f"group {group!r} is unknown on every broker")
            return GroupDescription(group, tuple(members[k] for k in sorted(members)),
                                    tuple(sorted(locks, key=lambda lk: lk.queue)),
                                    tuple(sorted(pop_queues, key=lambda p: p.queue)))
        return self._run(go())

    def consumer_ids(self, group: str) -> list[str]:
        """Client ids of the group's live members on any broker, sorted ([] when it has none)."""
        group = self._names.group(group)

        async def go() -> list[str]:
            ids: set[str] = set()
            for c in (await self._brokers()).values():
                ids.update(await c.consumer_ids(group))
            return sorted(ids)
        return self._run(go())

    def delete_group(self, group: str) -> None:
        """Delete a group's committed offsets and config on every broker (RocketMQ's deleteSubGroup).

        FailedPreconditionError while the group has live members; NotFoundError when no broker knows
        it."""
        group = self._names.group(group)

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
        """A group's settings (consume enabled, broadcast, retry queues, max retries, orderly) as one broker
        holds them. NotFoundError when that broker has no config for the group."""
        group = self._names.group(group)

        async def go() -> GroupConfig:
            return await (await self.cluster.any_connection()).group_config(group)
        return self._run(go())

    def update_group_config(self, group: str, *, dry_run: bool = False, **changes: Any) -> list[GroupConfig]:
        """Change a group's settings on every broker (creating its config, as RocketMQ's updateSubGroup);
        every broker checks the change before any applies it. dry_run: the configs it would give."""
        group = self._names.group(group)

        async def go() -> list[GroupConfig]:
            conns = list((await self._brokers()).values())
            planned = [await c.update_group_config(group, dry_run=True, **changes) for c in conns]
            if dry_run:
                return planned
            return [await c.update_group_config(group, dry_run=False, **changes) for c in conns]
        return self._run(go())
