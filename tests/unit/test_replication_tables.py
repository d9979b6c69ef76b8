"""The master's tables on the replication stream (broker/cluster/replicated_tables.py, replication.py): the
queue lock table and the topic and group configs, whole in the first chunk and in the next chunk after each
change; a lock grant or an admin change waits until the replicas in sync acknowledged a chunk carrying it, so
that a replica promoted after the answer holds it. Before, a replica copied these tables once a second with the
master's metadata: a grant or a topic made in that second was not in a promoted replica's copy (the queue
handed to the next member that asked; the topic gone)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from test_lock_file import manager
from test_locks import Q0, FakeClock, G

from tidemark.broker.cluster import replication
from tidemark.broker.cluster.replicated_tables import CONFIG, LOCKS
from tidemark.broker.cluster.replication import ReplicationSource
from tidemark.broker.membership.groups import SubscriptionGroupManager
from tidemark.broker.membership.lock_file import LockFile, decode_locks
from tidemark.broker.topics import TopicConfigManager
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


def _master(tmp_path, timeout_s: float = 5.0, config: tuple | None = None, held: tuple[str, ...] = ()):
    """A master's source with its lock table (`held`: clients holding a queue each before it serves)."""
    locks = manager(FakeClock())
    for queue_id, client in enumerate(held):
        locks.lock(G, client, [(Q0[0], queue_id)])
    lock_file = LockFile(tmp_path / "queueLocks.json", locks, fsync=False)
    store = SimpleNamespace(commit_log_max_offset=0, commit_log_min_offset=0, replication_chunk=lambda o, n: b"")
    source = ReplicationSource(store, broker_name="b", segment_size=1 << 20, timeout_s=timeout_s)
    source.follow(SimpleNamespace(listeners=[], snapshot=dict), SimpleNamespace(listeners=[], table=lambda **kw: ({}, {})),
                  lock_file, *(config or ()))
    return locks, lock_file, source


def _holders(chunk) -> list[str]:
    return [lk.client_id for lk in decode_locks(chunk.queue_locks)[0] if lk.held]


def test_a_grant_waits_until_the_replica_acknowledged_the_chunk_carrying_it(tmp_path):
    async def scenario():
        locks, _, source = _master(tmp_path)
        replica = Replica(source)
        first = await replica.next_chunk()
        assert first.queue_locks and _holders(first) == []  # the table whole at the stream's start
        replica.answer()
        await asyncio.wait_for(source.wait_table_replicated(LOCKS), 5)  # nothing changed since: no wait

        locks.lock(G, "c1", [Q0])
        granted = asyncio.get_running_loop().create_task(source.wait_table_replicated(LOCKS))
        chunk = await replica.next_chunk()
        assert _holders(chunk) == ["c1"]
        await asyncio.sleep(0.05)
        assert not granted.done()  # not acknowledged yet: the grant is not answered
        assert not source.holds_all(1)  # (nor may a switchover hand over to it)
        replica.answer()
        await asyncio.wait_for(granted, 5)
        assert source.holds_all(1)

        locks.lock(G, "c1", [Q0], renew=True)  # a renewal changes nothing: no chunk owed, no wait
        await asyncio.wait_for(source.wait_table_replicated(LOCKS), 5)
        await replica.close()
    asyncio.run(scenario())


