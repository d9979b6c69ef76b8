"""GroupMembership against a scripted broker (no gRPC): while a watch is open its pushes are the member
list; a heartbeat's answer that a push overtook never puts an older list back."""

from __future__ import annotations

import asyncio
import logging

from tidemark.client.consumer.membership import GroupMembership, HeartbeatData
from tidemark.client.errors import UnavailableError


class ScriptedBroker:
    broker_name = "broker-a"
    address = "127.0.0.1:1"

    def __init__(self) -> None:
        self.heartbeat_answer = ["c1"]
        self.pushes: asyncio.Queue[list[str]] = asyncio.Queue()

    async def discover(self):
        return {self.broker_name: self}

    async def serving(self):  # the cluster's view with failover: the same single broker here
        return {self.broker_name: self}

    async def connection(self, name):
        return self

    async def heartbeat(self, **kw) -> list[str]:
        return list(self.heartbeat_answer)

    async def watch_consumer_ids(self, group, client_id):
        while True:
            yield await self.pushes.get()


def test_a_heartbeat_answer_overtaken_by_a_push_does_not_put_an_older_list_back():
    async def scenario():
        broker = ScriptedBroker()
        changes = []
        data = HeartbeatData((("T", "*"),), "CLUSTERING", "CONSUME_PASSIVELY", False, (), "AVG")
        m = GroupMembership(cluster=broker, group="g", client_id="c1", data=lambda: data,
                            on_change=lambda: changes.append(1))
        await m.heartbeat()  # the first answer fills in until the watch has spoken
        assert m.members("broker-a") == ["c1"]
        broker.pushes.put_nowait(["c1", "c2"])  # c2 joined: pushed
        while m.members("broker-a") != ["c1", "c2"]:
            await asyncio.sleep(0)
        await m.heartbeat()  # an answer computed before c2 joined, arriving after the push
        assert m.members("broker-a") == ["c1", "c2"]
        assert changes == [1]
        for task in m._watches.values():
            task.cancel()
    asyncio.run(scenario())


def test_a_heartbeat_with_no_broker_known_is_a_warning_not_a_failed_job(caplog):
    """The name servers restarted and no broker registered with them yet (a fault run found the heartbeat
    job failing with a traceback): the heartbeat logs a warning and the next one tries again."""
    class NoBroker(ScriptedBroker):
        async def serving(self):
            raise UnavailableError("the name servers (127.0.0.1:1) know no broker yet")

    async def scenario():
        data = HeartbeatData((("T", "*"),), "CLUSTERING", "CONSUME_PASSIVELY", False, (), "AVG")
        m = GroupMembership(cluster=NoBroker(), group="g", client_id="c1", data=lambda: data,
                            on_change=lambda: None)
        with caplog.at_level(logging.WARNING, logger="tidemark.client"):
            await m.heartbeat()
        assert m.members("broker-a") is None
    asyncio.run(scenario())
    assert "event=heartbeat_failed" in caplog.text


def test_the_watch_s_first_list_is_a_change_unless_a_rebalance_already_took_that_list():
    """A joining client rebalances with the heartbeat's answer; the watch's first push, the same list, must
    not run a second pass. A first push no rebalance has seen yet (or a different list) still counts."""
    async def scenario(rebalance_first: bool, pushed: list[str]) -> int:
        broker = ScriptedBroker()
        broker.heartbeat_answer = ["c1", "c2"]
        changes = []
        data = HeartbeatData((("T", "*"),), "CLUSTERING", "CONSUME_PASSIVELY", False, (), "AVG")
        m = GroupMembership(cluster=broker, group="g", client_id="c1", data=lambda: data,
                            on_change=lambda: changes.append(1))
        await m.heartbeat()
        if rebalance_first:
            assert m.members("broker-a") == ["c1", "c2"]  # what the start's rebalance allocates with
        broker.pushes.put_nowait(pushed)
        while broker.pushes.qsize():
            await asyncio.sleep(0)
        await asyncio.sleep(0)
        broker.pushes.put_nowait(["c1", "c2", "c3"])  # a later join always counts
        while m.members("broker-a") != ["c1", "c2", "c3"]:
            await asyncio.sleep(0)
        for task in m._watches.values():
            task.cancel()
        return len(changes)

    assert asyncio.run(scenario(True, ["c1", "c2"])) == 1  # only c3's join
    assert asyncio.run(scenario(False, ["c1", "c2"])) == 2  # nobody rebalanced with it yet
    assert asyncio.run(scenario(True, ["c1"])) == 2  # c2 left meanwhile
