"""No fsync on the event loop: config files, delayOffset.json, topic deletion, local consumer offsets.

Each scenario runs on an asyncio loop while os.fsync is wrapped to record the
thread it ran on; a call from the loop's thread fails the test.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from tidemark.broker.disk.metadata_file import MetadataFile
from tidemark.broker.ingest.delays import ScheduleMessageService
from tidemark.broker.membership.groups import SubscriptionGroupManager
from tidemark.broker.store import MessageRecord, MessageStore, StoreConfig
from tidemark.broker.topics import TopicConfigManager
from tidemark.client.consumer.offset_store import OFFSET_DIR_ENV, LocalFileOffsetStore
from tidemark.client.message import MessageQueue


@pytest.fixture
def fsync_threads(monkeypatch):
    """Names of the threads os.fsync ran on, with a marker for the loop's thread."""
    seen: list[str] = []
    real = os.fsync
    loop_thread: list[threading.Thread] = []

    def spy(fd):
        current = threading.current_thread()
        seen.append("LOOP" if loop_thread and current is loop_thread[0] else current.name)
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)

    def on_loop(coro_fn):
        async def run():
            loop_thread.append(threading.current_thread())
            await coro_fn()
        asyncio.run(run())
        return seen

    return on_loop


def test_config_files_are_written_off_the_loop(tmp_path, fsync_threads):
    topics, groups = TopicConfigManager(tmp_path), SubscriptionGroupManager(tmp_path)
    topics.load()
    groups.load()

    async def scenario():
        topics.create("Orders", 4)
        groups.ensure("billing")
        topics.update("Orders", write_queue_nums=2)
        await topics.file.flush()
        await groups.file.flush()

    seen = fsync_threads(scenario)
    assert seen and "LOOP" not in seen
    assert '"Orders"' in (tmp_path / "topics.json").read_text()
    assert '"billing"' in (tmp_path / "subscriptionGroup.json").read_text()


def test_a_burst_of_changes_is_written_in_few_writes(tmp_path, fsync_threads):
    writes = []
    doc = {"n": 0}
    file = MetadataFile(tmp_path / "c.json", lambda: (writes.append(dict(doc)), dict(doc))[1])

    async def scenario():
        for i in range(1, 101):
            doc["n"] = i
            file.changed()
        await file.flush()

    fsync_threads(scenario)
    assert writes[-1] == {"n": 100} and len(writes) <= 3
    assert '"n": 100' in (tmp_path / "c.json").read_text()


def test_schedule_progress_and_topic_deletion_are_written_off_the_loop(tmp_path, fsync_threads):
    store = MessageStore(StoreConfig(data_dir=tmp_path / "data"))
    store.load()
    schedule = ScheduleMessageService(store=store, config_dir=tmp_path, levels_ms=(1000,), clock_ms=lambda: 0)

    async def scenario():
        await store.start()
        await store.put_messages([MessageRecord("T", 0, b"x", {"UNIQ_KEY": "A"})])
        schedule._offsets[1] = 5  # progress of level 1, as a delivery pass leaves it
        schedule._dirty = True
        await schedule.persist()
        await store.delete_topic("T")
        await store.shutdown()

    seen = fsync_threads(scenario)
    assert seen and "LOOP" not in seen
    assert (tmp_path / "delayOffset.json").exists() and store.topics() == []


def test_broadcasting_offsets_are_written_off_the_loop(tmp_path, monkeypatch, fsync_threads):
    monkeypatch.setenv(OFFSET_DIR_ENV, str(tmp_path))
    offsets = LocalFileOffsetStore("client-1", "g")
    mq = MessageQueue("T", "broker-a", 0)

    async def scenario():
        offsets.update_offset(mq, 42, increase_only=False)
        await asyncio.gather(offsets.persist_all([mq]), offsets.persist_all([mq]))  # concurrent writes

    seen = fsync_threads(scenario)
    assert seen and "LOOP" not in seen
    assert '"offset": 42' in offsets.path.read_text()


def test_a_progress_write_cancelled_midway_finishes_before_the_next_begins(tmp_path, monkeypatch):
    """The delivery task is cancelled at shutdown while its write of delayOffset.json runs in a thread; the
    shutdown's own write then waits for that thread (both use the file's temporary name: a rename of a
    temporary file the other one already renamed failed with FileNotFoundError)."""
    import json
    import time

    from tidemark.broker.ingest import delays

    store = MessageStore(StoreConfig(data_dir=tmp_path / "data"))
    store.load()
    schedule = ScheduleMessageService(store=store, config_dir=tmp_path, levels_ms=(1000,), clock_ms=lambda: 0)
    real, running = delays.atomic_write, []

    def slow_write(path, data, **kw):
        running.append(1)
        assert len(running) == 1, "two writes of delayOffset.json at once"
        time.sleep(0.2)
        real(path, data, **kw)
        running.pop()

    monkeypatch.setattr(delays, "atomic_write", slow_write)

    async def scenario():
        schedule._offsets[1], schedule._dirty = 5, True
        first = asyncio.ensure_future(schedule.persist())
        await asyncio.sleep(0.05)  # its thread is writing
        first.cancel()
        schedule._offsets[1] = 6
        await schedule.persist()  # the shutdown's write
        await asyncio.gather(first, return_exceptions=True)

    asyncio.run(scenario())
    assert json.loads((tmp_path / "delayOffset.json").read_text())["offsetTable"] == {"1": 6}
