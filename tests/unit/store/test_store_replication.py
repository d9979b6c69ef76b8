"""Commit-log replication at the store level: a replica appends the master's records at the same offsets
(replication_chunk -> append_replicated), indexes them like recovery, survives a crash, refuses damage,
and truncates a tail its master does not have."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading

import pytest
from store_testlib import body_for

from tidemark.broker.cluster.divergence import Search, agrees, record_digests
from tidemark.broker.errors import StoreError, TruncateBelowOldestError
from tidemark.broker.store import MessageStore, commitlog


def _replicate(master: MessageStore, replica: MessageStore, max_bytes: int) -> int:
    """Copy everything the replica lacks in chunks of at most max_bytes; returns the chunks sent."""
    chunks = 0
    while True:
        data = master.replication_chunk(replica.commit_log_max_offset, max_bytes)
        if not data:
            return chunks
        replica.append_replicated(replica.commit_log_max_offset, data)
        chunks += 1


async def _started(config, clock) -> MessageStore:
    """A store loaded and started on `config`'s data dir."""
    store = MessageStore(config, clock=clock)
    store.load()
    await store.start()
    return store


def _contents(store: MessageStore, topic: str, queue_id: int) -> list[tuple[int, int, bytes]]:
    got = store.get_messages(topic, queue_id, store.min_offset(topic, queue_id), 10_000, max_scan=10_000)
    return [(m.queue_offset, m.commit_log_offset, m.body) for m in got.messages]


@pytest.mark.parametrize("max_bytes", [1, 700, 1 << 20])
def test_a_replica_holds_the_same_records_at_the_same_offsets_across_segments(config, clock, make_records,
                                                                             tmp_path, max_bytes):
    replica_config = dataclasses.replace(config, data_dir=tmp_path / "replica")

    async def scenario():
        master = await _started(config, clock)
        for q in (0, 1):
            for n in range(0, 60, 10):  # 120 records over many 4 KiB segments
                await master.put_messages(make_records(10, start=n, queue_id=q))
        replica = await _started(replica_config, clock)
        notified = []
        replica.add_dispatch_listener(lambda topic, queue_id: notified.append((topic, queue_id)))
        chunks = _replicate(master, replica, max_bytes)
        assert replica.commit_log_max_offset == master.commit_log_max_offset
        for q in (0, 1):
            assert _contents(replica, "T", q) == _contents(master, "T", q)
            assert replica.max_offset("T", q) == 60
        assert set(notified) == {("T", 0), ("T", 1)}
        if max_bytes == 1:  # one record or end-of-segment marker per chunk
            segments = master.commit_log_max_offset // config.commitlog_segment_size
            assert chunks == 120 + segments
        # Later writes follow, and a crash of the replica (no shutdown) keeps what it had.
        await master.put_messages(make_records(5, start=60, queue_id=0))
        _replicate(master, replica, max_bytes)
        return _contents(master, "T", 0), master.commit_log_max_offset

    expected, end = asyncio.run(scenario())

    async def after_crash():
        replica = MessageStore(replica_config, clock=clock)
        replica.load()
        assert replica.commit_log_max_offset == end
        assert _contents(replica, "T", 0) == expected

    asyncio.run(after_crash())


