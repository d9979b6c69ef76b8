"""A master whose replica's window is full (it acknowledged too little) still sends it a chunk every
heartbeat, a chunk without records: a stream silent for SILENCE_S is one the replica gives up and opens
again, and on a connection that carries no data the replica's keepalive pings count as abuse (gRPC answers
GOAWAY too_many_pings after two within the server's keepalive_min_interval_ms)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from tidemark.broker.cluster import replication
from tidemark.broker.cluster.replica_progress import _Feed, _Replica


async def _chunks_until_silent(monkeypatch, acked: int) -> list:
    monkeypatch.setattr(replication, "HEARTBEAT_S", 0.05)
    store = SimpleNamespace(replication_chunk=lambda offset, size: b"x" * size, commit_log_max_offset=1 << 30)
    source = replication.ReplicationSource(store, broker_name="b", segment_size=1 << 20, chunk_bytes=10,
                                           window_bytes=15)
    replica = _Replica("b/1@peer", acked, asyncio.Event(), broker_id=1)
    reader = asyncio.get_running_loop().create_future()  # (the replica's acknowledgements: never ending here)
    chunks = source._chunks(replica, 0, asyncio.Event(), reader, _Feed())
    got = []
    try:
        async with asyncio.timeout(1.0):
            while len(got) < 4:
                got.append(await anext(chunks))
    except TimeoutError:
        pass
    finally:
        await chunks.aclose()
    return got


def test_a_full_window_still_sends_a_chunk_a_heartbeat(monkeypatch):
    got = asyncio.run(_chunks_until_silent(monkeypatch, acked=0))
    # Two chunks of records fill the window (20 bytes ahead of nothing acknowledged, 15 allowed); then one
    # chunk without records a heartbeat, at the same offset, until the replica acknowledges.
    assert [(c.offset, len(c.data)) for c in got] == [(0, 10), (10, 10), (20, 0), (20, 0)]
