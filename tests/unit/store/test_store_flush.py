"""Flushing: sync group commit, async periodic flush, checkpoint ordering, failures."""

from __future__ import annotations

import asyncio
import json
import os
import shutil

import pytest
from store_testlib import body_for

from tidemark.broker.errors import StoreError
from tidemark.broker.store import FlushMode
from tidemark.broker.store.flush import FileHandle, FlushJob


class FsyncRecorder:
    """Replaces os.fsync; records (path, size) after each real fsync finished."""

    def __init__(self, monkeypatch, *, fail: bool = False) -> None:
        self.events: list[tuple[str, int]] = []
        self._real = os.fsync
        self._fail = fail
        monkeypatch.setattr(os, "fsync", self)

    def __call__(self, fd: int) -> None:
        if self._fail:
            raise OSError(5, "Input/output error")
        self._real(fd)
        self.events.append((os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size))

    def commit_log(self, config) -> list[tuple[str, int]]:
        prefix = os.path.realpath(config.data_dir / "commitlog") + os.sep
        return [(p, size) for p, size in self.events if p.startswith(prefix)]


def _covered(config, events, result) -> bool:
    """Did a finished fsync of the result's segment include the whole record?"""
    start = (
        result.commit_log_offset // config.commitlog_segment_size * config.commitlog_segment_size
    )
    path = os.path.realpath(config.data_dir / "commitlog" / f"{start:020d}")
    end_in_segment = result.commit_log_offset + result.store_size - start
    return any(p == path and size >= end_in_segment for p, size in events)


def test_sync_put_returns_only_after_a_covering_fsync(
    config, open_store, make_records, monkeypatch
):
    async def scenario():
        store, _ = open_store(flush_mode=FlushMode.SYNC)
        await store.start()
        recorder = FsyncRecorder(monkeypatch)
        for i in range(40):  # crosses several segments
            (result,) = await store.put_messages(make_records(1, start=i))
            assert _covered(config, list(recorder.events), result), (
                f"put {i} returned before its fsync"
            )
        await store.shutdown()

    asyncio.run(scenario())


def test_sync_concurrent_puts_share_fsyncs(config, open_store, make_records, monkeypatch):
    async def scenario():
        store, _ = open_store(flush_mode=FlushMode.SYNC)
        await store.start()
        recorder = FsyncRecorder(monkeypatch)
        batches = await asyncio.gather(
            *(store.put_messages(make_records(1, start=i)) for i in range(50))
        )
        fsyncs = len(recorder.commit_log(config))
        events = list(recorder.events)
        await store.shutdown()
        return [b[0] for b in batches], fsyncs, events

    results, fsyncs, events = asyncio.run(scenario())
    assert sorted(r.queue_offset for r in results) == list(range(50))
    assert all(_covered(config, events, r) for r in results)
    assert 1 <= fsyncs < 50


def test_sync_puts_pending_at_shutdown_are_released_by_the_final_flush(open_store, make_records):
    async def scenario():
        store, _ = open_store(flush_mode=FlushMode.SYNC)
        await store.start()
        puts = [asyncio.create_task(store.put_messages(make_records(1, start=i))) for i in range(5)]
        await asyncio.sleep(0)  # the puts append and wait for their fsync
        await store.shutdown()
        return [(await p)[0].queue_offset for p in puts]

    assert asyncio.run(scenario()) == [0, 1, 2, 3, 4]
    store, report = open_store()
    assert report.clean_shutdown and store.max_offset("T", 0) == 5


def test_sync_puts_survive_a_crash_at_their_offsets(open_store, make_records):
    async def scenario():
        store, _ = open_store(flush_mode=FlushMode.SYNC)
        await store.start()
        return [(await store.put_messages(make_records(1, start=i)))[0] for i in range(30)]

    results = asyncio.run(scenario())  # no shutdown: killed
    store, report = open_store()
    assert not report.clean_shutdown
    for r in results:
        message = store.message_at("T", 0, r.queue_offset)
        assert (message.commit_log_offset, message.body) == (
            r.commit_log_offset,
            body_for(r.queue_offset),
        )