def test_a_grant_waits_for_a_replica_just_connected_but_not_for_one_that_went_silent(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(replication, "TABLE_SILENCE_S", 0.3)

    async def scenario():
        locks, _, source = _master(tmp_path)
        locks.lock(G, "c1", [Q0])
        await asyncio.wait_for(source.wait_table_replicated(LOCKS), 1)  # no replica at all
        replica = Replica(source)
        await replica.next_chunk()  # the first chunk, not answered yet: answering it may make the replica in sync
        locks.lock(G, "c2", [(Q0[0], 1)])
        granted = asyncio.get_running_loop().create_task(source.wait_table_replicated(LOCKS))
        replica.answer()
        assert _holders(await replica.next_chunk()) == ["c1", "c2"]
        assert not granted.done()
        replica.answer()
        await asyncio.wait_for(granted, 5)

        locks.lock(G, "c3", [(Q0[0], 2)])  # never answered: the replica went silent, while the log stood still
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(source.wait_table_replicated(LOCKS), 5)
        assert asyncio.get_running_loop().time() - started >= 0.2  # (silent since its last answer, above)
        assert source.in_sync_replicas() == [1] and "table_not_replicated" not in caplog.text
        await replica.close()
    asyncio.run(scenario())


def test_a_grant_is_answered_after_the_wait_bound_when_a_replica_answers_too_slowly(tmp_path, caplog):
    async def scenario():
        locks, _, source = _master(tmp_path, timeout_s=0.2)
        replica = Replica(source)
        await replica.next_chunk()
        replica.answer()
        while not source.in_sync_replicas():
            await asyncio.sleep(0.01)
        locks.lock(G, "c1", [Q0])
        await asyncio.wait_for(source.wait_table_replicated(LOCKS), 2)  # min(timeout_s, TABLE_WAIT_S)
        assert "table_not_replicated" in caplog.text
        await replica.close()
    asyncio.run(scenario())


def test_a_release_goes_to_the_replicas_at_once_not_with_the_next_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setattr(replication, "HEARTBEAT_S", 30.0)

    async def scenario():
        locks, lock_file, source = _master(tmp_path)
        replica = Replica(source)
        await replica.next_chunk()
        replica.answer()
        locks.lock(G, "c1", [Q0])
        granted = asyncio.get_running_loop().create_task(source.wait_table_replicated(LOCKS))
        assert _holders(await replica.next_chunk()) == ["c1"]
        replica.answer()
        await asyncio.wait_for(granted, 5)
        locks.unlock(G, "c1", [Q0])
        lock_file.save_soon()  # (as QueueHandover does on a release)
        assert _holders(await replica.next_chunk()) == []
        assert not source.holds_all(1)  # the release not acknowledged yet (a switchover waits for it)
        replica.answer()
        while not source.holds_all(1):
            await asyncio.sleep(0.01)
        await replica.close()
        await lock_file.close()
    asyncio.run(scenario())


def test_a_topic_or_group_change_waits_until_the_replica_acknowledged_the_chunk_carrying_both_documents(tmp_path):
    async def scenario():
        topics, groups = TopicConfigManager(tmp_path), SubscriptionGroupManager(tmp_path)
        _, _, source = _master(tmp_path, config=(topics, groups))
        replica = Replica(source)
        first = await replica.next_chunk()
        assert json.loads(first.topics_json) == {"topicConfigTable": {}}  # both documents at the stream's start
        assert json.loads(first.groups_json) == {"subscriptionGroupTable": {}}
        replica.answer()
        await asyncio.wait_for(source.wait_table_replicated(CONFIG), 5)

        topics.create("Fresh", 2)
        created = asyncio.get_running_loop().create_task(source.wait_table_replicated(CONFIG))
        chunk = await replica.next_chunk()
        assert list(json.loads(chunk.topics_json)["topicConfigTable"]) == ["Fresh"] and chunk.groups_json
        await asyncio.sleep(0.05)
        assert not created.done()  # not acknowledged yet: the admin change is not answered
        replica.answer()
        await asyncio.wait_for(created, 5)

        groups.ensure("g1")
        ensured = asyncio.get_running_loop().create_task(source.wait_table_replicated(CONFIG))
        chunk = await replica.next_chunk()
        assert list(json.loads(chunk.groups_json)["subscriptionGroupTable"]) == ["g1"]
        assert not chunk.queue_locks  # (the lock table did not change: not sent again)
        replica.answer()
        await asyncio.wait_for(ensured, 5)
        await replica.close()
    asyncio.run(scenario())


def test_what_the_tables_held_before_the_master_served_waits_for_no_replica(tmp_path, monkeypatch):
    monkeypatch.setattr(replication, "TABLE_SILENCE_S", 30.0)
    monkeypatch.setattr(replication, "TABLE_WAIT_S", 30.0)

    async def scenario():
        _, _, source = _master(tmp_path, held=("c1",))  # (a restart's restored locks, a promoted replica's copy)
        replica = Replica(source)
        assert _holders(await replica.next_chunk()) == ["c1"]  # not answered: the replica is busy connecting
        # A request answered now (a replica's own hand-back as it connects) changed nothing: it waits for nobody.
        await asyncio.wait_for(source.wait_table_replicated(LOCKS), 5)
        await replica.close()
    asyncio.run(scenario())


def test_the_replication_service_s_calls_do_not_wait_for_the_replicas_that_make_them():
    from tidemark.broker.services.replication import ReplicationServicer

    async def scenario():
        flushes = []

        async def flush_configs(*, replicated=True):
            flushes.append(replicated)

        broker = SimpleNamespace(replication=object(), flush_configs=flush_configs, operations=SimpleNamespace(
            replica_metadata=replication_pb2.ReplicaMetadata, take_back_offsets=lambda data: 0))
        servicer = ReplicationServicer(broker)
        context = SimpleNamespace(peer=lambda: "ipv4:127.0.0.1:1")
        await servicer.GetMetadata(replication_pb2.GetMetadataRequest(), context)
        await servicer.HandBackOffsets(replication_pb2.ReplicaMetadata(), context)
        assert flushes == [False, False]  # (the config files still flushed; the replicas not waited for)
    asyncio.run(scenario())
