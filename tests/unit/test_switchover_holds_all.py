"""What a master handing over waits for (broker/cluster/switchover.py): the successor holds its whole log,
acknowledged, and every chunk it was sent, and is owed no producer or offset change
(ReplicationSource.holds_all, replica_progress._Replica.holds_all). Pure: no stream, no store."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from tidemark.broker.cluster.replica_progress import _Feed, _Replica
from tidemark.broker.cluster.replication import ReplicationSource


def _source(end: int) -> tuple[ReplicationSource, SimpleNamespace]:
    store = SimpleNamespace(commit_log_max_offset=end)
    return ReplicationSource(store, broker_name="broker-a", segment_size=1 << 20), store


def _replica(source: ReplicationSource, broker_id: int, acked: int) -> _Replica:
    replica = _Replica(f"broker-a/{broker_id}@peer", acked, asyncio.Event(), broker_id=broker_id, feed=_Feed(),
                       has_state=True)
    source._replicas[replica.key] = replica
    return replica


def test_a_replica_holds_all_only_with_the_whole_log_every_chunk_answered_and_no_state_owed():
    source, store = _source(500)
    replica = _replica(source, 2, acked=400)
    assert not source.holds_all(2), "it lacks the log's last 100 bytes"
    replica.acked = 500
    assert source.holds_all(2)
    replica.sent += 1  # a chunk of offset commits went out, not answered yet
    assert not source.holds_all(2)
    replica.answered += 1
    assert source.holds_all(2)
    replica.feed.offset_records.append(object())  # a commit it is owed, not sent yet
    assert not source.holds_all(2)
    replica.feed.offset_records.clear()  # sent (and answered: see above)
    assert source.holds_all(2)
    replica.has_state = False  # it has not acknowledged the stream's first chunk (the tables whole)
    assert not source.holds_all(2)
    replica.has_state = True
    store.commit_log_max_offset = 600  # a write the master took meanwhile
    assert not source.holds_all(2)
    assert not source.holds_all(3), "a replica that is not connected holds nothing"


def test_waiting_ends_with_the_acknowledgement_that_brings_it_level_or_after_the_timeout():
    async def scenario():
        source, _ = _source(500)
        replica = _replica(source, 2, acked=300)
        assert not await source.wait_holds_all(2, 0.05)
        waiting = asyncio.ensure_future(source.wait_holds_all(2, 5))
        await asyncio.sleep(0.01)
        source._acknowledge(replica, 400)
        await asyncio.sleep(0.01)
        assert not waiting.done()
        source._acknowledge(replica, 500)
        assert await asyncio.wait_for(waiting, 1)
        assert not source._acked, "the waiter's event is dropped"
    asyncio.run(scenario())
