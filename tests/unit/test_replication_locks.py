"""A master's queue lock table on the replication stream (broker/cluster/replication.py): whole in the first
chunk and in the next chunk after each change, and a grant waits until the replicas in sync acknowledged a
chunk carrying it, so that a replica promoted after the grant's answer holds the lock. Before, a replica
copied the table once a second with the master's metadata: a grant made in that second was not in a
promoted replica's copy, which handed the queue to the next member that asked."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from test_lock_file import manager
from test_locks import Q0, FakeClock, G

from tidemark.broker.cluster.replication import ReplicationSource
from tidemark.broker.membership.lock_file import LockFile, decode_locks
from tidemark.v1 import replication_pb2


class Replica:
    """The replica's side of one stream: its requests (hello, then one answer a chunk, sent by `answer`) and
    the chunks it got."""

    def __init__(self, source: ReplicationSource, broker_id: int = 1) -> None:
        self._requests: asyncio.Queue = asyncio.Queue()
        self._requests.put_nowait(replication_pb2.ReplicaProgress(broker_name="b", broker_id=broker_id,
                                                                  segment_size=1 << 20))
        self.chunks: asyncio.Queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._read(source.serve(self._stream(), "peer")))

    async def _stream(self):
        while (item := await self._requests.get()) is not None:
            yield item

    async def _read(self, chunks) -> None:
        async for chunk in chunks:
            self.chunks.put_nowait(chunk)

    async def next_chunk(self) -> replication_pb2.ReplicationChunk:
        async with asyncio.timeout(5):
            return await self.chunks.get()

    def answer(self) -> None:
        self._requests.put_nowait(replication_pb2.ReplicaProgress(commit_log_end=0))

    async def close(self) -> None:
        self._requests.put_nowait(None)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def _master(tmp_path, timeout_s: float = 5.0):
    locks = manager(FakeClock())
    lock_file = LockFile(tmp_path / "queueLocks.json", locks, fsync=False)
    store = SimpleNamespace(commit_log_max_offset=0, commit_log_min_offset=0, replication_chunk=lambda o, n: b"")
    source = ReplicationSource(store, broker_name="b", segment_size=1 << 20, timeout_s=timeout_s)
    source.follow(SimpleNamespace(listeners=[], snapshot=dict), SimpleNamespace(listeners=[], table=lambda **kw: ({}, {})),
                  lock_file)
    return locks, source


def _holders(chunk) -> list[str]:
    return [lk.client_id for lk in decode_locks(chunk.queue_locks)[0] if lk.held]


def test_a_grant_waits_until_the_replica_acknowledged_the_chunk_carrying_it(tmp_path):
    async def scenario():
        locks, source = _master(tmp_path)
        replica = Replica(source)
        first = await replica.next_chunk()
        assert first.queue_locks and _holders(first) == []  # the table whole at the stream's start
        replica.answer()
        await asyncio.wait_for(source.wait_locks_replicated(), 5)  # nothing changed since: no wait

        locks.lock(G, "c1", [Q0])
        granted = asyncio.get_running_loop().create_task(source.wait_locks_replicated())
        chunk = await replica.next_chunk()
        assert _holders(chunk) == ["c1"]
        await asyncio.sleep(0.05)
        assert not granted.done()  # not acknowledged yet: the grant is not answered
        assert not source.holds_all(1)  # (nor may a switchover hand over to it)
        replica.answer()
        await asyncio.wait_for(granted, 5)
        assert source.holds_all(1)

        locks.lock(G, "c1", [Q0], renew=True)  # a renewal changes nothing: no chunk owed, no wait
        await asyncio.wait_for(source.wait_locks_replicated(), 5)
        await replica.close()
    asyncio.run(scenario())


def test_without_a_replica_in_sync_a_grant_does_not_wait_and_an_unanswering_one_is_waited_for_until_the_timeout(
        tmp_path, caplog):
    async def scenario():
        locks, source = _master(tmp_path, timeout_s=0.2)
        locks.lock(G, "c1", [Q0])
        await asyncio.wait_for(source.wait_locks_replicated(), 1)  # no replica at all
        replica = Replica(source)
        await replica.next_chunk()  # the first chunk, not answered: not in sync yet (the master's state)
        locks.lock(G, "c2", [(Q0[0], 1)])
        await asyncio.wait_for(source.wait_locks_replicated(), 1)
        assert "locks_not_replicated" not in caplog.text
        replica.answer()  # in sync now
        while not source.in_sync_replicas():
            await asyncio.sleep(0.01)
        locks.lock(G, "c3", [(Q0[0], 2)])
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(source.wait_locks_replicated(), 2)  # never answered: answered after the timeout
        assert asyncio.get_running_loop().time() - started >= 0.2
        assert "locks_not_replicated" in caplog.text
        await replica.close()
    asyncio.run(scenario())
