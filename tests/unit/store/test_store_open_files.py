"""A bounded set of open consume-queue fds: the LRU itself, reads and appends across many queues with
a tiny cache, durability of writes whose fd was evicted before the flush, recovery, and eviction
racing the flush thread."""

from __future__ import annotations

import asyncio
import json
import os
import threading

import pytest
from store_testlib import body_for

from tidemark.broker.store import GetStatus
from tidemark.broker.store.flush import FileHandle, FlushJob
from tidemark.broker.store.openfiles import OpenFiles

QUEUES = 12
CACHE = 3


def open_queue_fds(config) -> int:
    """fds of this process pointing into consumequeue/ (flush-thread dups included)."""
    prefix = os.path.realpath(config.data_dir / "consumequeue") + os.sep
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith(prefix):
                count += 1
        except FileNotFoundError:
            pass  # the listing's own fd, closed since
    return count


def queue_files(config, topic: str, queue_id: int) -> list[str]:
    directory = config.data_dir / "consumequeue" / topic / str(queue_id)
    return [os.path.realpath(directory / name) for name in sorted(os.listdir(directory))]


class FsyncLog:
    """Replaces os.fsync: records the path of each fd fsynced (after the real fsync)."""

    def __init__(self, monkeypatch, *, fail: bool = False) -> None:
        self.paths: list[str] = []
        self.fail = fail
        self._real = os.fsync
        monkeypatch.setattr(os, "fsync", self)

    def __call__(self, fd: int) -> None:
        if self.fail:
            raise OSError(5, "Input/output error")
        self._real(fd)
        self.paths.append(os.readlink(f"/proc/self/fd/{fd}"))


class Fake:
    def __init__(self, name: str, released: list[str]) -> None:
        self.name = name
        self._released = released

    def release_fd(self) -> None:
        self._released.append(self.name)


# -- the cache on its own -------------------------------------------------------------


def test_cache_evicts_the_least_recently_used_and_never_exceeds_capacity():
    released: list[str] = []
    cache = OpenFiles(2)
    a, b, c, d = (Fake(n, released) for n in "abcd")
    cache.admit(a)
    cache.admit(b)
    cache.touch(a)  # b is now the least recently used
    cache.admit(c)
    assert released == ["b"] and len(cache) == 2
    assert a in cache and c in cache and b not in cache
    cache.forget(a)  # closed by its owner: not released again, room made
    cache.admit(d)
    assert released == ["b"] and cache.evictions == 1
    cache.admit(b)
    assert released == ["b", "c"] and len(cache) == 2


def test_cache_needs_room_for_one_file():
    with pytest.raises(ValueError):
        OpenFiles(0)


def test_handle_that_fails_to_open_is_not_counted(tmp_path):
    cache = OpenFiles(2)
    handle = FileHandle(tmp_path / "missing", 0, 0, 100, cache=cache)
    with pytest.raises(FileNotFoundError):
        handle.pread(1, 0)
    assert len(cache) == 0


# -- FileHandle: what an eviction keeps -----------------------------------------------


def test_evicted_handle_reopens_on_use_and_its_fsync_still_happens(tmp_path, monkeypatch):
    cache = OpenFiles(1)
    first = FileHandle.create(tmp_path / "a", 0, 100, cache=cache)
    first.pwrite(b"x" * 20, 0)
    second = FileHandle.create(tmp_path / "b", 0, 100, cache=cache)  # evicts first
    assert first not in cache and second in cache
    fsyncs = FsyncLog(monkeypatch)

    FlushJob((first, second), ()).run()
    assert fsyncs.paths == [str(tmp_path / "a"), str(tmp_path / "b")]
    assert first not in cache  # the flush thread's fd was its own, not the cache's

    fsyncs.paths.clear()
    FlushJob((first,), ()).run()  # evicted and nothing written since: no open, no fsync
    assert fsyncs.paths == []
    assert first.pread(20, 0) == b"x" * 20  # reopened on demand, evicting second
    assert first in cache and second not in cache
    first.close()
    second.close()
    assert len(cache) == 0


def test_failed_fsync_of_an_evicted_handle_is_still_owed(tmp_path, monkeypatch):
    cache = OpenFiles(1)
    handle = FileHandle.create(tmp_path / "a", 0, 100, cache=cache)
    handle.pwrite(b"x" * 20, 0)
    handle.release_fd()
    fsyncs = FsyncLog(monkeypatch, fail=True)
    with pytest.raises(OSError):
        handle.fsync()
    fsyncs.fail = False
    handle.fsync()  # the retry (a restored job) reopens and fsyncs
    assert fsyncs.paths == [str(tmp_path / "a")]
    handle.close()


def test_eviction_racing_the_flush_thread_never_breaks_an_fsync(tmp_path):
    cache = OpenFiles(2)
    handles = [FileHandle.create(tmp_path / f"{i:02d}", 0, 1000, cache=cache) for i in range(8)]
    for h in handles:
        h.pwrite(b"y" * 20, 0)
    failures: list[BaseException] = []
    stop = threading.Event()

    def flush_thread() -> None:
        try:
            while not stop.is_set():
                for h in handles:
                    h.mark_unsynced()  # force reopen-or-dup on every pass
                FlushJob(tuple(handles), ()).run()
        except BaseException as exc:  # EBADF from a closed fd would land here
            failures.append(exc)

    thread = threading.Thread(target=flush_thread)
    thread.start()
    try:
        for i in range(3000):  # every read opens one fd and evicts another
            h = handles[i % len(handles)]
            h.pwrite(b"z" * 20, 20 * (i % 40))
            assert len(h.pread(20, 0)) == 20
            assert len(cache) <= 2
    finally:
        stop.set()
        thread.join()
    assert failures == []
    for h in handles:
        h.close()


