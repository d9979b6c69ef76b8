"""A master whose write timed out or was refused as not the master's is suspect: the next writes find out
where to go before they are sent (client/remoting/cluster.py `_resolve`): back to it once it answers as a
writable master, to the new master once the name servers name one (a takeover in controller mode), and
one look at a time however many senders wait."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from tidemark.client.errors import RequestTimeoutError
from tidemark.client.remoting.cluster import BrokerCluster


class FakeConn:
    def __init__(self, address: str, *, answers: bool, writable: bool = True) -> None:
        self.address, self.broker_name = address, "broker-a"
        self.answers, self.writable, self.asked = answers, writable, 0

    async def broker_info(self, *, timeout=None):
        self.asked += 1
        if not self.answers:
            raise RequestTimeoutError(f"broker {self.address}: no answer")
        return SimpleNamespace(writable=self.writable, fenced="", broker_id=0)


def cluster_with(old: FakeConn, new: FakeConn, *, moves_after: int) -> tuple[BrokerCluster, list[int]]:
    cluster = BrokerCluster([], timeout_s=3.0)
    cluster.namesrv = object()  # only asked through discover(), replaced below
    cluster._by_name["broker-a"] = old
    looks = [0]

    async def discover(*, refresh: bool = False):
        looks[0] += 1
        if looks[0] >= moves_after:
            cluster._by_name["broker-a"] = new  # the name servers name the elected master
        return dict(cluster._by_name)

    cluster.discover = discover
    return cluster, looks


def test_writes_go_to_the_master_the_name_servers_name_once_they_name_a_new_one():
    async def go():
        old, new = FakeConn("old:1", answers=False), FakeConn("new:1", answers=True)
        cluster, looks = cluster_with(old, new, moves_after=3)
        cluster.suspect("broker-a")
        conns = await asyncio.gather(*(cluster.master_connection("broker-a") for _ in range(5)))
        assert all(c is new for c in conns) and looks[0] == 3
        assert old.asked == 3, "one look at a time, not one per waiting sender"
        assert await cluster.master_connection("broker-a") is new and looks[0] == 3  # no longer suspect
    asyncio.run(go())


def test_a_suspect_master_that_answers_as_a_writable_master_keeps_the_writes():
    async def go():
        old, new = FakeConn("old:1", answers=True), FakeConn("new:1", answers=True)
        cluster, looks = cluster_with(old, new, moves_after=1)
        cluster.suspect("broker-a")
        assert await cluster.master_connection("broker-a") is old and looks[0] == 0
    asyncio.run(go())


def test_a_master_unsure_of_its_lease_is_passed_over_once_another_is_named():
    async def go():
        old, new = FakeConn("old:1", answers=True, writable=False), FakeConn("new:1", answers=True)
        cluster, looks = cluster_with(old, new, moves_after=2)
        cluster.suspect("broker-a")
        assert await cluster.master_connection("broker-a") is new and looks[0] == 2
    asyncio.run(go())
