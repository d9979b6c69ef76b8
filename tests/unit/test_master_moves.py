"""When another address serves a broker name (an elected master), every part of a client hears of it at once
(client/remoting/moves.py), a failed call makes the cluster ask the name servers in the background, and the
replicas known for the name stop listing the new master (a later failover of the new master never goes to
the new master itself)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tidemark.client.errors import RequestTimeoutError, UnavailableError
from tidemark.client.remoting.cluster import PROBE_INTERVAL_S, BrokerCluster
from tidemark.client.remoting.moves import MasterMoves


class FakeConn:
    def __init__(self, address: str, *, answers: bool) -> None:
        self.address, self.broker_name, self.answers = address, "broker-a", answers

    async def broker_info(self, *, timeout=None):
        if not self.answers:
            raise RequestTimeoutError(f"broker {self.address}: no answer")
        return SimpleNamespace(writable=True, fenced="", broker_id=0)


def test_a_call_standing_on_a_moved_master_is_given_up_and_one_that_answers_first_keeps_its_answer():
    async def go():
        moves = MasterMoves()
        stuck = asyncio.ensure_future(moves.until("broker-a", asyncio.sleep(60)))
        other = asyncio.ensure_future(moves.until("broker-b", asyncio.sleep(60)))
        await asyncio.sleep(0)
        moves.tell("broker-a", "new:1")
        with pytest.raises(UnavailableError, match="moved to new:1") as e:
            await stuck
        assert e.value.retriable and not other.done()  # another name's call goes on
        other.cancel()
        assert await moves.until("broker-a", asyncio.sleep(0, result=7)) == 7
        assert not moves._listeners, "every call stops listening when it ends"
    asyncio.run(go())


def test_a_failed_call_makes_the_cluster_ask_at_once_and_the_move_is_told_with_the_replicas_put_right():
    async def go():
        cluster = BrokerCluster([], timeout_s=3.0)
        cluster.namesrv = object()  # only asked through discover(), replaced below
        old, new = FakeConn("old:1", answers=False), FakeConn("new:1", answers=True)
        cluster._by_name["broker-a"] = old
        cluster._by_address["new:1"] = new
        cluster._replicas["broker-a"] = ["new:1", "other:1"]  # the view from before the election

        async def discover(*, refresh: bool = False):
            cluster._adopt("broker-a", "new:1")  # the name servers name the elected master
            return dict(cluster._by_name)

        cluster.discover = discover
        heard: list[tuple[str, str]] = []
        cluster.moves.listen(lambda name, address: heard.append((name, address)))
        cluster._failed(old, UnavailableError("broker old:1: no answer"))  # what BrokerConnection.error reports
        assert heard == []  # asked in the background, not inside the failing call
        assert await cluster.connection("broker-a") is new  # waits for the look under way
        assert heard == [("broker-a", "new:1")]
        assert cluster._replicas["broker-a"] == ["other:1"], "the new master is not its own replica"
        assert "broker-a" not in cluster._suspect
    asyncio.run(go())


def test_a_refresh_asked_while_a_discovery_is_under_way_asks_again_once_it_ends():
    """discover(refresh=True) joined a discovery that had asked the name servers before the master moved,
    and so read the old view (a kept reader went back to the old master's address)."""
    async def go():
        cluster = BrokerCluster([], timeout_s=3.0)
        views = iter(["old:1", "new:1"])  # what the name servers say, ask after ask
        answer = asyncio.Event()
        asked: list[str] = []

        class Namesrv:
            async def cluster(self):
                address = next(views)
                asked.append(address)
                if address == "old:1":
                    await answer.wait()  # the ask before the move, still under way
                return [SimpleNamespace(broker_name="broker-a", broker_id=0, address=address)]

        cluster.namesrv = Namesrv()
        cluster._connect = lambda address: FakeConn(address, answers=True)
        before = asyncio.ensure_future(cluster.discover())
        await asyncio.sleep(0)
        after = asyncio.ensure_future(cluster.discover(refresh=True))  # a new master was named meanwhile
        await asyncio.sleep(0)
        answer.set()
        assert (await before)["broker-a"].address == "old:1"
        assert (await after)["broker-a"].address == "new:1" and asked == ["old:1", "new:1"]
    asyncio.run(go())


def test_a_failover_to_the_replica_and_the_failback_to_the_master_are_told_as_moves():
    """The failback was not told (the fault checker's controller scenario, seed 21912): a consumer kept its
    fetch stream on the replica, opened there the queues it then locked on the master, and they waited for
    a lock the replica never grants, unread until shutdown."""
    async def go():
        cluster = BrokerCluster([], timeout_s=3.0)
        master, replica = FakeConn("master:1", answers=False), FakeConn("replica:1", answers=True)
        cluster._by_name["broker-a"] = cluster._by_address["master:1"] = master
        cluster._by_address["replica:1"] = replica
        cluster._replicas["broker-a"] = ["replica:1"]
        heard: list[tuple[str, str]] = []
        cluster.moves.listen(lambda name, address: heard.append((name, address)))

        cluster._unavailable(master)  # a call found the master unreachable
        assert heard == [("broker-a", "replica:1")]
        assert await cluster.connection("broker-a") is replica
        cluster._down["broker-a"] -= PROBE_INTERVAL_S  # probed again: still away
        assert await cluster.connection("broker-a") is replica and len(heard) == 1

        master.answers = True
        cluster._down["broker-a"] -= PROBE_INTERVAL_S
        assert await cluster.connection("broker-a") is master  # it answers again
        assert heard == [("broker-a", "replica:1"), ("broker-a", "master:1")]
    asyncio.run(go())
