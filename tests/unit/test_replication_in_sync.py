"""Which replicas count as in sync for a sync-replication send (broker/replication.py), and what the
refusal before the store and the unknown outcome after it look like to a client."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest

from tidemark.broker.errors import OutcomeUnknownError, StoreError
from tidemark.broker.replication import (
    MAX_LEVELS,
    CatchUp,
    NotEnoughReplicasError,
    ReplicationSource,
    ReplicationTimeoutError,
)
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
