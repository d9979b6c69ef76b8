"""The Fetcher reads each broker name where the cluster says it is served now: when that changes (a
failover to the replica, the master back or a new one elected), queues that reopen go to the new address
and the ones still on the old stream move with them; a stream is never kept on an address that no
longer serves the name (a replica knows none of the master's locks: every fetch there would be fenced).
When the cluster learns of a new address (`moves`), a stream standing silent on the old one moves at once,
and queues waiting out a reconnect backoff reopen at once (issue 29: clients follow at once)."""

from __future__ import annotations

import asyncio

from tidemark.client.consumer.fetcher import Fetcher, FetchLimits
from tidemark.client.consumer.lease import QueueLease
from tidemark.client.errors import FencedError, UnavailableError
from tidemark.client.message import MessageQueue
from tidemark.client.remoting.moves import MasterMoves
from tidemark.client.remoting.streams import QueueEnd


class FakeStream:
    def __init__(self, address: str) -> None:
        self.address, self.usable, self.opened, self.closed = address, True, [], False

    def open_queue(self, handle, group, mq, offset, **kw) -> None:
        self.opened.append((handle, mq.queue_id, offset))

    def close_queue(self, handle) -> None:
        pass

    def credit(self, *a, **kw) -> None:
        pass

    async def close(self) -> None:
        self.closed, self.usable = True, False


class FakeConnection:
    def __init__(self, address: str, streams: list[FakeStream]) -> None:
        self.address, self._streams = address, streams

    def open_fetch_stream(self, **callbacks) -> FakeStream:
        stream = FakeStream(self.address)
        self._streams.append(stream)
        return stream


class FakeCluster:
    """Serves broker-a at `serving` (what BrokerCluster.connection says: master, or replica while away)."""

    def __init__(self) -> None:
        self.streams: list[FakeStream] = []
        self.serving = "master:1"
        self.moves = MasterMoves()
        self.suspected: list[str] = []

    async def connection(self, broker: str) -> FakeConnection:
        return FakeConnection(self.serving, self.streams)

    def suspect(self, broker: str) -> None:
        self.suspected.append(broker)

    def move(self, address: str) -> None:
        """What BrokerCluster does when the name servers name another master of broker-a."""
        self.serving = address
        self.moves.tell("broker-a", address)


class Sink:
    def on_messages(self, *a) -> None:
        pass

    def on_ended(self, *a) -> None:
        pass


def lease(queue_id: int) -> QueueLease:
    return QueueLease(MessageQueue("T", "broker-a", queue_id), client_id="c", owner_epoch=1, reset_generation=None,
                      start_offset=0)


def test_queues_follow_the_address_that_serves_the_broker_now():
    async def go() -> None:
        cluster = FakeCluster()
        fetcher = Fetcher(cluster=cluster, group="g", subscription=lambda t: "*",
                          limits=FetchLimits(100, 1 << 20, None, 32), sink=Sink(), offset_store=None)
        a, b, c = lease(0), lease(1), lease(2)
        await fetcher.start(a, 10)
        await fetcher.start(b, 20)
        [first] = cluster.streams
        assert first.address == "master:1" and [q for _, q, _ in first.opened] == [0, 1]

        cluster.serving = "replica:2"  # failed over: a queue reopened now goes to the replica ...
        await fetcher.start(c, 30)
        await asyncio.sleep(0)  # ... and the queues of the old stream move there too
        await asyncio.sleep(0)
        second = cluster.streams[-1]
        assert second.address == "replica:2" and first.closed
        assert sorted((q, o) for _, q, o in second.opened) == [(0, 10), (1, 20), (2, 30)]

        cluster.serving = "master:1"  # failed back: the next reopen (a queue the replica ended) brings all home
        handle = next(h for h, q, _ in second.opened if q == 0)
        fetcher._on_ended(handle, QueueEnd("ERROR", error=FencedError("no owner epoch on this broker")))
        fetcher.retry(a, 0.0)
        for _ in range(4):
            await asyncio.sleep(0)
        third = cluster.streams[-1]
        assert third.address == "master:1" and second.closed
        assert sorted(q for _, q, _ in third.opened) == [0, 1, 2]
        await fetcher.close()

    asyncio.run(go())


def fetcher_on(cluster: FakeCluster) -> Fetcher:
    return Fetcher(cluster=cluster, group="g", subscription=lambda t: "*",
                   limits=FetchLimits(100, 1 << 20, None, 32), sink=Sink(), offset_store=None)


async def settle() -> None:
    for _ in range(6):
        await asyncio.sleep(0)


def test_a_silent_stream_moves_as_soon_as_the_cluster_names_a_new_master():
    """A paused master never breaks the stream: without the cluster's word it would stay there for good."""
    async def go() -> None:
        cluster = FakeCluster()
        fetcher = fetcher_on(cluster)
        await fetcher.start(lease(0), 10)
        [first] = cluster.streams
        cluster.move("elected:3")
        await settle()
        second = cluster.streams[-1]
        assert second.address == "elected:3" and first.closed and [(q, o) for _, q, o in second.opened] == [(0, 10)]
        await fetcher.close()

    asyncio.run(go())


def test_a_broken_stream_makes_its_broker_suspect_and_a_move_ends_the_backoff():
    async def go() -> None:
        cluster = FakeCluster()
        fetcher = fetcher_on(cluster)
        fetcher._failures["broker-a"] = 8  # a backoff grown to its 3 s cap by earlier failures
        await fetcher.start(lease(0), 10)
        [first] = cluster.streams
        fetcher._on_broken("broker-a", first, UnavailableError("broker master:1: Socket closed"))
        assert cluster.suspected == ["broker-a"], "the cluster asks the name servers where the master is now"
        await settle()
        assert len(cluster.streams) == 1, "waiting out the backoff"
        cluster.move("elected:3")
        await settle()
        second = cluster.streams[-1]
        assert second.address == "elected:3" and [(q, o) for _, q, o in second.opened] == [(0, 10)]
        await fetcher.close()

    asyncio.run(go())


def test_two_reopens_of_one_queue_open_it_once():
    """Regression (review): a refusal's retry and a broken stream's reopen of the same queue, both released
    by one move, each opened it after waiting for the connection: two broker handles, every record twice."""
    class Looking(FakeCluster):
        async def connection(self, broker: str) -> FakeConnection:
            await asyncio.sleep(0.01)  # BrokerCluster.connection waits for a name-server lookup under way
            return await super().connection(broker)

    async def go() -> None:
        cluster = Looking()
        fetcher = fetcher_on(cluster)
        a = lease(0)
        await fetcher.start(a, 10)
        [first] = cluster.streams
        handle = first.opened[0][0]
        fetcher._on_ended(handle, QueueEnd("ERROR", error=UnavailableError("not the master any more")))
        fetcher.retry(a, 3.0)  # the refusal's reopen, waiting ...
        fetcher._on_broken("broker-a", first, UnavailableError("broker master:1: Socket closed"))  # ... and this one
        await settle()
        cluster.move("elected:3")  # wakes both
        await asyncio.sleep(0.1)
        opened = [q for s in cluster.streams[1:] for _, q, _ in s.opened]
        assert opened == [0], f"queue 0 opened {len(opened)} times on the new master"
        await fetcher.close()

    asyncio.run(go())
