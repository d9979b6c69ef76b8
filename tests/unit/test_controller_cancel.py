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
from tidemark.broker.cluster.etcd_members import EtcdMembers
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


class Member:
    """An aetcd client whose answer arrives as its caller is cancelled."""

    def __init__(self) -> None:
        self.caller: asyncio.Task | None = None

    async def get(self, key: bytes) -> str:
        asyncio.get_running_loop().call_soon(self.caller.cancel)
        await asyncio.sleep(0)
        return "value"


def test_an_etcd_call_answered_as_its_caller_is_cancelled_ends_the_caller():
    """A stopping master's switchover task, cancelled as etcd answered its call, went on watching: its stop's
    cancel_and_wait waited for ever, and the master never resigned (the fault checker's controller
    scenario, seeds 19700 and 19702, with the watch's own cancellation already bounded)."""
    async def scenario() -> None:
        members = EtcdMembers([("127.0.0.1", 1)], call_timeout_s=1.0)
        member = Member()
        members._client, members._endpoint = member, "127.0.0.1:1"  # (connected)

        async def caller() -> None:
            await members.get(b"/tidemark/x")
            await asyncio.sleep(60)  # what a caller that lost its cancellation goes on to do

        member.caller = task = asyncio.get_running_loop().create_task(caller())
        done, _ = await asyncio.wait({task}, timeout=5)
        task.cancel()
        assert task in done and task.cancelled(), "the caller lost its cancellation"

    asyncio.run(scenario())


class SwallowingMember(Member):
    """The same, through a call that loses the cancellation itself (aetcd waits with Python 3.11's
    asyncio.wait_for, which returns a result that came as its caller was cancelled)."""

    async def get(self, key: bytes) -> str:
        asyncio.get_running_loop().call_soon(self.caller.cancel)
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            pass  # (wait_for: the answer is there, so it is returned)
        return "value"


def test_an_etcd_call_that_loses_its_caller_s_cancellation_delivers_it():
    async def scenario() -> None:
        members = EtcdMembers([("127.0.0.1", 1)], call_timeout_s=1.0)
        member = SwallowingMember()
        members._client, members._endpoint = member, "127.0.0.1:1"  # (connected)

        async def caller() -> None:
            await members.get(b"/tidemark/x")
            await asyncio.sleep(60)

        member.caller = task = asyncio.get_running_loop().create_task(caller())
        done, _ = await asyncio.wait({task}, timeout=5)
        task.cancel()
        assert task in done and task.cancelled(), "the caller went on after its cancellation was lost"

    asyncio.run(scenario())
