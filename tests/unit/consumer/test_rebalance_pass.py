"""RebalanceService's pass against a scripted cluster (no gRPC): each topic is rebalanced as soon as its own
route is there, so a route still on its way (a joining member's retry topic) never holds up the queues of
the others, and a pass cut short leaves no route request running."""

from __future__ import annotations

import asyncio

from tidemark.client.consumer.allocate import AllocateMessageQueueAveragely
from tidemark.client.consumer.rebalance import RebalanceService
from tidemark.client.errors import NotFoundError
from tidemark.client.message import MessageModel
from tidemark.client.types import QueueData, TopicRoute

RETRY = "%RETRY%g"


def route(topic: str, queues: int) -> TopicRoute:
    return TopicRoute(topic, (QueueData("broker-a", "127.0.0.1:1", queues, queues, True, True),))


class ScriptedCluster:
    """Routes answered at once, except those held until released (one event per topic)."""

    def __init__(self, held: set[str] = frozenset()) -> None:
        self.held = {topic: asyncio.Event() for topic in held}
        self.routes_asked: list[str] = []
        self.cancelled: list[str] = []

    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        self.routes_asked.append(topic)
        event = self.held.get(topic)
        if event is not None:
            try:
                await event.wait()
            except asyncio.CancelledError:
                self.cancelled.append(topic)
                raise
        if topic == "Gone":
            raise NotFoundError(f"topic {topic} does not exist")
        return route(topic, 4 if topic != RETRY else 1)


class RecordingOwnership:
    def __init__(self) -> None:
        self.updates: list[tuple[str, set]] = []
        self.updated = asyncio.Event()

    async def update(self, topic, target) -> bool:
        self.updates.append((topic, {mq.queue_id for mq in target}))
        self.updated.set()
        return bool(target)

    async def settle(self) -> None:
        pass


def service(cluster, ownership, topics, on_allocated=lambda topic, mine: None) -> RebalanceService:
    return RebalanceService(cluster=cluster, group="g", client_id="c1", model=MessageModel.CLUSTERING,
                            strategy=AllocateMessageQueueAveragely(), ownership=ownership,
                            topics=lambda: list(topics), known_members=lambda broker: ["c1", "c2"],
                            on_allocated=on_allocated)


def test_a_topic_is_rebalanced_while_another_topic_s_route_is_still_on_its_way():
    async def scenario():
        cluster, ownership = ScriptedCluster(held={RETRY}), RecordingOwnership()
        rebalance = service(cluster, ownership, ["T", RETRY])
        pass_ = asyncio.ensure_future(rebalance.do_rebalance(fast=True))
        await asyncio.wait_for(ownership.updated.wait(), 5)
        assert ownership.updates == [("T", {0, 1})]  # AVG over c1, c2: c1 takes the first half
        assert cluster.routes_asked == ["T", RETRY]  # asked for together, before T was rebalanced
        assert not pass_.done()
        cluster.held[RETRY].set()
        await asyncio.wait_for(pass_, 5)
        assert [topic for topic, _ in ownership.updates] == ["T", RETRY]  # retry topics still come last
    asyncio.run(scenario())


def test_a_missing_topic_hands_its_queues_back_and_the_pass_goes_on():
    async def scenario():
        cluster, ownership = ScriptedCluster(), RecordingOwnership()
        allocated: list[tuple[str, set]] = []
        await service(cluster, ownership, ["Gone", "T"],
                      lambda topic, mine: allocated.append((topic, {mq.queue_id for mq in mine}))).do_rebalance(
                          fast=True)
        assert ownership.updates == [("Gone", set()), ("T", {0, 1})]
        assert allocated == [("Gone", set()), ("T", {0, 1})]  # (the fetcher closes what it opened ahead)
    asyncio.run(scenario())


def test_a_pass_cut_short_leaves_no_route_request_running():
    async def scenario():
        cluster, ownership = ScriptedCluster(held={"A", "B"}), RecordingOwnership()
        pass_ = asyncio.ensure_future(service(cluster, ownership, ["A", "B"]).do_rebalance(fast=True))
        while len(cluster.routes_asked) < 2:
            await asyncio.sleep(0)
        pass_.cancel()
        await asyncio.gather(pass_, return_exceptions=True)
        assert pass_.cancelled()
        assert sorted(cluster.cancelled) == ["A", "B"]  # both requests ended with the pass
        assert ownership.updates == []
    asyncio.run(scenario())
