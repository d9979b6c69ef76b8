"""delete_topic and retention (delete_expired_segments)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from store_testlib import body_for

from tidemark.broker.store import GetStatus


@pytest.mark.parametrize("crash", [False, True], ids=["clean-restart", "unclean-restart"])
def test_deleted_topic_restarts_at_zero_and_old_records_stay_gone(
    config, open_store, make_records, crash
):
    async def scenario():
        store, _ = open_store()
        await store.start()
        await store.put_messages(make_records(10))  # old T
        await store.put_messages(make_records(3, topic="U"))
        await store.delete_topic("T")
        assert store.topics() == ["U"]
        assert store.get_messages("T", 0, 5, 10).status is GetStatus.NO_MESSAGE_IN_QUEUE
        assert store.max_offset("T", 0) == 0
        new = await store.put_messages(make_records(2, start=100))
        assert [r.queue_offset for r in new] == [0, 1]
        assert [m.body for m in store.get_messages("T", 0, 0, 10).messages] == [
            body_for(100),
            body_for(101),
        ]
        if not crash:
            await store.shutdown()

    asyncio.run(scenario())
    store, report = open_store()
    assert report.clean_shutdown is not crash
    # Unclean: the checkpoint is still 0, so the scan met the old records and had to skip them.
    assert report.scanned_from == (0 if crash else store.commit_log_max_offset)
    assert store.max_offset("T", 0) == 2
    assert [m.body for m in store.get_messages("T", 0, 0, 10).messages] == [
        body_for(100),
        body_for(101),
    ]
    assert [m.body for m in store.get_messages("U", 0, 0, 10).messages] == [
        body_for(i) for i in range(3)
    ]
    assert not any(name.startswith(".") for name in os.listdir(config.data_dir / "consumequeue"))

    asyncio.run(store.shutdown())
    # Once the checkpoint passed the deletion, the tombstone is no longer needed.
    assert json.loads((config.data_dir / "checkpoint").read_text())["deleted_topics"] == {}


def test_delete_unknown_topic_is_a_no_op(open_store):
    store, _ = open_store()
    asyncio.run(store.delete_topic("Nope"))
    assert store.topics() == []


def _segments(config) -> list[int]:
    return sorted(int(n) for n in os.listdir(config.data_dir / "commitlog"))


def test_forced_retention_advances_min_offsets(config, open_store, make_records):
    async def scenario():
        store, _ = open_store()
        await store.start()
        await store.put_messages(make_records(3, topic="Early"))  # only in the first segment
        results = [(await store.put_messages(make_records(1, start=i)))[0] for i in range(100)]
        return store, results

    store, results = asyncio.run(scenario())
    segments = _segments(config)
    assert len(segments) >= 4
    size_before = store.store_size_bytes()

    assert store.delete_expired_segments(force=True) == len(segments) - 1
    assert _segments(config) == segments[-1:]  # the active segment stays
    assert store.commit_log_min_offset == segments[-1]
    low = store.min_offset("T", 0)
    assert low == next(r.queue_offset for r in results if r.commit_log_offset >= segments[-1]) > 0
    assert store.max_offset("T", 0) == 100
    assert store.store_size_bytes() < size_before

    too_small = store.get_messages("T", 0, 0, 10)
    assert (too_small.status, too_small.next_begin_offset, too_small.min_offset) == (
        GetStatus.OFFSET_TOO_SMALL,
        low,
        low,
    )
    found = store.get_messages("T", 0, low, 1)
    assert (found.status, found.messages[0].body) == (GetStatus.FOUND, body_for(low))
    assert store.message_at("T", 0, low - 1) is None
    assert store.read_message(results[0].commit_log_offset) is None
    assert store.search_offset_by_timestamp("T", 0, 0) == low
    queue_files = sorted(int(n) for n in os.listdir(config.data_dir / "consumequeue" / "T" / "0"))
    assert queue_files[0] <= low * 20 < queue_files[0] + 8 * 20  # files wholly below min are gone

    early = store.get_messages("Early", 0, 0, 10)
    assert (early.status, early.min_offset, early.max_offset) == (
        GetStatus.NO_MESSAGE_IN_QUEUE,
        3,
        3,
    )

    asyncio.run(store.shutdown())
    store, _ = open_store()
    assert (store.min_offset("T", 0), store.max_offset("T", 0)) == (low, 100)
    assert store.min_offset("Early", 0) == store.max_offset("Early", 0) == 3


def test_retention_by_age_deletes_only_an_old_prefix(config, open_store, make_records):
    async def scenario():
        store, _ = open_store(file_reserved_hours=72)
        await store.start()
        for i in range(150):
            await store.put_messages(make_records(1, start=i))
        return store

    store = asyncio.run(scenario())
    segments = _segments(config)
    assert len(segments) >= 5
    old = time.time() - 100 * 3600
    for start in (segments[0], segments[1], segments[3]):  # segments[2] is young: [3] must survive
        os.utime(config.data_dir / "commitlog" / f"{start:020d}", (old, old))

    assert store.delete_expired_segments() == 2
    assert _segments(config) == segments[2:]
    assert store.delete_expired_segments() == 0

    for start in segments[2:]:
        os.utime(config.data_dir / "commitlog" / f"{start:020d}", (old, old))
    assert store.delete_expired_segments() == len(segments) - 3
    assert _segments(config) == segments[-1:]  # never the one being written