def test_damaged_or_misplaced_data_is_refused_and_changes_nothing(config, clock, make_records, tmp_path):
    async def scenario():
        master = await _started(config, clock)
        await master.put_messages(make_records(3))
        replica = await _started(dataclasses.replace(config, data_dir=tmp_path / "replica"), clock)
        data = master.replication_chunk(0, 1 << 20)
        damaged = bytearray(data)
        damaged[len(data) // 2] ^= 0xFF
        for bad, offset, message in [(bytes(damaged), 0, "damaged"), (data[:-3], 0, "ends inside a record"),
                                     (data, 100, "must start at a segment")]:
            with pytest.raises(StoreError, match=message):
                replica.append_replicated(offset, bad)
            assert replica.commit_log_max_offset == 0 and replica.max_offset("T", 0) == 0
        replica.append_replicated(0, data)
        with pytest.raises(StoreError, match="start at 0, the commit log ends at"):
            replica.append_replicated(0, data)  # not at the end
        assert replica.max_offset("T", 0) == 3

    asyncio.run(scenario())


def test_a_tail_the_master_does_not_have_is_truncated_from_log_and_queues(config, clock, make_records,
                                                                            tmp_path):
    async def scenario():
        master = await _started(config, clock)
        await master.put_messages(make_records(5))
        replica = await _started(dataclasses.replace(config, data_dir=tmp_path / "replica"), clock)
        _replicate(master, replica, 1 << 20)
        kept = replica.commit_log_max_offset
        await replica.put_messages(make_records(40, start=5))  # a tail written while it was a master
        assert await replica.truncate_to(kept) > 0
        assert replica.commit_log_max_offset == kept and replica.max_offset("T", 0) == 5
        await master.put_messages(make_records(3, start=100))
        _replicate(master, replica, 1 << 20)
        assert _contents(replica, "T", 0) == _contents(master, "T", 0)
        assert [body for _, _, body in _contents(replica, "T", 0)][-1] == body_for(102)

    asyncio.run(scenario())


async def _divergence(master: MessageStore, replica: MessageStore) -> tuple[int | None, int]:
    """Where the replica must truncate to (None: it agrees), and in how many rounds of probes, as
    ReplicationSource.serve asks it."""
    end = replica.commit_log_max_offset
    if agrees(master.commit_log, end, replica.commit_log.tail_digest(end)):
        return None, 0
    search = Search(master.commit_log, end, replica.commit_log_min_offset)
    while search.found is None:
        search.answer(record_digests(replica.commit_log, await search.probes()))
    return search.found, search.rounds


# (records both logs hold, records only the master goes on with, records the replica wrote on its own)
@pytest.mark.parametrize("agreed,master_tail,replica_tail", [
    (30, 40, 20),  # both go on, the master further, across several 4 KiB segments
    (30, 2, 20),  # the replica holds records past the master's end, from the middle of a segment
    (30, 0, 3),  # the master wrote nothing since: its end is the point
    (0, 5, 5),  # nothing in common: from the first record
    (100, 40, 60),  # the point many segments in
])
def test_a_divergent_tail_is_cut_at_the_first_record_where_the_logs_part(config, clock, make_records, tmp_path,
                                                                        agreed, master_tail, replica_tail):
    """A replica that was written on its own (a former master) after an agreed prefix: the master finds the
    first record where the logs part in a few rounds of probes, the replica drops exactly what follows,
    keeps its queue entries before it, and copies the rest."""
    async def scenario():
        master = await _started(config, clock)
        replica = await _started(dataclasses.replace(config, data_dir=tmp_path / "replica"), clock)
        if agreed:
            await master.put_messages(make_records(agreed))
            _replicate(master, replica, 1 << 20)
        point = replica.commit_log_max_offset
        assert await _divergence(master, replica) == (None, 0)
        if master_tail:
            await master.put_messages(make_records(master_tail, start=agreed))
        await replica.put_messages([dataclasses.replace(r, body=b"own" + r.body)
                                    for r in make_records(replica_tail, start=500)])
        before, end_before = _contents(replica, "T", 0)[:agreed], replica.commit_log_max_offset
        cut, rounds = await _divergence(master, replica)
        assert cut == point and rounds <= 4, (cut, point, rounds)
        assert await replica.truncate_to(cut) == end_before - cut
        assert replica.commit_log_max_offset == point and replica.max_offset("T", 0) == agreed
        assert _contents(replica, "T", 0) == before, "a record before the point changed"
        assert await _divergence(master, replica) == (None, 0)
        copied = master.commit_log_max_offset - point
        assert sum(len(master.replication_chunk(o, 1 << 20)) for o in _chunk_starts(master, point)) == copied
        _replicate(master, replica, 1 << 20)
        assert _contents(replica, "T", 0) == _contents(master, "T", 0)

    asyncio.run(scenario())


def test_a_replica_that_deleted_older_segments_than_its_master_is_cut_at_the_point_not_below_its_oldest(
        config, clock, make_records, tmp_path):
    """The search starts at the replica's oldest record when it deleted segments its master still holds: a
    probe below it finds no record there, which is not where the logs part. And a cut below the oldest
    record is refused with nothing changed (it used to leave a log whose oldest record was past its end)."""
    async def scenario():
        master = await _started(config, clock)
        replica = await _started(dataclasses.replace(config, data_dir=tmp_path / "replica"), clock)
        await master.put_messages(make_records(60))  # several 4 KiB segments
        _replicate(master, replica, 1 << 20)
        point = replica.commit_log_max_offset
        assert replica.delete_expired_segments(force=True) > 0
        oldest = replica.commit_log_min_offset
        assert master.commit_log_min_offset < oldest < point
        await master.put_messages(make_records(5, start=60))
        await replica.put_messages([dataclasses.replace(r, body=b"own" + r.body)
                                    for r in make_records(5, start=500)])
        before, end_before = _contents(replica, "T", 0), replica.commit_log_max_offset
        with pytest.raises(TruncateBelowOldestError, match=f"below its oldest record {oldest}"):
            await replica.truncate_to(master.commit_log_min_offset)
        assert (replica.commit_log_min_offset, replica.commit_log_max_offset) == (oldest, end_before)
        assert _contents(replica, "T", 0) == before
        cut, _ = await _divergence(master, replica)
        assert cut == point
        assert await replica.truncate_to(cut) == end_before - cut
        _replicate(master, replica, 1 << 20)
        assert _contents(replica, "T", 0) == _contents(master, "T", 0)[-len(_contents(replica, "T", 0)):]
        assert replica.commit_log_max_offset == master.commit_log_max_offset

    asyncio.run(scenario())


def _chunk_starts(store: MessageStore, offset: int) -> list[int]:
    starts = []
    while data := store.replication_chunk(offset, 1 << 20):
        starts.append(offset)
        offset += len(data)
    return starts


def test_the_search_narrows_a_long_segment_by_rounds_and_a_replica_without_probes_is_cut_as_before(
        config, clock, make_records, tmp_path):
    big = dataclasses.replace(config, commitlog_segment_size=1 << 20)

    async def scenario():
        master = await _started(big, clock)
        replica = await _started(dataclasses.replace(big, data_dir=tmp_path / "replica"), clock)
        for n in range(0, 3000, 100):  # ~3000 records in one segment: more than one round of probes
            await master.put_messages(make_records(100, start=n))
        _replicate(master, replica, 1 << 20)
        point = replica.commit_log_max_offset
        await master.put_messages(make_records(10, start=5000))
        await replica.put_messages(make_records(10, start=6000))
        cut, rounds = await _divergence(master, replica)
        assert cut == point and 2 <= rounds <= 3, (cut, rounds)
        search = Search(master.commit_log, replica.commit_log_max_offset)
        search.fall_back()
        assert search.found == 0  # the segment's start: what was cut before probes

    asyncio.run(scenario())


def test_a_round_of_probes_within_a_segment_reads_its_records_off_the_event_loop(config, clock, make_records,
                                                                                   tmp_path, monkeypatch):
    """Sampling record starts reads every record header of what is left of the segment: seconds for a 2 GiB
    one, which the master's event loop (renewing its lease) must not wait for."""
    big = dataclasses.replace(config, commitlog_segment_size=1 << 20)

    async def scenario():
        master = await _started(big, clock)
        replica = await _started(dataclasses.replace(big, data_dir=tmp_path / "replica"), clock)
        await master.put_messages(make_records(300))
        _replicate(master, replica, 1 << 20)
        point = replica.commit_log_max_offset
        await master.put_messages(make_records(10, start=5000))
        await replica.put_messages(make_records(10, start=6000))
        loop_thread, pread = threading.get_ident(), os.pread
        readers = []

        def watched(fd, n, pos):
            readers.append(threading.get_ident())
            return pread(fd, n, pos)

        search = Search(master.commit_log, replica.commit_log_max_offset, replica.commit_log_min_offset)
        monkeypatch.setattr(os, "pread", watched)
        probes = await search.probes()
        monkeypatch.setattr(os, "pread", pread)
        assert len(probes) > 1 and readers, "a round within one segment samples its record starts"
        assert loop_thread not in readers, "the sampling read records on the event loop"
        search.answer(record_digests(replica.commit_log, probes))
        while search.found is None:
            search.answer(record_digests(replica.commit_log, await search.probes()))
        assert search.found == point

    asyncio.run(scenario())


def test_logs_that_differ_before_identical_segment_padding_are_told_apart(config, clock, make_records, tmp_path,
                                                                          monkeypatch):
    """Both logs sealed the same segment with the same padding after different records: the digest covers
    the last records, not the zeros after the end-of-segment marker (a window shorter than the padding
    here, as 4 KiB is against the padding of a 64 MiB segment)."""
    monkeypatch.setattr(commitlog, "TAIL_DIGEST_BYTES", 16)

    async def scenario():
        stores = []
        for name, start in (("one", 0), ("two", 1000)):
            store = await _started(dataclasses.replace(config, data_dir=tmp_path / name), clock)
            await store.put_messages(make_records(1, start=start))
            stores.append(store)
        one, two = stores
        big = [dataclasses.replace(r, body=b"z" * 2500) for r in make_records(1, start=5)]
        for store in stores:  # 4 KiB segments: the second big record does not fit, both seal the first segment
            await store.put_messages(big)
            await store.put_messages(big)
        end = config.commitlog_segment_size
        assert one.commit_log_max_offset > end and two.commit_log_max_offset > end
        assert not agrees(one.commit_log, end, two.commit_log.tail_digest(end))
        assert agrees(one.commit_log, end, one.commit_log.tail_digest(end))
        assert not agrees(one.commit_log, end - 3, None)  # not a record start

    asyncio.run(scenario())


def test_a_cut_moves_the_checkpoint_back_so_a_crash_recovers_from_a_record_start(config, clock, make_records,
                                                                                 tmp_path):
    replica_config = dataclasses.replace(config, data_dir=tmp_path / "replica")

    async def before_crash():
        master = await _started(config, clock)
        await master.put_messages(make_records(60))
        replica = await _started(replica_config, clock)
        await replica.put_messages([dataclasses.replace(r, body=b"r" * 77)  # its own history, flushed past
                                    for r in make_records(30, start=500)])  # the cut, at other boundaries
        await replica._flush_all()
        await replica.truncate_to(0)
        _replicate(master, replica, 1 << 20)
        return _contents(master, "T", 0)  # then kill -9: no shutdown

    expected = asyncio.run(before_crash())

    async def after_crash():
        replica = MessageStore(replica_config, clock=clock)
        replica.load()
        assert _contents(replica, "T", 0) == expected

    asyncio.run(after_crash())


def test_a_follower_answers_a_position_past_its_end_with_wait_not_with_the_start(config, clock, make_records):
    """A consumer failing over to a replica that is behind keeps its position (RocketMQ's slave answers the
    same); a master sends a reader past the end back (OFFSET_OVERFLOW_BADLY)."""
    from tidemark.broker.store import GetStatus

    async def scenario():
        store = await _started(config, clock)
        await store.put_messages(make_records(5))
        for follower, status, next_offset in ((False, GetStatus.OFFSET_OVERFLOW_BADLY, 0),
                                              (True, GetStatus.OFFSET_OVERFLOW_ONE, 9)):
            store.follower = follower
            got = store.get_messages("T", 0, 9, 32)
            raw = store.read_records("T", 0, 9, max_count=32, max_bytes=1 << 20)
            assert (got.status, got.next_begin_offset) == (status, next_offset)
            assert (raw.status, raw.next_offset) == (status, next_offset)
        empty = store.get_messages("Unknown", 0, 3, 32)  # nothing replicated yet for this queue
        assert (empty.status, empty.next_begin_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, 3)

    asyncio.run(scenario())
