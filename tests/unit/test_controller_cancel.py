"""Tasks a stopping broker cancels end, whatever arrived at that moment: a master's lease keeper
(Election.keep) as etcd answers a renewal, a replica's read (ReplicaSync._next_chunk) as a chunk comes.
Python 3.11's asyncio.wait_for returns the result of a call that finished as its caller was cancelled, and
the cancellation is lost: the keeper went on renewing, and the broker's stop (cancel_and_wait) waited for
ever."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from tidemark.broker.cluster.election import Election, Lease
from tidemark.broker.cluster.replica_sync import ReplicaSync


class Etcd:
    """Answers every renewal at once; the first one cancels the keeper as it answers (a SIGTERM that comes
    while etcd's answer is on its way)."""

    def __init__(self) -> None:
        self.keeper: asyncio.Task | None = None
        self.renewals = 0

    async def refresh_lease(self, lease_id: int) -> SimpleNamespace:
        self.renewals += 1
        if self.renewals == 1:
            asyncio.get_running_loop().call_soon(self.keeper.cancel)
        return SimpleNamespace(TTL=2)


def test_a_lease_keeper_cancelled_as_etcd_answers_a_renewal_ends():
    async def scenario() -> None:
        etcd = Etcd()
        election = Election(etcd, "DefaultCluster", "broker-a", 1, "127.0.0.1:1", ttl_s=2)
        election.lease = Lease(1, 2, time.monotonic())
        etcd.keeper = keeper = asyncio.get_running_loop().create_task(election.keep(lambda why: None))
        done, _ = await asyncio.wait({keeper}, timeout=5)
        keeper.cancel()  # (a keeper that lost its cancellation: ended here, so the test ends)
        assert keeper in done, f"the keeper went on renewing ({etcd.renewals} renewals) after it was cancelled"
        assert keeper.cancelled()

    asyncio.run(scenario())


class Call:
    """A replication stream whose chunk arrives as the replica is stopped (or follows another master)."""

    def __init__(self) -> None:
        self.reader: asyncio.Task | None = None

    async def read(self) -> str:
        asyncio.get_running_loop().call_soon(self.reader.cancel)
        await asyncio.sleep(0)  # the chunk is on its way: the stop comes first
        return "chunk"


def test_a_replica_s_read_of_a_chunk_that_comes_as_it_is_stopped_ends_the_copy():
    """With wait_for the chunk was returned and the cancellation lost: the copy went on with the next read,
    and ReplicaSync.stop() or follow() waited for a task that no longer knew it was stopped."""
    async def scenario() -> None:
        sync = ReplicaSync.__new__(ReplicaSync)  # (only what a read uses)
        sync.master, sync._error, sync._monotonic, sync._last_chunk_at = "127.0.0.1:1", None, time.monotonic, 0.0
        call = Call()
        call.reader = reader = asyncio.get_running_loop().create_task(sync._next_chunk(call))
        await asyncio.wait({reader}, timeout=5)
        assert reader.cancelled(), f"the read returned {reader.result()!r} and lost its cancellation"

    asyncio.run(scenario())
