"""BrokerCluster.close() while a discovery is under way, against a real name server and broker: the callers
waiting for that discovery are told the cluster is closed, and none starts another one (which would open
connections to the brokers nobody closes)."""

from __future__ import annotations

import asyncio

import pytest
from brokerproc import BrokerStubs

from tidemark.client.errors import ClientStateError, NotFoundError, UnavailableError
from tidemark.client.remoting.cluster import BrokerCluster
from tidemark.v1 import admin_pb2


async def _registered(namesrv: str, topic: str | None = None) -> None:
    """Once the name server knows the broker (and the topic's route, when one is named)."""
    probe = BrokerCluster([], namesrv=[namesrv], timeout_s=3.0)
    try:
        async with asyncio.timeout(30):
            while True:
                try:
                    await probe.discover()
                    if topic is not None:
                        await probe.route(topic, refresh=True)
                    return
                except (UnavailableError, NotFoundError):
                    await asyncio.sleep(0.1)
    finally:
        await probe.close()


def test_a_discovery_is_neither_begun_nor_joined_once_the_cluster_closes(namesrv_factory, broker_factory):
    ns = namesrv_factory()
    broker_factory("broker-a", args=("--namesrv", ns.address, "--register-interval-ms", "200"))

    async def go():
        await _registered(ns.address)
        cluster = BrokerCluster([], namesrv=[ns.address], timeout_s=3.0)
        asked, answer = asyncio.Event(), asyncio.Event()
        ask = cluster.namesrv.cluster

        async def held_ask():  # the first ask is answered only when the test says so
            if not asked.is_set():
                asked.set()
                await answer.wait()
            return await ask()
        cluster.namesrv.cluster = held_ask
        first = asyncio.ensure_future(cluster.discover())
        await asyncio.wait_for(asked.wait(), 10)
        refresh = asyncio.ensure_future(cluster.discover(refresh=True))  # waits for the one under way
        await asyncio.sleep(0)
        await cluster.close()
        await asyncio.wait((first, refresh))
        assert cluster._discoveries == 1 and cluster.connections() == [], "no discovery after close()"
        for caller in (refresh, first):  # (first: the discovery's CancelledError, not the caller's own)
            with pytest.raises(ClientStateError, match="closed"):
                caller.result()
        with pytest.raises(ClientStateError):
            await cluster.discover()
    asyncio.run(go())


def test_no_connection_is_opened_once_the_cluster_closes(namesrv_factory, broker_factory):
    """A route asked before close() and answered after it named a broker the cluster had no connection
    to: connection_at() dialled it on the closed cluster, a connection nobody closes (so did a failover's
    probe answered after close(), dialling the replica)."""
    ns = namesrv_factory()
    broker = broker_factory("broker-a", args=("--namesrv", ns.address, "--register-interval-ms", "200"))
    with BrokerStubs(broker.address) as s:
        s.admin.CreateTopic(admin_pb2.CreateTopicRequest(name="Closing", queue_nums=1), timeout=15)

    async def go():
        await _registered(ns.address, "Closing")
        cluster = BrokerCluster([], namesrv=[ns.address], timeout_s=3.0)
        answered, go_on = asyncio.Event(), asyncio.Event()
        ask = cluster.namesrv.route

        async def held_route(topic):  # the name server's answer reaches the caller only after close()
            route = await ask(topic)
            answered.set()
            await go_on.wait()
            return route
        cluster.namesrv.route = held_route
        routing = asyncio.ensure_future(cluster.route("Closing"))
        await asyncio.wait_for(answered.wait(), 10)
        await cluster.close()
        go_on.set()
        await asyncio.wait((routing,))
        assert cluster.connections() == [], "no connection opened after close()"
        with pytest.raises(ClientStateError, match="closed: no connection"):
            routing.result()
        with pytest.raises(ClientStateError, match="closed: no connection"):
            cluster.connection_at(broker.address)
        assert cluster.connections() == []
    asyncio.run(go())
