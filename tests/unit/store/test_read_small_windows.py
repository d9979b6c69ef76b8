"""read_records over a real store against the vectorised read it had before small windows took a Python loop
(reads._fitting_rows): the same records, bytes, count and next offset for any window, including entries whose
commit-log bytes retention deleted, max_count and max_bytes limits, a scan limit and a readable limit."""

from __future__ import annotations

import asyncio
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemark.broker.store import MessageRecord, MessageStore, StoreConfig, reads
from tidemark.broker.store.model import GetStatus, RawRead
from tidemark.broker.store.reads import (
    ENTRY_READ_BATCH,
    _fitting,
    _next_offset,
    _run_bounds,
    position_status,
    readable_high,
)
from tidemark.common.records import RecordBatchBuilder, encode_properties


def _vectorised_read(queue, commitlog, offset, *, max_count, max_bytes, tags_codes, max_scan, limit=None) -> RawRead:
    """read_records as it was before 470749c (every window through numpy): the oracle."""
    low, high = queue.min_offset, readable_high(queue, limit)
    status = position_status(offset, low, high, stored_high=queue.max_offset if limit is not None else None)
    if status is not None:
        return RawRead(status, b"", 0, _next_offset(status, offset, low, high), low, high)
    commit_log_min = commitlog.min_offset
    pieces: list[bytes] = []
    planned = nbytes = count = 0
    run_start = run_end = -1
    run_sizes: list[int] = []
    limit = min(high, offset + max_scan)
    pos = offset
    full = False
    codes = None if tags_codes is None else np.fromiter(tags_codes, dtype=np.int64, count=len(tags_codes))
    while pos < limit and not full:
        entries = queue.read_array(pos, min(limit - pos, max(max_count - planned, 32), ENTRY_READ_BATCH)
                                   if codes is None else limit - pos)
        scanned = len(entries)
        if not scanned:
            break
        end = pos + scanned
        keep = entries["phys"] >= commit_log_min
        if codes is not None:
            keep &= np.isin(entries["tags"], codes)
        chosen = np.flatnonzero(keep)
        took, refused = _fitting(entries["size"][chosen], planned, nbytes, max_count, max_bytes)
        if refused:
            full = True
            end = pos + int(chosen[took])
        phys = entries["phys"][chosen[:took]].tolist()
        sizes = entries["size"][chosen[:took]].tolist()
        for a, b in _run_bounds(entries["phys"][chosen[:took]], entries["size"][chosen[:took]]):
            if a or phys[0] != run_end:
                if run_sizes:
                    data, ok = commitlog.read_run(run_start, run_sizes)
                    pieces.append(data)
                    count += ok
                run_start, run_sizes = phys[a], []
            run_sizes.extend(sizes[a:b])
        if took:
            run_end = phys[-1] + sizes[-1]
            planned += took
            nbytes += sum(sizes)
        pos = end
    if run_sizes:
        data, ok = commitlog.read_run(run_start, run_sizes)
        pieces.append(data)
        count += ok
    data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return RawRead(GetStatus.FOUND if count else GetStatus.NO_MATCHED_MESSAGE, data, count, pos, low, high)


class _Retained:
    """The store's commit log as a read sees it once retention deleted everything below `min_offset` (its
    consume queues not yet corrected: the entries below are skipped by the read itself)."""

    def __init__(self, commitlog, min_offset: int) -> None:
        self._commitlog, self.min_offset = commitlog, min_offset

    def read_run(self, offset, sizes):
        return self._commitlog.read_run(offset, sizes)


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """Queue 0 of topic T: single messages between other queues' (gaps in the commit log), batches of 3 to 40
    records back to back, three tags, sizes from 60 to 900 bytes, over 4 KiB segments (runs cut by their ends)."""
    config = StoreConfig(tmp_path_factory.mktemp("store"), commitlog_segment_size=4096,
                         consume_queue_entries_per_file=8, flush_interval_ms=3_600_000)
    store = MessageStore(config)
    store.load()

    async def fill() -> None:
        await store.start()
        i = 0
        for round_ in range(12):
            for _ in range(round_ % 4 + 1):
                props = {"TAGS": "abc"[i % 3], "KEYS": f"k{i}"}
                await store.put_messages([MessageRecord("T", 0, b"x" * (40 + 97 * i % 800), props)])
                await store.put_messages([MessageRecord("T", 1 + i % 2, b"other", {})])
                i += 1
            builder = RecordBatchBuilder("T")
            for _ in range(3 + 37 * round_ % 38):
                tag = "ab"[i % 2]
                builder.append(b"y" * (20 + 53 * i % 300), encode_properties({"UNIQ_KEY": f"ID{i}", "TAGS": tag}),
                               tags_code=zlib.crc32(tag.encode()))
                i += 1
            store.append_records("T", 0, bytes(builder.buffer), builder.count)

    asyncio.run(fill())
    queue = store._queues.get("T", 0)
    entries = queue.read_array(0, queue.max_offset)
    yield store, queue, entries["phys"].tolist(), entries["size"].tolist()
    asyncio.run(store.shutdown())


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_read_takes_what_the_vectorised_read_took(filled, data):
    store, queue, phys, sizes = filled
    commitlog = store._commitlog
    offset = data.draw(st.integers(0, queue.max_offset + 2))
    # (retention's cut at a record's start, just past it, or nowhere)
    cut = data.draw(st.just(0) | st.sampled_from(phys))
    retained = _Retained(commitlog, cut + data.draw(st.sampled_from([0, 0, 1])))
    # (max_bytes at the bytes of the next few records, one less or one more: where a record fits or not)
    fitted = sum(sizes[offset:offset + data.draw(st.integers(1, 20))]) + data.draw(st.sampled_from([0, 0, -1, 1]))
    args = dict(max_count=data.draw(st.integers(1, 40)),
                max_bytes=data.draw(st.integers(1, 6000) | st.just(max(fitted, 1))),
                tags_codes=data.draw(st.sampled_from([None, None, frozenset()]) | st.frozensets(st.sampled_from(
                    sorted(set(queue.read_array(0, queue.max_offset)["tags"].tolist()))))),
                max_scan=data.draw(st.integers(1, 15) | st.integers(1, 60)),  # (windows of fewer than 16 entries)
                limit=data.draw(st.none() | st.integers(0, queue.max_offset)))
    got = reads.read_records(queue, retained, offset, **args)
    assert got == _vectorised_read(queue, retained, offset, **args)
