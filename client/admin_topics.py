"""Admin's topic calls: create, change, delete and list topics, their routes and queues, and the
offsets a queue holds (RocketMQ's updateTopic, deleteTopic, topicList, topicRoute, topicStatus,
minOffset, maxOffset, searchOffset).

A topic lives on one or more brokers; calls about one topic go to the brokers its route names and
merge their answers. A mixin of Admin (tidemark.client.admin); use it through Admin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from tidemark.client.admin_base import AdminBase
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.connection import BrokerConnection
from tidemark.client.types import TopicConfig, TopicQueueStats, TopicRoute

__all__ = ["TopicAdmin"]


class TopicAdmin(AdminBase):
    """Topics, their routes and queues, and the offsets each queue holds."""

    def create_topic(self, name: str, queue_nums: int, *, brokers: Sequence[str] | None = None) -> list[TopicConfig]:
        """Create a topic with queue_nums queues on each named broker (default: every broker).

        Returns each broker's new config. AlreadyExistsError when a broker has the topic already (the
        brokers before it in the list keep theirs), InvalidArgumentError for a bad name or queue count,
        NotFoundError for an unknown broker name."""
        name = self._names.topic(name)

        async def go() -> list[TopicConfig]:
            conns = await self._brokers()
            targets = [await self.cluster.connection(b) for b in brokers] if brokers else list(conns.values())
            created = [await c.create_topic(name, queue_nums) for c in targets]
            self.cluster.forget_route(name)
            return created
        return self._run(go())

    def update_topic(self, name: str, **changes: Any) -> list[TopicConfig]:
        """Change a topic on every broker holding it; `changes` are any of read_queue_nums,
        write_queue_nums, readable, writable (RocketMQ's updateTopic).

        Returns each broker's new config. NotFoundError when no broker has the topic,
        InvalidArgumentError for a bad queue count, TypeError for another keyword."""
        name = self._names.topic(name)

        async def go() -> list[TopicConfig]:
            return [await c.update_topic(name, **changes) for c in await self._for_topic(name)]
        return self._run(go())

    def delete_topic(self, name: str) -> None:
        """Delete a topic on every broker holding it, with its messages, the groups' offsets on it and its
        queue locks. NotFoundError when no broker has the topic, InvalidArgumentError for one of the
        brokers' own topics (schedule, transactions)."""
        name = self._names.topic(name)

        async def go() -> None:
            for c in await self._for_topic(name):
                await c.delete_topic(name)
            self.cluster.forget_route(name)
        self._run(go())

    def list_topics(self, *, include_system: bool = False) -> dict[str, list[tuple[str, TopicConfig]]]:
        """topic -> [(broker name, config)] over every broker, sorted by topic; include_system adds the
        brokers' own topics (retry, dead-letter, schedule, transactions)."""
        async def go() -> dict[str, list[tuple[str, TopicConfig]]]:
            out: dict[str, list[tuple[str, TopicConfig]]] = {}
            for name, c in sorted((await self._brokers()).items()):
                for t in await c.list_topics(include_system=include_system):
                    out.setdefault(t.name, []).append((name, t))
            return dict(sorted(out.items()))
        return self._run(go())

    def route(self, topic: str) -> TopicRoute:
        """The topic's route, asked afresh: the brokers holding it, their queue counts and permissions.

        NotFoundError when no broker has the topic; UnavailableError when none that might have it
        answers."""
        return self._run(self.cluster.route(self._names.topic(topic), refresh=True))

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """Readable queues of a topic on every broker, sorted."""
        return self.route(topic).read_queues()

    def topic_stats(self, topic: str) -> list[TopicQueueStats]:
        """Min offset, max offset and last store time of every queue of the topic, on every broker holding
        it, sorted by queue (RocketMQ's topicStatus). NotFoundError when no broker has the topic."""
        topic = self._names.topic(topic)

        async def go() -> list[TopicQueueStats]:
            rows: list[TopicQueueStats] = []
            for c in await self._for_topic(topic):
                rows.extend(await c.topic_stats(topic))
            return sorted(rows, key=lambda r: r.queue)
        return self._run(go())

    # -- queue offsets -----------------------------------------------------------

    def min_offset(self, mq: MessageQueue) -> int:
        """The oldest offset the queue still holds (messages below it were deleted with their segments).

        NotFoundError when the queue's broker has no such topic, InvalidArgumentError for a queue id it
        does not have."""
        return self._run(self._call_mq(mq, "min_offset"))

    def max_offset(self, mq: MessageQueue) -> int:
        """The offset after the queue's last message readers can see (its next message's offset).

        NotFoundError when the queue's broker has no such topic, InvalidArgumentError for a queue id it
        does not have."""
        return self._run(self._call_mq(mq, "max_offset"))

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset of the queue whose message was stored at or after timestamp_ms (epoch
        milliseconds); the max offset when none was.

        InvalidArgumentError for a negative timestamp; NotFoundError as min_offset."""
        return self._run(self._call_mq(mq, "search_offset", timestamp_ms))

    async def _call_mq(self, mq: MessageQueue, method: str, *args: Any) -> Any:
        mq = self._names.queue(mq)
        return await self._read(mq, lambda c: getattr(c, method)(mq, *args))

    def offsets(self, mqs: Sequence[MessageQueue]) -> dict[MessageQueue, tuple[int, int]]:
        """(min offset, max offset) of many queues in one round of calls."""
        async def one(mq: MessageQueue) -> tuple[int, int]:
            mq = self._names.queue(mq)

            async def bounds(c: BrokerConnection) -> tuple[int, int]:
                return await c.min_offset(mq), await c.max_offset(mq)
            return await self._read(mq, bounds)

        async def go() -> dict[MessageQueue, tuple[int, int]]:
            values = await asyncio.gather(*(one(mq) for mq in mqs))
            return dict(zip(mqs, values, strict=True))
        return self._run(go())
