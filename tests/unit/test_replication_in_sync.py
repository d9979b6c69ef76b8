"""Which replicas count as in sync for a sync-replication send (broker/cluster/replication.py), and what the
refusal before the store and the unknown outcome after it look like to a client."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest

from tidemark.broker.cluster.replica_progress import MAX_LEVELS, CatchUp, _Replica, nth_highest
from tidemark.broker.cluster.replication import (
    NotEnoughReplicasError,
    ReplicationSource,
    ReplicationTimeoutError,
)
from tidemark.broker.errors import OutcomeUnknownError, StoreError
from tidemark.broker.services.errors import status_for
from tidemark.broker.services.rmq5.status import Code, code_for

LAG = 3.0


def test_a_replica_that_connects_level_with_the_master_is_in_sync_at_once():
    c = CatchUp()
    c.sent(100, 100, now=10.0)
    c.acknowledged(100)
    assert c.at == 10.0
    assert c.in_sync(100, 100, now=10.0, max_lag_s=LAG)
    assert c.in_sync(100, 150, now=12.0, max_lag_s=LAG)  # the master moved on; it was level 2 s ago


def test_a_replica_behind_is_not_in_sync_until_it_acknowledges_a_chunk_that_reached_the_master_end():
    c = CatchUp()
    assert not c.in_sync(0, 500, now=0.0, max_lag_s=LAG)  # connected behind: never level yet
    c.sent(200, 500, now=1.0)  # a chunk that does not reach the master's end proves nothing
    c.acknowledged(200)
    assert c.at is None and not c.in_sync(200, 500, now=1.0, max_lag_s=LAG)
    c.sent(500, 500, now=2.0)
    assert not c.in_sync(200, 500, now=2.0, max_lag_s=LAG)  # sent, not acknowledged yet
    c.acknowledged(500)
    assert c.at == 2.0 and c.in_sync(500, 600, now=4.0, max_lag_s=LAG)


def test_a_replica_that_stops_acknowledging_drops_out_after_the_lag():
    c = CatchUp()
    c.sent(100, 100, now=0.0)
    c.acknowledged(100)
    for t in (1.0, 2.0, 3.0):  # heartbeats and chunks keep going out, nothing comes back
        c.sent(100 + int(t), 100 + int(t), now=t)
    assert c.in_sync(100, 103, now=3.0, max_lag_s=LAG)
    assert not c.in_sync(100, 103, now=3.5, max_lag_s=LAG)
    assert c.in_sync(103, 103, now=9.0, max_lag_s=LAG)  # holding everything: in sync whatever the time
    c.acknowledged(103)  # acknowledges late: level as of when the last chunk went out
    assert c.at == 3.0


def test_the_earliest_time_a_level_was_sent_is_kept_and_the_levels_are_bounded():
    c = CatchUp()
    c.sent(100, 100, now=1.0)
    c.sent(100, 100, now=2.0)  # a heartbeat at the same end: no news
    c.acknowledged(100)
    assert c.at == 1.0
    for i in range(MAX_LEVELS * 2):
        c.sent(200 + i, 200 + i, now=10.0 + i)
    c.acknowledged(200 + MAX_LEVELS * 2)
    assert c.at == 10.0 + MAX_LEVELS * 2 - 1


def _source(end: int = 0, timeout_s: float = 0.05) -> ReplicationSource:
    store = SimpleNamespace(commit_log_max_offset=end)
    return ReplicationSource(store, broker_name="broker-a", segment_size=1 << 20, timeout_s=timeout_s)


def test_without_a_replica_a_send_is_refused_before_the_store_as_retriable_unavailable():
    with pytest.raises(NotEnoughReplicasError, match="no in-sync replica is connected .*none is connected") as e:
        _source().check_in_sync()
    assert isinstance(e.value, StoreError) and "not stored" in str(e.value)
    assert status_for(e.value) is grpc.StatusCode.UNAVAILABLE
    assert code_for(e.value) == Code.HA_NOT_AVAILABLE


def test_a_stored_send_no_replica_acknowledges_in_time_has_an_unknown_outcome():
    with pytest.raises(ReplicationTimeoutError, match="outcome is unknown") as e:
        asyncio.run(_source(end=100).wait_replicated(100))
    assert isinstance(e.value, OutcomeUnknownError) and not isinstance(e.value, StoreError)
    assert status_for(e.value) is grpc.StatusCode.DEADLINE_EXCEEDED  # the client's RequestTimeoutError
    assert code_for(e.value) == Code.SLAVE_PERSISTENCE_TIMEOUT


# -- min_sync_replicas: N replicas, counted by broker id ------------------------------------------------


class _Clock:
    now = 50.0

    def __call__(self) -> float:
        return self.now


def _attach(s: ReplicationSource, key: str, acked: int, clock: _Clock, *, has_state: bool = True):
    """A connected replica stream as serve() makes it (one per broker id), level with the master at `acked`
    if that is its end, and (`has_state`) past the first chunk, which carried the master's tables."""
    broker_id = int(key.split("/")[1].split("@")[0])
    replica = _Replica(key, acked, asyncio.Event(), CatchUp(), broker_id=broker_id, has_state=has_state)
    replica.catch_up.sent(acked, s._store.commit_log_max_offset, clock())
    replica.catch_up.acknowledged(acked)
    for old in [k for k, r in s._replicas.items() if r.broker_id == broker_id]:
        del s._replicas[old]
    s._replicas[key] = replica
    s._on_replicas_changed()
    return replica


