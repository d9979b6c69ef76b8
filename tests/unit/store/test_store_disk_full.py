"""A full or failing disk: writes are refused, the tail is cut back, and writes come back by themselves.

The disk is simulated by wrapping os.pwrite / os.fsync: `DiskBudget` lets a
number of bytes through to the files under one directory, then behaves like a
full file system (a short write, then ENOSPC), until the test frees it. The
write guard's probe is driven by hand (`store.guard.probe()`) so no test waits
for a timer; a store made with `resume_free_bytes=0` needs no real free space.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import os

import pytest
from store_testlib import body_for

from tidemark.broker.errors import StoreError
from tidemark.broker.store import FlushMode, MessageStore
from tidemark.broker.store.writability import GuardSettings, WriteGuard, WriteState, describe

NO_MARGIN = GuardSettings(probe_interval_s=3600, resume_free_bytes=0)


class DiskBudget:
    """os.pwrite under `root` succeeds for `budget` more bytes, then the disk is full."""

    def __init__(self, monkeypatch, root, budget: int) -> None:
        self.root = os.path.realpath(root) + os.sep
        self.budget = budget
        self._real = os.pwrite
        monkeypatch.setattr(os, "pwrite", self)

    def __call__(self, fd: int, data, position: int) -> int:
        if self.budget is None or not os.readlink(f"/proc/self/fd/{fd}").startswith(self.root):
            return self._real(fd, data, position)
        if self.budget <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = self._real(fd, memoryview(data)[: self.budget], position)  # a short write, like a real disk
        self.budget -= n
        return n

    def free(self) -> None:
        self.budget = None


def _open(config, **overrides) -> MessageStore:
    store = MessageStore(dataclasses.replace(config, **overrides), guard=NO_MARGIN)
    store.load()
    return store


def _file_sizes(directory) -> dict[str, int]:
    return {str(p.relative_to(directory)): p.stat().st_size for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("budget", [0, 100, 3000, 5000])
def test_a_batch_cut_short_by_a_full_disk_is_cut_back_and_writes_resume_after_the_probe(
    config, make_records, monkeypatch, budget
):
    # 4 KiB segments: a budget of 3000/5000 bytes lets the batch fill and seal a segment, then fail in the next.
    async def scenario():
        store = _open(config)
        await store.start()
        acked = [r for i in range(10) for r in await store.put_messages(make_records(1, start=i))]
        before = _file_sizes(config.data_dir / "commitlog"), _file_sizes(config.data_dir / "consumequeue")
        end = store.commit_log_max_offset
        disk = DiskBudget(monkeypatch, config.data_dir, budget)
        with pytest.raises(StoreError, match=r"disk full: No space left on device.*retry later"):
            await store.put_messages(make_records(60, start=10))  # ~9 KiB
        # Nothing of the failed batch is left: not in memory, not on disk.
        assert store.guard.state is WriteState.NOT_WRITABLE
        assert store.commit_log_max_offset == end and store.max_offset("T", 0) == 10
        assert (_file_sizes(config.data_dir / "commitlog"), _file_sizes(config.data_dir / "consumequeue")) \
            == before
        # Refused without touching the disk, with the same message, until the probe succeeds.
        with pytest.raises(StoreError, match="disk full"):
            await store.put_messages(make_records(1, start=10))
        disk.free()
        assert await store.guard.probe()
        assert store.guard.state is WriteState.WRITABLE
        acked += [r for i in range(10, 20) for r in await store.put_messages(make_records(1, start=i))]
        await store.shutdown()
        return acked

    acked = asyncio.run(scenario())
    store = _open(config)
    assert [r.queue_offset for r in acked] == list(range(20))
    for r in acked:
        message = store.message_at("T", 0, r.queue_offset)
        assert (message.commit_log_offset, message.body) == (r.commit_log_offset, body_for(r.queue_offset))
    assert store.max_offset("T", 0) == 20


def test_a_consume_queue_write_failure_takes_the_batch_out_of_the_commit_log_too(
    config, make_records, monkeypatch
):
    async def scenario():
        store = _open(config)
        await store.start()
        await store.put_messages(make_records(3))
        end = store.commit_log_max_offset
        DiskBudget(monkeypatch, config.data_dir / "consumequeue", 30)  # 1.5 entries fit
        with pytest.raises(StoreError, match="disk full"):
            await store.put_messages(make_records(4, start=3))
        assert store.commit_log_max_offset == end and store.max_offset("T", 0) == 3
        assert (config.data_dir / "consumequeue" / "T" / "0" / f"{0:020d}").stat().st_size == 3 * 20
        monkeypatch.undo()
        assert await store.guard.probe()
        (r,) = await store.put_messages(make_records(1, start=3))
        assert (r.queue_offset, r.commit_log_offset) == (3, end)
        # A crash now: recovery finds exactly the four acknowledged records.

    asyncio.run(scenario())
    store = _open(config)
    assert store.max_offset("T", 0) == 4
    assert [store.message_at("T", 0, i).body for i in range(4)] == [body_for(i) for i in range(4)]


def test_a_failed_flush_refuses_writes_until_the_probe_flushes_and_sync_puts_are_never_acked_unflushed(
    config, make_records, monkeypatch
):
    fsync_works = [True]
    real_fsync = os.fsync

    def fsync(fd):
        if not fsync_works[0]:
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)

    async def scenario():
        store = _open(config, flush_mode=FlushMode.SYNC)
        await store.start()
        await store.put_messages(make_records(2))
        fsync_works[0] = False
        with pytest.raises(StoreError, match="flush failed.*not acknowledged"):
            await store.put_messages(make_records(1, start=2))
        with pytest.raises(StoreError, match="disk I/O error"):
            await store.put_messages(make_records(1, start=3))
        assert not await store.guard.probe()  # the pending flush still fails
        fsync_works[0] = True
        assert await store.guard.probe()
        (r,) = await store.put_messages(make_records(1, start=3))
        await store.shutdown()
        return r

    r = asyncio.run(scenario())
    assert r.queue_offset == 3  # the unacknowledged record stayed stored: at-least-once, never lost
    store = _open(config)
    assert store.max_offset("T", 0) == 4


def test_shutdown_on_a_full_disk_is_not_clean_and_the_next_start_keeps_every_acknowledged_record(
    config, make_records, monkeypatch
):
    async def scenario():
        store = _open(config)
        await store.start()
        acked = [r for i in range(12) for r in await store.put_messages(make_records(1, start=i))]
        DiskBudget(monkeypatch, config.data_dir, 0)
        with pytest.raises(StoreError, match="disk full"):
            await store.put_messages(make_records(5, start=12))
        monkeypatch.setattr("tidemark.broker.store.checkpoint.atomic_write", _full_disk)  # no room for the checkpoint
        with pytest.raises(StoreError, match="not marking it clean"):
            await store.shutdown()
        return acked

    acked = asyncio.run(scenario())
    monkeypatch.undo()
    store = _open(config)
    assert (config.data_dir / "abort").exists()  # recovered, and open again
    assert store.max_offset("T", 0) == 12
    for r in acked:
        assert store.message_at("T", 0, r.queue_offset).body == body_for(r.queue_offset)


def _full_disk(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


# -- the guard alone ---------------------------------------------------------------


def test_guard_logs_and_notifies_once_per_episode_and_waits_for_room_and_a_repair(caplog):
    free = [0]
    repairs: list[str] = []
    changes: list[tuple[WriteState, str]] = []

    async def repair():
        repairs.append("repair")
        if len(repairs) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")

    async def scenario():
        guard = WriteGuard(settings=GuardSettings(resume_free_bytes=1000), free_bytes=lambda: free[0],
                           repair=repair)
        guard.add_listener(lambda state, reason: changes.append((state, reason)))
        guard.check()  # writable: no error
        for _ in range(3):
            guard.trip(StoreError("commit log write failed"))
        assert guard.state is WriteState.NOT_WRITABLE
        with pytest.raises(StoreError, match="store write failed: commit log write failed; .*retry later"):
            guard.check()
        assert not await guard.probe() and repairs == []  # no room yet: no repair attempted
        free[0] = 1000
        assert not await guard.probe() and repairs == ["repair"]  # the repair failed
        assert await guard.probe() and guard.state is WriteState.WRITABLE
        guard.check()
        guard.trip(OSError(errno.EIO, "Input/output error"))
        return guard

    with caplog.at_level(logging.INFO, logger="tidemark.broker.store"):
        asyncio.run(scenario())
    assert [state for state, _ in changes] == [WriteState.NOT_WRITABLE, WriteState.WRITABLE,
                                               WriteState.NOT_WRITABLE]
    assert changes[-1][1] == "disk I/O error: Input/output error"
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) == 3, lines  # one per state change, none per refused put or failed probe


def test_guard_probe_task_gives_writes_back_by_itself():
    async def scenario():
        guard = WriteGuard(settings=GuardSettings(probe_interval_s=0.01, resume_free_bytes=0),
                           free_bytes=lambda: 0, repair=_nothing)
        guard.start()
        guard.trip(OSError(errno.ENOSPC, "No space left on device"))
        async with asyncio.timeout(5):
            while guard.state is not WriteState.WRITABLE:
                await asyncio.sleep(0.01)
        await guard.stop()

    asyncio.run(scenario())


async def _nothing() -> None:
    return None


def test_describe_names_a_full_disk_through_wrapping_errors():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise StoreError("commit log write failed") from e
    except StoreError as wrapped:
        assert describe(wrapped) == "disk full: No space left on device"
    assert describe(OSError(errno.EIO, "Input/output error")) == "disk I/O error: Input/output error"
