"""load(): restarting after clean shutdowns and crashes, with torn and corrupt files.

Each asyncio.run() is one broker process; leaving a store without shutdown()
is a kill -9 (see conftest).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from store_testlib import body_for

from tidemark.broker.store import GetStatus, MessageStore, PutResult


def _put_run(open_store, batches, *, crash: bool) -> tuple[MessageStore, list[PutResult]]:
    """One process: load, start, put each batch, then shut down or crash."""

    async def scenario():
        store, _ = open_store()
        await store.start()
        results = []
        for batch in batches:
            results += await store.put_messages(batch)
        if not crash:
            await store.shutdown()
        return store, results

    return asyncio.run(scenario())


def _all(store: MessageStore, topic: str = "T") -> list:
    return store.get_messages(
        topic, 0, store.min_offset(topic, 0), 10_000, max_scan=10_000
    ).messages


def _segment(config, offset: int) -> tuple[Path, int]:
    """The segment file holding commit-log `offset`, and the position inside it."""
    directory = config.data_dir / "commitlog"
    start = max(s for s in (int(n) for n in os.listdir(directory)) if s <= offset)
    return directory / f"{start:020d}", offset - start


def _flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0xFF]))


def _cut_commit_log(config, offset: int) -> None:
    """Truncate the commit log at `offset`, deleting later segments (a torn or lost tail)."""
    path, position = _segment(config, offset)
    os.truncate(path, position)
    for later in (config.data_dir / "commitlog").iterdir():
        if int(later.name) > int(path.name):
            later.unlink()


def test_clean_restart_keeps_everything(open_store, make_records):
    store, results = _put_run(
        open_store,
        [make_records(10), *[make_records(1, start=i) for i in range(10, 30)]],
        crash=False,
    )
    first_end = results[-1].commit_log_offset + results[-1].store_size

    store, report = open_store()
    assert report.clean_shutdown
    assert (report.scanned_from, report.commit_log_end) == (first_end, first_end)
    assert (report.truncated_bytes, report.redispatched, report.consume_queue_entries_dropped) == (
        0,
        0,
        0,
    )
    messages = _all(store)
    assert [(m.queue_offset, m.commit_log_offset, m.body) for m in messages] == [
        (r.queue_offset, r.commit_log_offset, body_for(r.queue_offset)) for r in results
    ]

    async def put_more():
        await store.start()
        result = await store.put_messages(make_records(1, start=30))
        await store.shutdown()
        return result

    assert asyncio.run(put_more())[0].queue_offset == 30


def test_torn_last_record_is_truncated_and_its_offset_reused(config, open_store, make_records):
    _, results = _put_run(open_store, [make_records(1, start=i) for i in range(20)], crash=True)
    last = results[-1]
    path, position = _segment(config, last.commit_log_offset)
    os.truncate(path, position + last.store_size // 2)  # the process died mid-write

    store, report = open_store()
    assert not report.clean_shutdown
    assert report.truncated_bytes == last.store_size // 2
    assert report.commit_log_end == last.commit_log_offset
    assert report.consume_queue_entries_dropped == 1
    assert store.max_offset("T", 0) == 19
    assert [m.body for m in _all(store)] == [body_for(i) for i in range(19)]
    assert store.message_at("T", 0, 19) is None
    assert store.read_message(last.commit_log_offset) is None

    async def put_again():
        await store.start()
        result = await store.put_messages(make_records(1, start=100))
        await store.shutdown()
        return result

    (again,) = asyncio.run(put_again())
    assert (again.queue_offset, again.commit_log_offset) == (19, last.commit_log_offset)
    store, _ = open_store()
    assert store.message_at("T", 0, 19).body == body_for(100)


def test_corrupt_record_after_the_checkpoint_drops_it_and_everything_after(
    config, open_store, make_records
):
    _, first = _put_run(open_store, [make_records(10)], crash=False)
    checkpoint = first[-1].commit_log_offset + first[-1].store_size
    _, second = _put_run(open_store, [make_records(1, start=i) for i in range(10, 40)], crash=True)
    end = second[-1].commit_log_offset + second[-1].store_size
    bad = second[5]  # queue offset 15
    path, position = _segment(config, bad.commit_log_offset)
    _flip_byte(path, position + bad.store_size - 3)  # inside the body: only the CRC can tell
    assert _segment(config, end - 1)[0] != path  # the damage is segments before the end

    store, report = open_store()
    assert report.scanned_from == checkpoint
    assert report.commit_log_end == bad.commit_log_offset
    assert report.truncated_bytes == end - bad.commit_log_offset
    assert store.max_offset("T", 0) == 15
    assert [m.body for m in _all(store)] == [body_for(i) for i in range(15)]
    assert store.get_messages("T", 0, 15, 10).status is GetStatus.OFFSET_OVERFLOW_ONE
    assert store.read_message(second[6].commit_log_offset) is None
    remaining = sorted(int(n) for n in os.listdir(config.data_dir / "commitlog"))
    assert remaining[-1] == int(path.name)


def test_segment_that_lost_its_tail_cuts_later_segments(config, open_store, make_records):
    _, results = _put_run(open_store, [make_records(1, start=i) for i in range(100)], crash=True)
    segments = sorted(int(n) for n in os.listdir(config.data_dir / "commitlog"))
    assert len(segments) >= 3
    second = config.data_dir / "commitlog" / f"{segments[1]:020d}"
    os.truncate(second, 300)  # its end-of-segment marker and most records are gone

    store, report = open_store()
    survivors = [r for r in results if r.commit_log_offset + r.store_size <= segments[1] + 300]
    # some records of the damaged segment survive
    assert survivors[-1].commit_log_offset >= segments[1]
    assert report.commit_log_end == survivors[-1].commit_log_offset + survivors[-1].store_size
    assert store.max_offset("T", 0) == len(survivors)
    assert sorted(int(n) for n in os.listdir(config.data_dir / "commitlog")) == segments[:2]
    assert [m.body for m in _all(store)] == [body_for(i) for i in range(len(survivors))]


@pytest.mark.parametrize(
    "cut_bytes, missing, dropped",
    [
        (40, 2, 0),  # the last two entries are gone
        (33, 2, 1),  # and one more entry is torn
        (None, 4, 0),  # the whole last file (entries 16..19) is gone
    ],
    ids=["missing-entries", "torn-entry", "missing-file"],
)
def test_consume_queue_missing_its_last_entries_is_rebuilt(
    config, open_store, make_records, cut_bytes, missing, dropped
):
    _, results = _put_run(open_store, [make_records(1, start=i) for i in range(20)], crash=True)
    queue_dir = config.data_dir / "consumequeue" / "T" / "0"
    last_file = queue_dir / sorted(os.listdir(queue_dir))[-1]
    if cut_bytes is None:
        last_file.unlink()
    else:
        os.truncate(last_file, last_file.stat().st_size - cut_bytes)

    store, report = open_store()
    assert report.redispatched == missing
    assert report.consume_queue_entries_dropped == dropped
    assert store.max_offset("T", 0) == 20
    assert [(m.queue_offset, m.commit_log_offset) for m in _all(store)] == [
        (r.queue_offset, r.commit_log_offset) for r in results
    ]


def test_consume_queue_ahead_of_the_commit_log_is_cut(config, open_store, make_records):
    _, results = _put_run(open_store, [make_records(1, start=i) for i in range(20)], crash=False)
    _cut_commit_log(config, results[17].commit_log_offset)  # a record boundary: nothing torn

    store, report = open_store()
    assert report.truncated_bytes == 0
    assert report.consume_queue_entries_dropped == 3  # queue offsets 17, 18, 19
    assert report.commit_log_end == results[17].commit_log_offset
    assert store.max_offset("T", 0) == 17
    assert store.get_messages("T", 0, 17, 10).status is GetStatus.OFFSET_OVERFLOW_ONE
    assert len(_all(store)) == 17


def test_abort_file_marks_an_unclean_shutdown(config, open_store, make_records):
    _put_run(open_store, [make_records(5)], crash=False)
    assert not (config.data_dir / "abort").exists()
    store, report = open_store()
    assert report.clean_shutdown
    assert (config.data_dir / "abort").exists()  # present while the store is open
    asyncio.run(store.shutdown())

    (config.data_dir / "abort").touch()
    store, report = open_store()
    assert not report.clean_shutdown
    assert len(_all(store)) == 5

    _put_run(open_store, [make_records(1, start=5)], crash=True)
    store, report = open_store()
    assert not report.clean_shutdown
    assert len(_all(store)) == 6


def test_restart_scans_only_from_the_checkpoint(config, open_store, make_records):
    _, first = _put_run(open_store, [make_records(1, start=i) for i in range(50)], crash=False)
    checkpoint = first[-1].commit_log_offset + first[-1].store_size
    # Damage before the checkpoint goes unnoticed: proof that the scan did not read it.
    path, position = _segment(config, first[3].commit_log_offset)
    _flip_byte(path, position + first[3].store_size - 1)

    _, report = open_store()
    assert report.scanned_from == checkpoint > 0
    assert report.truncated_bytes == 0

    _, second = _put_run(open_store, [make_records(5, start=50)], crash=True)
    store, report = open_store()
    assert not report.clean_shutdown
    assert report.scanned_from == checkpoint
    assert report.commit_log_end == second[-1].commit_log_offset + second[-1].store_size
    assert store.max_offset("T", 0) == 55


def test_recovery_repairs_are_checkpointed(config, open_store, make_records):
    _put_run(open_store, [make_records(1, start=i) for i in range(10)], crash=True)
    _, report = open_store()  # recovers, then crashes again right away
    assert report.scanned_from == 0

    store, report = open_store()
    assert report.scanned_from == report.commit_log_end == store.commit_log_max_offset
    assert report.redispatched == 0