# -- the store with a tiny cache ------------------------------------------------------


def test_reads_and_appends_across_many_queues_keep_fds_bounded(config, open_store, make_records):
    async def scenario():
        store, _ = open_store(max_open_consume_queue_files=CACHE)
        await store.start()
        for round_ in range(3):  # each queue crosses consume-queue files (8 entries each)
            for q in range(QUEUES):
                await store.put_messages(make_records(4, start=round_ * 4, queue_id=q))
                assert open_queue_fds(config) <= CACHE
        for q in reversed(range(QUEUES)):
            assert store.max_offset("T", q) == 12
            got = store.get_messages("T", q, 0, 32)
            assert [m.body for m in got.messages] == [body_for(i) for i in range(12)]
            raw = store.read_records("T", q, 5, max_count=32, max_bytes=1 << 20)
            assert raw.status is GetStatus.FOUND and raw.count == 7
            assert open_queue_fds(config) <= CACHE
        assert store._queues.open_files.evictions > QUEUES
        await store.shutdown()
        assert open_queue_fds(config) == 0

    asyncio.run(scenario())
    store, report = open_store(max_open_consume_queue_files=CACHE)
    assert report.clean_shutdown and report.redispatched == 0
    assert [store.max_offset("T", q) for q in range(QUEUES)] == [12] * QUEUES
    assert open_queue_fds(config) <= CACHE  # recovery reads every queue's tail through the cache


def test_periodic_flush_fsyncs_queue_files_evicted_since_their_write(
    config, open_store, make_records, monkeypatch
):
    checkpoint = config.data_dir / "checkpoint"

    async def scenario():
        store, _ = open_store(max_open_consume_queue_files=CACHE, flush_interval_ms=20)
        await store.start()
        # No await yields between these puts (async flush), so every one lands before
        # the next flush job is taken, and all but the last CACHE queues lose their fd.
        for q in range(QUEUES):
            await store.put_messages(make_records(3, queue_id=q))
        assert open_queue_fds(config) <= CACHE
        fsyncs = FsyncLog(monkeypatch)
        target = store.commit_log_max_offset
        deadline = asyncio.get_running_loop().time() + 10
        while json.loads(checkpoint.read_text())["commit_log_offset"] != target:
            assert asyncio.get_running_loop().time() < deadline, "the flush never moved the checkpoint"
            await asyncio.sleep(0.01)
        return fsyncs.paths

    paths = asyncio.run(scenario())  # then a crash: only the periodic flush ran
    before = paths[: next(i for i, p in enumerate(paths) if p.endswith(".checkpoint.tmp"))]
    for q in range(QUEUES):
        assert set(queue_files(config, "T", q)) <= set(before), f"queue {q} not fsynced before the checkpoint"


def test_shutdown_fsyncs_queue_files_evicted_since_their_write(config, open_store, make_records, monkeypatch):
    async def scenario():
        store, _ = open_store(max_open_consume_queue_files=CACHE)
        await store.start()
        for q in range(QUEUES):
            await store.put_messages(make_records(3, queue_id=q))
        fsyncs = FsyncLog(monkeypatch)
        await store.shutdown()
        return fsyncs.paths

    paths = asyncio.run(scenario())
    before = paths[: next(i for i, p in enumerate(paths) if p.endswith(".checkpoint.tmp"))]
    for q in range(QUEUES):
        assert set(queue_files(config, "T", q)) <= set(before), f"queue {q} not fsynced at shutdown"


def test_recovery_fsyncs_evicted_queue_files_before_moving_the_checkpoint(
    config, open_store, make_records, monkeypatch
):
    async def crashed_run():
        store, _ = open_store()
        await store.start()
        for q in range(QUEUES):
            await store.put_messages(make_records(3, queue_id=q))

    asyncio.run(crashed_run())  # the entries may exist only in the page cache
    leaked = open_queue_fds(config)  # the abandoned store's, as a killed process would leave none
    fsyncs = FsyncLog(monkeypatch)
    store, report = open_store(max_open_consume_queue_files=CACHE)
    assert not report.clean_shutdown and report.redispatched == 0
    before = fsyncs.paths[: next(i for i, p in enumerate(fsyncs.paths) if p.endswith(".checkpoint.tmp"))]
    for q in range(QUEUES):
        assert set(queue_files(config, "T", q)) <= set(before), f"queue {q} vouched for unsynced"
        assert store.max_offset("T", q) == 3
    assert open_queue_fds(config) - leaked <= CACHE


def test_recovery_cuts_queues_ahead_of_a_torn_commit_log_with_a_tiny_cache(config, open_store, make_records):
    async def crashed_run():
        store, _ = open_store()
        await store.start()
        results = []
        for q in range(QUEUES):
            results += await store.put_messages(make_records(2, queue_id=q))
        return results

    results = asyncio.run(crashed_run())
    cut = results[QUEUES].commit_log_offset  # the first record of queue QUEUES // 2
    segment = cut // config.commitlog_segment_size * config.commitlog_segment_size
    path = config.data_dir / "commitlog" / f"{segment:020d}"
    os.truncate(path, cut - segment + 10)  # a torn record
    for later in sorted(os.listdir(path.parent)):
        if int(later) > segment:
            os.unlink(path.parent / later)

    leaked = open_queue_fds(config)
    store, report = open_store(max_open_consume_queue_files=CACHE)
    assert report.commit_log_end == cut
    kept = QUEUES // 2
    assert [store.max_offset("T", q) for q in range(QUEUES)] == [2] * kept + [0] * (QUEUES - kept)
    assert open_queue_fds(config) - leaked <= CACHE
