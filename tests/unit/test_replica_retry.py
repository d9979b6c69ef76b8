"""How long a replica waits before it calls its master again (broker/cluster/replica_sync.py)."""

from __future__ import annotations

from tidemark.broker.cluster.replica_sync import FIRST_RETRY_S, MAX_RETRY_S, next_retry_s


def test_a_stream_that_ran_is_opened_again_at_once_however_long_the_failures_before_it():
    """A replica kept one doubling backoff, reset only by a stream that ended without an error: after its
    master had been away a few seconds it waited two seconds more before it even asked the channel,
    once the master was back at its address."""
    waited = MAX_RETRY_S
    assert next_retry_s(waited, streamed=True) == FIRST_RETRY_S


def test_calls_the_master_ends_without_a_chunk_are_spaced_out_to_a_cap():
    waits = [FIRST_RETRY_S]
    for _ in range(8):
        waits.append(next_retry_s(waits[-1], streamed=False))
    assert waits[:4] == [0.1, 0.2, 0.4, 0.8]
    assert max(waits) == MAX_RETRY_S == waits[-1]