def _n_source(n: int, end: int = 100, timeout_s: float = 0.5):
    clock = _Clock()
    store = SimpleNamespace(commit_log_max_offset=end)
    return ReplicationSource(store, broker_name="broker-a", segment_size=1 << 20, timeout_s=timeout_s, sync=True,
                             min_replicas=n, clock=clock), store, clock


def test_with_two_required_one_in_sync_replica_is_refused_and_says_which_are():
    s, _store, clock = _n_source(2)
    _attach(s, "broker-a/1@p1", 100, clock)
    with pytest.raises(NotEnoughReplicasError, match=r"fewer than 2 in-sync replicas .*in sync: 1;") as e:
        s.check_in_sync()
    assert "not stored" in str(e.value)
    _attach(s, "broker-a/2@p2", 100, clock)
    s.check_in_sync()
    assert s.in_sync_replicas() == [1, 2]


def test_a_replica_reconnecting_while_its_old_stream_lingers_counts_once_for_what_it_holds_now():
    s, store, clock = _n_source(2)
    _attach(s, "broker-a/1@p1", 100, clock)
    _attach(s, "broker-a/1@p9", 100, clock)  # the same replica, a second stream
    assert s.in_sync_replicas() == [1]
    with pytest.raises(NotEnoughReplicasError):
        s.check_in_sync()
    _attach(s, "broker-a/2@p2", 100, clock)
    store.commit_log_max_offset = 500
    clock.now += 10  # nobody level since: out of sync until they catch up
    _attach(s, "broker-a/1@p7", 0, clock)  # replica 1 lost its data and connects again from 0
    assert not s._held_by_enough(100), "its old stream no longer vouches for what it lost"


def test_nth_highest_is_what_n_replicas_hold_or_what_all_hold():
    assert nth_highest([], 2) is None
    assert nth_highest([300], 2) == 300
    assert nth_highest([100, 300, 200], 1) == 300
    assert nth_highest([100, 300, 200], 2) == 200
    assert nth_highest([100, 300, 200], 5) == 100


def test_a_send_is_answered_once_n_replicas_hold_it_and_readers_see_what_n_hold():
    async def scenario() -> None:
        s, store, clock = _n_source(2)
        one, two = _attach(s, "broker-a/1@p1", 100, clock), _attach(s, "broker-a/2@p2", 100, clock)
        assert s.read_limit() == 100
        store.commit_log_max_offset = 150
        waiting = asyncio.ensure_future(s.wait_replicated(150))
        s._acknowledge(one, 150)
        await asyncio.sleep(0)
        assert not waiting.done() and s.read_limit() == 100  # one replica holds it: not acknowledged, not readable
        s._acknowledge(two, 150)
        await asyncio.wait_for(waiting, 1)
        assert s.read_limit() == 150

    asyncio.run(scenario())


def test_fewer_than_n_acknowledgements_in_time_is_an_unknown_outcome_naming_the_rule():
    async def scenario() -> None:
        s, store, clock = _n_source(2, timeout_s=0.05)
        one, _two = _attach(s, "broker-a/1@p1", 100, clock), _attach(s, "broker-a/2@p2", 100, clock)
        store.commit_log_max_offset = 150
        s._acknowledge(one, 150)
        with pytest.raises(ReplicationTimeoutError, match="fewer than 2 replicas of broker broker-a"):
            await s.wait_replicated(150)

    asyncio.run(scenario())


def test_min_replicas_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        _n_source(0)


def test_a_replica_level_with_the_log_is_not_in_sync_before_it_acknowledged_the_masters_state():
    """A replica that connects at the master's end (a restarted one, a replaced master) holds the log but
    not yet the master's offsets: it is neither counted for a sync send nor electable until it answered
    the first chunk, which carries them."""
    s, _store, clock = _n_source(1)
    replica = _attach(s, "broker-a/1@p1", 100, clock, has_state=False)
    assert s.in_sync_replicas() == []
    with pytest.raises(NotEnoughReplicasError, match="has not acknowledged the master's state yet"):
        s.check_in_sync()
    replica.has_state = True
    assert s.in_sync_replicas() == [1]
    s.check_in_sync()


# -- a write on a replication stream that a reset ended under it --------------------------------------------

class _EndedCall:
    """A grpc.aio stream call whose link was reset after the replica's last read."""

    def __init__(self, ended: bool) -> None:
        self.ended, self.sent = ended, []

    async def write(self, message) -> None:
        if self.ended:
            raise asyncio.InvalidStateError("RPC already finished.")
        self.sent.append(message)


def test_a_write_on_an_ended_stream_reads_as_the_streams_end_not_a_defect():
    from tidemark.broker.cluster.replica_sync import send_on

    async def scenario():
        live, ended = _EndedCall(False), _EndedCall(True)
        assert await send_on(live, "progress") is True and live.sent == ["progress"]
        assert await send_on(ended, "progress") is False and ended.sent == []
    asyncio.run(scenario())