def test_async_put_does_not_wait_for_fsync(config, open_store, make_records, monkeypatch):
    async def scenario():
        store, _ = open_store()  # ASYNC, flush interval one hour
        await store.start()
        recorder = FsyncRecorder(monkeypatch)
        results = await store.put_messages(make_records(10))
        return results, recorder.commit_log(config)

    results, fsyncs = asyncio.run(scenario())
    assert len(results) == 10
    assert fsyncs == []


def test_async_periodic_flush_writes_the_checkpoint_after_both_logs(
    config, open_store, make_records, monkeypatch
):
    checkpoint = config.data_dir / "checkpoint"

    async def scenario():
        store, _ = open_store(flush_interval_ms=20)
        recorder = FsyncRecorder(monkeypatch)
        await store.start()
        await store.put_messages(make_records(30))
        target = store.commit_log_max_offset
        deadline = asyncio.get_running_loop().time() + 10
        while json.loads(checkpoint.read_text())["commit_log_offset"] != target:
            assert asyncio.get_running_loop().time() < deadline, (
                "the periodic flush never advanced the checkpoint"
            )
            await asyncio.sleep(0.01)
        return list(recorder.events), target

    events, target = asyncio.run(scenario())  # crash: only the periodic flush ran
    paths = [p for p, _ in events]
    checkpoint_write = next(i for i, p in enumerate(paths) if p.endswith(".checkpoint.tmp"))
    before = paths[:checkpoint_write]
    assert any("/commitlog/" in p for p in before)
    assert any("/consumequeue/T/0/" in p for p in before)

    _, report = open_store()
    assert report.scanned_from == target


def test_flush_failure_fails_puts_refuses_writes_and_a_failed_shutdown_is_not_clean(
    config, open_store, make_records, monkeypatch
):
    async def scenario():
        store, _ = open_store(flush_mode=FlushMode.SYNC)
        await store.start()
        FsyncRecorder(monkeypatch, fail=True)
        with pytest.raises(StoreError, match="flush failed"):
            await store.put_messages(make_records(1))
        with pytest.raises(StoreError, match="disk I/O error.*retry later"):
            await store.put_messages(make_records(1, start=1))
        with pytest.raises(StoreError, match="not marking it clean"):
            await store.shutdown()
        monkeypatch.undo()

    asyncio.run(scenario())
    assert (config.data_dir / "abort").exists()  # not a clean shutdown
    store, report = open_store()
    assert not report.clean_shutdown
    assert store.max_offset("T", 0) == 1  # written, never acknowledged, recovered


def test_flush_job_tolerates_files_deleted_under_it(tmp_path):
    directory = tmp_path / "queue"
    directory.mkdir()
    unlinked = FileHandle.create(directory / "a", 0, 100)
    unlinked.pwrite(b"x" * 10, 0)
    closed = FileHandle.create(directory / "b", 0, 100)
    closed.pwrite(b"y" * 10, 0)
    job = FlushJob((unlinked, closed), (directory,))

    (directory / "a").unlink()  # still open: fsync works on the orphaned inode
    closed.destroy()  # closed and deleted: fsync skips it
    job.run()
    shutil.rmtree(directory)  # the directory itself is gone
    job.run()
    unlinked.close()


def test_recovery_fsyncs_what_it_scanned_before_moving_the_checkpoint(
    config, open_store, make_records, monkeypatch
):
    async def crashed_run():
        store, _ = open_store()
        await store.start()
        return await store.put_messages(make_records(40))

    results = asyncio.run(crashed_run())  # the records may exist only in the page cache
    recorder = FsyncRecorder(monkeypatch)
    _, report = open_store()
    assert report.scanned_from == 0

    paths = [p for p, _ in recorder.events]
    checkpoint_write = next(i for i, p in enumerate(paths) if p.endswith(".checkpoint.tmp"))
    before = recorder.events[:checkpoint_write]
    assert all(_covered(config, before, r) for r in results)
    queue_prefix = os.path.realpath(config.data_dir / "consumequeue" / "T" / "0")
    assert sum(1 for p, _ in before if p.startswith(queue_prefix)) == len(os.listdir(queue_prefix))
