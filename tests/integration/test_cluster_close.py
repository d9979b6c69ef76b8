"""BrokerCluster.close() while a discovery is under way, against a real name server and broker: the callers
waiting for that discovery are told the cluster is closed, and none starts another one (which would open
connections to the brokers nobody closes)."""

from __future__ import annotations

import asyncio

import pytest

from tidemark.client.errors import ClientStateError, UnavailableError
from tidemark.client.remoting.cluster import BrokerCluster


def test_a_discovery_is_neither_begun_nor_joined_once_the_cluster_closes(namesrv_factory, broker_factory):
    ns = namesrv_factory()
    broker_factory("broker-a", args=("--namesrv", ns.address, "--register-interval-ms", "200"))

    async def go():
        probe = BrokerCluster([], namesrv=[ns.address], timeout_s=3.0)
        try:
            async with asyncio.timeout(30):
                while True:  # until the broker has registered
                    try:
                        await probe.discover()
                        break
                    except UnavailableError:
                        await asyncio.sleep(0.1)
        finally:
            await probe.close()

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
