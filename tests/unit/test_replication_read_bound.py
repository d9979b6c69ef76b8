"""What readers of a master may read (broker/cluster/replication.py: `confirmed`, Kafka's high watermark) and when
they are woken: only appends a replica acknowledged, sync at once a replica connected, async while one is
in sync."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from tidemark.broker.cluster.replica_progress import CatchUp, _Replica
from tidemark.broker.cluster.replication import ReplicationSource


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def source(*, sync: bool, end: int = 0):
    store = SimpleNamespace(commit_log_max_offset=end)
    clock = Clock()
    s = ReplicationSource(store, broker_name="broker-a", segment_size=1 << 20, timeout_s=1.0, sync=sync, clock=clock)
    woken: list[object] = []
    s.on_readable = lambda topic, queue_id: woken.append((topic, queue_id))
    s.on_all_readable = lambda: woken.append("all")
    return s, store, clock, woken


def append(s, store, topic: str, queue_id: int, size: int = 10) -> None:
    store.commit_log_max_offset += size
    s.on_append(topic, queue_id)


def connect(s, store, clock, acked: int) -> _Replica:
    replica = _Replica("broker-a/1@peer", acked, asyncio.Event(), CatchUp(), broker_id=1, has_state=True)
    replica.catch_up.sent(acked, store.commit_log_max_offset, clock())
    replica.catch_up.acknowledged(acked)
    s._replicas[replica.key] = replica
    s._confirm(acked)
    return replica


def test_before_any_replica_connects_nothing_bounds_reads_and_readers_are_woken_at_once():
    for sync in (True, False):
        s, store, _, woken = source(sync=sync)
        append(s, store, "T", 0)
        assert s.read_limit() is None and woken == [("T", 0)]


def test_readers_are_woken_when_a_replica_acknowledges_what_they_wait_for():
    s, store, clock, woken = source(sync=True, end=100)
    replica = connect(s, store, clock, 100)
    assert s.read_limit() == 100
    append(s, store, "T", 0)   # ends at 110
    append(s, store, "T", 1)   # ends at 120
    append(s, store, "T", 0)   # ends at 130
    assert woken == [] and s.read_limit() == 100
    s._acknowledge(replica, 120)
    assert s.read_limit() == 120 and woken == [("T", 0), ("T", 1)]
    s._acknowledge(replica, 115)  # an older acknowledgement moves nothing back
    assert s.read_limit() == 120
    s._acknowledge(replica, 130)
    assert woken == [("T", 0), ("T", 1), ("T", 0)]


def test_a_replica_connecting_behind_bounds_reads_and_wakes_everyone_once_it_holds_the_tail():
    s, store, clock, woken = source(sync=True, end=500)
    replica = connect(s, store, clock, 300)
    assert s.read_limit() == 300 and woken == []
    s._acknowledge(replica, 500)
    assert woken == ["all"]


def test_sync_keeps_the_bound_without_a_replica_async_lets_go_once_none_is_in_sync():
    for sync, bounded in ((True, True), (False, False)):
        s, store, clock, woken = source(sync=sync, end=100)
        replica = connect(s, store, clock, 100)
        append(s, store, "T", 0)
        assert s.read_limit() == 100 and woken == []
        clock.now += 10.0  # silent past max(timeout, two heartbeats)
        s._forget(replica)
        s.release_readers()
        assert (s.read_limit() == 100) is bounded
        assert woken == ([] if bounded else ["all"])


def test_an_async_master_that_may_have_been_replaced_keeps_the_bound_until_it_knows_again():
    """A master resumed after a pause longer than its lease has lost its replica (it took over) and cannot
    confirm its lease: what only it holds may be gone from the next master, so readers stay at what the
    replica acknowledged, and are let go once a renewal is answered (the lease was still its own)."""
    stale = [False]
    store = SimpleNamespace(commit_log_max_offset=100)
    clock = Clock()
    s = ReplicationSource(store, broker_name="broker-a", segment_size=1 << 20, timeout_s=1.0, sync=False,
                          clock=clock, fenced=lambda: stale[0])
    woken: list[object] = []
    s.on_readable = lambda topic, queue_id: woken.append((topic, queue_id))
    s.on_all_readable = lambda: woken.append("all")
    replica = connect(s, store, clock, 100)
    append(s, store, "T", 0)
    clock.now += 10.0
    s._forget(replica)
    stale[0] = True
    s.release_readers()
    assert s.read_limit() == 100 and woken == []
    append(s, store, "T", 1)
    assert woken == []
    stale[0] = False
    s.release_readers()
    assert s.read_limit() is None and woken == ["all"]
