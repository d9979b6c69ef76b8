"""MessageStore writes and reads: offsets, segments, filtering and every GetStatus."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from store_testlib import body_for

from tidemark.broker.errors import InvalidArgumentError, StoreError
from tidemark.broker.store import GetStatus, MessageRecord
from tidemark.broker.store.codec import PHYS_OFFSET_FIELD
from tidemark.common.protocol import ExpressionType, parse_filter, parse_tag_expression, tag_hash


def _files(path) -> list[str]:
    return sorted(os.listdir(path))


def test_round_trip_across_segments_and_consume_queue_files(config, open_store, make_records):
    async def scenario():
        store, _ = open_store()
        await store.start()
        results = []
        for i in range(60):
            results += await store.put_messages(make_records(1, start=i))
        # a batch larger than a segment
        results += await store.put_messages(make_records(40, start=60))
        return store, results

    store, results = asyncio.run(scenario())

    assert [r.queue_offset for r in results] == list(range(100))
    assert len(_files(config.data_dir / "commitlog")) >= 4
    # 100 entries, 8 per file
    assert len(_files(config.data_dir / "consumequeue" / "T" / "0")) == 13
    assert (store.min_offset("T", 0), store.max_offset("T", 0)) == (0, 100)
    for r in results:
        message = store.message_at("T", 0, r.queue_offset)
        assert message.body == body_for(r.queue_offset)
        assert (message.queue_offset, message.commit_log_offset, message.store_size) == (
            r.queue_offset,
            r.commit_log_offset,
            r.store_size,
        )
        assert store.read_message(r.commit_log_offset) == message
        # a record never spans segments
        start = r.commit_log_offset // 4096 * 4096
        assert r.commit_log_offset + r.store_size <= start + 4096

    result = store.get_messages("T", 0, 0, 1000, max_scan=1000)
    assert result.status is GetStatus.FOUND
    assert [m.body for m in result.messages] == [body_for(i) for i in range(100)]
    assert (result.next_begin_offset, result.min_offset, result.max_offset) == (100, 0, 100)


def test_batch_gets_consecutive_offsets_and_one_store_timestamp(open_store, make_records):
    async def scenario():
        store, _ = open_store()
        await store.start()
        await store.put_messages(make_records(3))
        return store, await store.put_messages(make_records(5, start=3))

    store, results = asyncio.run(scenario())
    assert [r.queue_offset for r in results] == [3, 4, 5, 6, 7]
    assert len({r.store_timestamp for r in results}) == 1
    offsets = [r.commit_log_offset for r in results]
    sizes = [r.store_size for r in results]
    assert all(offsets[i] + sizes[i] <= offsets[i + 1] for i in range(4))


def test_queues_are_independent_and_listed(open_store, make_records):
    async def scenario():
        store, _ = open_store()
        await store.start()
        await store.put_messages(make_records(2, queue_id=1))
        await store.put_messages(make_records(3, topic="U", queue_id=0))
        r = await store.put_messages(make_records(1, queue_id=1, start=2))
        return store, r

    store, results = asyncio.run(scenario())
    assert results[0].queue_offset == 2
    assert store.topics() == ["T", "U"]
    assert store.queue_ids("T") == [1]
    assert (store.max_offset("U", 0), store.max_offset("T", 1), store.max_offset("T", 0)) == (
        3,
        3,
        0,
    )


def test_max_count_limits_and_next_begin_offset_follows_the_last_returned(open_store, make_records):
    async def scenario():
        store, _ = open_store()
        await store.start()
        await store.put_messages(make_records(20))
        return store

    store = asyncio.run(scenario())
    result = store.get_messages("T", 0, 5, 4)
    assert [m.queue_offset for m in result.messages] == [5, 6, 7, 8]
    assert result.next_begin_offset == 9


def test_tag_filtering_with_matcher_and_exact_matcher(open_store):
    expression = parse_tag_expression("a || b")
    # "c" pretends to collide with "a": same code in the consume queue, other tag in the message.
    tags = ["a", "c", "b", "d", "a", "c"]
    records = [
        MessageRecord(
            "T", 0, f"m{i}".encode(), {"TAGS": tag}, tags_code=tag_hash("a" if tag == "c" else tag)
        )
        for i, tag in enumerate(tags)
    ]

    async def scenario():
        store, _ = open_store()
        await store.start()
        await store.put_messages(records)
        return store

    store = asyncio.run(scenario())
    cheap = store.get_messages("T", 0, 0, 10, matcher=expression.matches_code)
    assert [m.tags for m in cheap.messages] == ["a", "c", "b", "a", "c"]
    exact = store.get_messages(
        "T",
        0,
        0,
        10,
        matcher=expression.matches_code,
        exact_matcher=lambda m: expression.matches_tag(m.tags),
    )
    assert [m.queue_offset for m in exact.messages] == [0, 2, 4]
    assert exact.next_begin_offset == 6


def test_no_matched_message_still_advances(open_store, make_records):
    async def scenario():
        store, _ = open_store()
        await store.start()
        await store.put_messages(make_records(50, tag="x"))
        return store

    store = asyncio.run(scenario())
    result = store.get_messages("T", 0, 10, 32, matcher=lambda code: code == 12345, max_scan=15)
    assert (result.status, result.messages, result.next_begin_offset) == (
        GetStatus.NO_MATCHED_MESSAGE,
        [],
        25,
    )
    result = store.get_messages("T", 0, 40, 32, exact_matcher=lambda m: False)
    assert (result.status, result.next_begin_offset) == (GetStatus.NO_MATCHED_MESSAGE, 50)


def test_get_status_cases(open_store, make_records):
    async def scenario():
        store, _ = open_store()
        await store.start()
        await store.put_messages(make_records(5))
        return store

    store = asyncio.run(scenario())

    def outcome(topic, offset):
        r = store.get_messages(topic, 0, offset, 10)
        return r.status, len(r.messages), r.next_begin_offset, r.min_offset, r.max_offset

    assert outcome("T", 2) == (GetStatus.FOUND, 3, 5, 0, 5)
    assert outcome("T", 5) == (GetStatus.OFFSET_OVERFLOW_ONE, 0, 5, 0, 5)
    assert outcome("T", 9) == (GetStatus.OFFSET_OVERFLOW_BADLY, 0, 0, 0, 5)
    assert outcome("Unknown", 3) == (GetStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0, 0)
    with pytest.raises(InvalidArgumentError):
        store.get_messages("T", 0, -1, 10)
    with pytest.raises(InvalidArgumentError):
        store.get_messages("T", 0, 0, 0)
    # OFFSET_TOO_SMALL needs a min offset above 0: see test_store_admin.


def test_search_offset_by_timestamp_with_injected_clock(open_store, clock, make_records):
    clock.now, clock.step = 1_000, 100  # put i is stored at 1000 + 100 * i

    async def scenario():
        store, _ = open_store()
        await store.start()
        for i in range(20):
            await store.put_messages(make_records(1, start=i))
        return store

    store = asyncio.run(scenario())
    assert store.store_timestamp_at("T", 0, 7) == 1_700
    assert store.store_timestamp_at("T", 0, 20) is None
    search = store.search_offset_by_timestamp
    assert search("T", 0, 1_700) == 7  # exact
    assert search("T", 0, 1_650) == 7  # between 6 and 7
    assert search("T", 0, 0) == 0  # before everything: min
    assert search("T", 0, 2_901) == 20  # after everything: max
    assert search("Unknown", 0, 1_000) == 0


def test_read_message_only_at_record_starts(open_store, make_records):
    async def scenario():
        store, _ = open_store()
        await store.start()
        return store, await store.put_messages(make_records(3))

    store, results = asyncio.run(scenario())
    first = results[0]
    assert store.read_message(first.commit_log_offset).body == body_for(0)
    assert store.read_message(first.commit_log_offset + 1) is None
    assert store.read_message(first.commit_log_offset + 28) is None
    assert store.read_message(store.commit_log_max_offset) is None
    assert store.read_message(-5) is None
    assert store.message_at("T", 0, 3) is None
    assert store.commit_log_min_offset == 0
    assert store.commit_log_max_offset == results[-1].commit_log_offset + results[-1].store_size
    assert store.store_size_bytes() == store.commit_log_max_offset + 3 * 20


def test_dispatch_listener_sees_each_put(open_store, make_records):
    seen = []

    async def scenario():
        store, _ = open_store()
        store.add_dispatch_listener(lambda *args: seen.append(args))
        store.add_dispatch_listener(lambda *args: 1 / 0)  # a broken listener must not fail the put
        await store.start()
        await store.put_messages(make_records(2))
        await store.put_messages(make_records(3, queue_id=4))

    asyncio.run(scenario())
    assert seen == [("T", 0), ("T", 4)]


@pytest.mark.parametrize(
    "records, match",
    [
        ([], "at least one"),
        ([MessageRecord("T", 0, b"a"), MessageRecord("U", 0, b"b")], "one queue"),
        ([MessageRecord("T", 0, b"a"), MessageRecord("T", 1, b"b")], "one queue"),
        ([MessageRecord("T", 0, b"x" * 1001)], "max_message_size"),
        ([MessageRecord("T", 0, b"x" * 990, {"K": "0123456789"})], "max_message_size"),
        ([MessageRecord("T", 0, b"a", {"K": "v\x01"})], "must not contain"),
        ([MessageRecord("../etc", 0, b"a")], "topic"),
        ([MessageRecord("T", -1, b"a")], "queue id"),
        ([MessageRecord("T", 0, b"ok"), MessageRecord("T", 0, b"a", flag=2**40)], "out of range"),
    ],
)
def test_invalid_puts_are_rejected_and_write_nothing(open_store, records, match):
    async def scenario():
        store, _ = open_store(max_message_size=1000)
        await store.start()
        with pytest.raises(InvalidArgumentError, match=match):
            await store.put_messages(records)
        return store

    store = asyncio.run(scenario())
    assert store.commit_log_max_offset == 0
    assert store.max_offset("T", 0) == 0


def test_put_needs_a_running_store(open_store, make_records):
    async def scenario():
        store, _ = open_store()
        with pytest.raises(StoreError, match="not running"):
            await store.put_messages(make_records(1))
        await store.start()
        await store.put_messages(make_records(1))
        await store.shutdown()
        await store.shutdown()  # idempotent
        with pytest.raises(StoreError):
            await store.put_messages(make_records(1))
        with pytest.raises(StoreError):
            store.get_messages("T", 0, 0, 1)

    asyncio.run(scenario())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tags=st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=60),
       wanted=st.sets(st.sampled_from(["a", "b", "c", "d"]), min_size=1),
       start=st.integers(0, 59), max_count=st.integers(1, 12), max_bytes=st.integers(1, 400),
       max_scan=st.integers(1, 70))
def test_filtered_raw_reads_take_exactly_what_a_scan_entry_by_entry_would(
        open_store, tmp_path, tags, wanted, start, max_count, max_bytes, max_scan):
    """read_records filters consume-queue entries in one vectorised pass; the reference walks them one by
    one: the same records (bytes), count and next offset, across consume-queue file boundaries."""
    records = [MessageRecord("T", 0, f"m{i}".encode() * 3, {"TAGS": t}, tags_code=tag_hash(t))
               for i, t in enumerate(tags)]
    codes = frozenset(tag_hash(t) for t in wanted)

    async def scenario():
        store, _ = open_store(data_dir=Path(tempfile.mkdtemp(dir=tmp_path)))  # a fresh store per example
        await store.start()
        await store.put_messages(records)
        try:
            got = store.read_records("T", 0, min(start, len(tags)), max_count=max_count, max_bytes=max_bytes,
                                     tags_codes=codes, max_scan=max_scan)
            first = min(start, len(tags))
            taken, pos = scan_entry_by_entry(store, first, min(len(tags), first + max_scan),
                                             lambda p: tags[p] in wanted, max_count, max_bytes)
            return got, taken, pos
        finally:
            await store.shutdown()

    got, taken, pos = asyncio.run(scenario())
    assert got.count == len(taken) and got.data == b"".join(taken)
    assert got.next_offset == pos


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.sampled_from(["1", "2", "3", "x", None]), min_size=1, max_size=60),
       expression=st.sampled_from(["a = '1'", "a IN ('2', 'x') OR a IS NULL", "a > 1", "a <> 'x'", "TRUE"]),
       start=st.integers(0, 59), max_count=st.integers(1, 12), max_bytes=st.integers(1, 400),
       max_scan=st.integers(1, 70))
def test_raw_reads_by_properties_take_exactly_what_a_scan_entry_by_entry_would(
        open_store, tmp_path, values, expression, start, max_count, max_bytes, max_scan):
    """read_records with a properties filter (an SQL92 subscription) reads every record of the window and
    keeps those whose properties match: the same records, count and next offset as an entry-by-entry scan
    over the decoded messages, also when a match that does not fit stops it."""
    records = [MessageRecord("T", 0, f"m{i}".encode() * (i % 4 + 1),
                             {"z": "a", **({} if v is None else {"a": v}), "aa": "3"}) for i, v in enumerate(values)]
    accept = parse_filter(expression, ExpressionType.SQL92).matches_properties

    async def scenario():
        store, _ = open_store(data_dir=Path(tempfile.mkdtemp(dir=tmp_path)))
        await store.start()
        await store.put_messages(records)
        try:
            first = min(start, len(values))
            got = store.read_records("T", 0, first, max_count=max_count, max_bytes=max_bytes,
                                     properties_filter=accept, max_scan=max_scan)
            # get_messages (pull, pop) looks at the properties before decoding: as the exact matcher would.
            early = store.get_messages("T", 0, first, max_count, properties_filter=accept, max_scan=max_scan)
            late = store.get_messages("T", 0, first, max_count, exact_matcher=lambda m: accept(m.properties),
                                      max_scan=max_scan)
            assert (early.status, early.messages, early.next_begin_offset) == (
                late.status, late.messages, late.next_begin_offset)
            taken, pos = scan_entry_by_entry(store, first, min(len(values), first + max_scan),
                                             lambda p: accept(store.message_at("T", 0, p).properties),
                                             max_count, max_bytes)
            return got, taken, pos
        finally:
            await store.shutdown()

    got, taken, pos = asyncio.run(scenario())
    assert got.count == len(taken) and got.data == b"".join(taken)
    assert got.next_offset == pos
    if start < len(values):
        assert got.status is (GetStatus.FOUND if taken else GetStatus.NO_MATCHED_MESSAGE)


def test_messages_filtered_by_sql92_properties(open_store):
    records = [MessageRecord("T", 0, b"m", {"region": r, "amount": a, "TAGS": t})
               for r, a, t in [("eu", "150", "x"), ("us", "150", "x"), ("eu", "50", "y"), ("eu", "abc", "y")]]

    async def scenario():
        store, _ = open_store()
        await store.start()
        await store.put_messages(records)
        return store

    store = asyncio.run(scenario())
    f = parse_filter("region = 'eu' AND (amount > 100 OR TAGS = 'y')", ExpressionType.SQL92)
    got = store.get_messages("T", 0, 0, 10, exact_matcher=lambda m: f.matches_properties(m.properties))
    assert [m.queue_offset for m in got.messages] == [0, 2]  # 3: 'abc' > 100 fails, so the whole OR does


def scan_entry_by_entry(store, first: int, limit: int, wanted, max_count: int, max_bytes: int, *,
                        skip: int | None = None) -> tuple[list, int]:
    """The reference for read_records: entry by entry from `first` to `limit`, the records `wanted(offset)`
    takes, the first always, then while count and bytes allow; (records, where the scan stopped). The
    record at `skip` (damaged) counts as taken but holds no bytes, as a read leaves out a record that is
    not what its entry says."""
    pos, taken, nbytes = first, [], 0
    while pos < limit:
        if wanted(pos):
            entry_size = store._queues.get("T", 0).entry_at(pos)[1]
            if taken and (len(taken) >= max_count or nbytes + entry_size > max_bytes):
                break
            data = b"" if pos == skip else store.read_records("T", 0, pos, max_count=1, max_bytes=1).data
            taken.append(data)
            nbytes += entry_size
        pos += 1
    return taken, pos


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches_=st.lists(st.tuples(st.integers(0, 1), st.integers(1, 80), st.integers(0, 300)), min_size=1,
                         max_size=12),
       wanted=st.none() | st.sets(st.sampled_from(["a", "b", "c"]), min_size=1),
       start=st.floats(0, 1), max_count=st.integers(1, 400), max_bytes=st.integers(1, 60_000),
       max_scan=st.integers(1, 700), damage=st.none() | st.floats(0, 1))
@example(batches_=[(0, 80, 100), (1, 3, 10), (0, 70, 50), (0, 40, 0), (1, 1, 0), (0, 60, 200)], wanted=None, start=0.1,
         max_count=400, max_bytes=60_000, max_scan=700, damage=0.5)
@example(batches_=[(0, 80, 100), (1, 3, 10), (0, 70, 50)], wanted={"a", "b"}, start=0.0, max_count=90,
         max_bytes=60_000, max_scan=700, damage=None)
def test_bulk_raw_reads_of_long_and_interleaved_runs_take_what_a_scan_entry_by_entry_would(
        open_store, tmp_path, batches_, wanted, start, max_count, max_bytes, max_scan, damage):
    """read_records over numpy (the records that fit, the runs lying back to back, a run's check in one pass):
    batches of up to 80 records to queue 0 between batches to queue 1, so that queue 0's records lie in runs
    of every length, read with and without a tags filter; one record's physical offset field damaged (the
    run's check then fails and the run is read record by record, the damaged one left out)."""
    tags = "abc"
    records, seq = [], 0
    for queue, n, size in batches_:
        for _ in range(n):
            t = tags[seq % 3]
            records.append(MessageRecord("T", queue, b"x" * size + f"{seq}".encode(), {"TAGS": t},
                                         tags_code=tag_hash(t)))
            seq += 1
    queue0_tags = [r.properties["TAGS"] for r in records if r.queue_id == 0]
    codes = None if wanted is None else frozenset(tag_hash(t) for t in wanted)

    async def scenario():
        # (segments that hold long runs: the fixture's 4 KiB ones cut every run short)
        store, _ = open_store(data_dir=Path(tempfile.mkdtemp(dir=tmp_path)), commitlog_segment_size=1 << 20)
        await store.start()
        for r in records:  # one put per record, in order: queue 0's runs break where queue 1's records lie
            await store.put_messages([r])
        try:
            n0 = store.max_offset("T", 0)
            first = int(start * n0)
            bad = None
            if n0 and damage is not None:
                bad = min(int(damage * n0), n0 - 1)
                phys = store._queues.get("T", 0).entry_at(bad)[0]
                store._commitlog._segment_for(phys).pwrite(b"\xff" * 8, phys - store._commitlog._segment_for(
                    phys).start + PHYS_OFFSET_FIELD)
            got = store.read_records("T", 0, first, max_count=max_count, max_bytes=max_bytes,
                                     tags_codes=codes, max_scan=max_scan)
            taken, pos = scan_entry_by_entry(
                store, first, min(n0, first + max_scan),
                lambda p: (wanted is None or queue0_tags[p] in wanted), max_count, max_bytes, skip=bad)
            return got, taken, pos
        finally:
            await store.shutdown()

    got, taken, pos = asyncio.run(scenario())
    assert got.data == b"".join(taken) and got.count == sum(1 for data in taken if data)
    assert got.next_offset == pos
