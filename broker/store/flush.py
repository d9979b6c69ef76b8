"""Files, what is dirty in them, and the store's one background flush task.

Threading model: everything here is driven from the event-loop thread except
`FlushJob.run`, which fsyncs in the store's flush thread. A file can be closed
and deleted on the loop thread while the flush thread is about to fsync it, so
`FileHandle.fsync` takes the handle's lock only long enough to dup the fd: the
fsync then runs on the duplicate, which keeps the inode alive even if the file
was unlinked meanwhile (fsyncing a deleted file is harmless). Consume-queue
handles share an `OpenFiles` cache that closes the least recently used fd
(loop thread, same lock); an fsync owed by a handle whose fd was evicted reopens
the file (see openfiles.py for why that is as durable).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from tidemark.broker.errors import StoreError
from tidemark.broker.store.model import FlushMode
from tidemark.broker.store.openfiles import OpenFiles
from tidemark.common.fsutil import fsync_dir
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import cancel_and_wait

log = get_logger("tidemark.broker.store")


class FileHandle:
    """One segment or consume-queue file: its fd (opened lazily), logical start and size.

    With an `OpenFiles` cache (consume queues) the fd may be closed by an
    eviction at any time between two uses on the loop thread and reopened on
    the next use; without one (commit-log segments) it stays open until
    close(). `_unsynced` says whether bytes were written since the last fsync
    began: it is what lets `fsync` reopen an evicted file that needs it and
    skip the thousands that do not.
    """

    __slots__ = ("path", "start", "size", "capacity", "_fd", "_closed", "_lock", "_unsynced", "_cache")

    def __init__(
        self, path: Path, start: int, size: int, capacity: int, *, cache: OpenFiles | None = None
    ) -> None:
        self.path = path
        self.start = start  # offset of byte 0 in the log this file belongs to
        self.size = size  # bytes in the file
        self.capacity = capacity  # logical size; the file is full at this size
        self._fd = -1
        self._closed = False
        self._lock = threading.Lock()
        self._unsynced = False
        self._cache = cache

    @classmethod
    def create(
        cls, path: Path, start: int, capacity: int, *, cache: OpenFiles | None = None
    ) -> FileHandle:
        handle = cls(path, start, 0, capacity, cache=cache)
        fd = handle._open(os.O_RDWR | os.O_CREAT)
        if os.fstat(fd).st_size:
            # A leftover from before a truncation; its bytes are not part of the log.
            log.warning("discarding stale content of %s", path)
            os.ftruncate(fd, 0)
        handle._unsynced = True  # the new directory entry's inode, even when empty
        return handle

    @property
    def end(self) -> int:
        return self.start + self.size

    def fd(self) -> int:
        """The open fd (loop thread), opened now if it never was or was evicted."""
        if self._fd >= 0:
            if self._cache is not None:
                self._cache.touch(self)
            return self._fd
        if self._closed:
            raise StoreError(f"{self.path} is closed")
        return self._open(os.O_RDWR)

    def _open(self, flags: int) -> int:
        cache = self._cache
        if cache is not None:
            cache.admit(self)  # evicts first: the cache's bound holds at every moment
        try:
            fd = os.open(self.path, flags, 0o644)
        except BaseException:
            if cache is not None:
                cache.forget(self)
            raise
        with self._lock:
            self._fd = fd
        return fd

    def pread(self, n: int, position: int) -> bytes:
        return os.pread(self.fd(), n, position)

    def pwrite(self, data: bytes | bytearray | memoryview, position: int) -> None:
        fd = self.fd()
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, position)
            view = view[written:]
            position += written
            self._unsynced = True  # after the write: a concurrent fsync start cannot clear it early
        self.size = max(self.size, position)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd(), size)
        self._unsynced = True
        self.size = size

    def mark_unsynced(self) -> None:
        """Bytes another process wrote (recovery) that the next fsync must cover."""
        self._unsynced = True

    def fsync(self) -> None:
        """Flush-thread side: fsync unless the file was closed on the loop thread.

        An open fd is dup'ed under the lock, so neither close() nor an eviction
        can pull it away mid-fsync. A handle whose fd was evicted is reopened
        here when it was written since the last fsync began: fsync on a fresh
        fd of the same file flushes the dirty pages others wrote (Linux).
        """
        with self._lock:
            if self._closed:
                return
            unsynced, self._unsynced = self._unsynced, False
            fd = os.dup(self._fd) if self._fd >= 0 else -1
        try:
            if fd < 0:
                if not unsynced:
                    return  # evicted or never opened, nothing written since the last fsync
                try:
                    fd = os.open(self.path, os.O_RDONLY)
                except FileNotFoundError:
                    return  # deleted meanwhile (truncated away, topic removed): nothing to keep
            os.fsync(fd)
        except BaseException:
            self._unsynced = self._unsynced or unsynced  # still owed; the job is restored
            raise
        finally:
            if fd >= 0:
                os.close(fd)

    def release_fd(self) -> None:
        """Eviction (loop thread): close the fd; the next use reopens it, fsync still covers it."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            fd, self._fd = self._fd, -1
        if self._cache is not None:
            self._cache.forget(self)
        if fd >= 0:
            os.close(fd)

    def destroy(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class FlushJob:
    """Files and directories to fsync, captured on the loop thread, run in the flush thread."""

    files: tuple[FileHandle, ...]
    dirs: tuple[Path, ...]

    def __bool__(self) -> bool:
        return bool(self.files or self.dirs)

    def run(self) -> None:
        for handle in self.files:
            handle.fsync()
        for directory in self.dirs:
            try:
                fsync_dir(directory)
            except FileNotFoundError:
                pass  # deleted after it was created; nothing left to make durable


class DirtySet:
    """Files written and directories changed since the last flush job was taken."""

    def __init__(self) -> None:
        self._files: set[FileHandle] = set()
        self._dirs: set[Path] = set()

    def add_file(self, handle: FileHandle) -> None:
        self._files.add(handle)

    def add_dir(self, directory: Path) -> None:
        self._dirs.add(directory)

    def discard_file(self, handle: FileHandle) -> None:
        self._files.discard(handle)

    def take(self) -> FlushJob:
        job = FlushJob(tuple(self._files), tuple(self._dirs))
        self._files.clear()
        self._dirs.clear()
        return job

    def restore(self, job: FlushJob) -> None:
        """A job that did not finish: its files are dirty again."""
        self._files.update(job.files)
        self._dirs.update(job.dirs)


class FlushService:
    """The store's owned background task: periodic flush + checkpoint, and group commit.

    ASYNC mode: every `interval_s` it awaits `flush_all` (commit log, consume
    queues, checkpoint). SYNC mode additionally wakes up whenever a put waits
    (`wait_flushed`) and awaits `flush_commit_log`; every put that arrived
    before the fsync started and ends at or below the flushed offset is released
    by that one fsync (RocketMQ's GroupCommitService).

    When a flush fails (a full or failing disk) the service fails every waiter
    (their puts were not acknowledged), reports the error through `on_failure`
    (the store stops taking writes, see writability.py) and tries again after
    `retry_s`: the failed job's files went back to the dirty set, so the retry
    covers them. It does not log the failure itself; the store's write guard
    logs one line per episode, not one per retry.
    """

    def __init__(
        self,
        *,
        mode: FlushMode,
        interval_s: float,
        flushed_offset: int,
        flush_commit_log: Callable[[], Awaitable[int]],
        flush_all: Callable[[], Awaitable[int]],
        on_failure: Callable[[BaseException], None],
        retry_s: float = 1.0,
    ) -> None:
        self._mode = mode
        self._retry_s = retry_s
        self._retry_at = 0.0  # after a failure nothing is tried before this, unless flushed() says it works
        self._resumed = asyncio.Event()
        self._interval_s = interval_s
        self._flushed = flushed_offset
        self._flush_commit_log = flush_commit_log
        self._flush_all = flush_all
        self._on_failure = on_failure
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="store-flush")

    async def stop(self) -> None:
        """Cancel and await the task. Waiters stay queued for the caller's final flush."""
        task, self._task = self._task, None
        await cancel_and_wait(task)  # a failure was already reported through on_failure

    def wait_flushed(self, end_offset: int) -> asyncio.Future[None]:
        """A future resolved once the commit log is durable up to `end_offset`."""
        future = asyncio.get_running_loop().create_future()
        if end_offset <= self._flushed:
            future.set_result(None)
        else:
            self._waiters.append((end_offset, future))
            self._wakeup.set()
        return future

    def flushed(self, offset: int) -> None:
        """Release every waiter at or below `offset` (called after any commit-log fsync)."""
        self._flushed = max(self._flushed, offset)
        if self._retry_at:  # a flush worked (maybe the store's repair): the back-off is over
            self._retry_at = 0.0
            self._resumed.set()
        waiters = self._waiters
        while waiters and waiters[0][0] <= self._flushed:
            _, future = waiters.popleft()
            if not future.done():
                future.set_result(None)

    def fail_all(self, exc: BaseException) -> None:
        while self._waiters:
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_exception(exc)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_full = loop.time() + self._interval_s
        while True:
            timeout = next_full - loop.time()
            if loop.time() < self._retry_at:
                try:
                    async with asyncio.timeout(self._retry_at - loop.time()):
                        await self._resumed.wait()
                except TimeoutError:
                    pass
            elif timeout > 0 and not self._waiters:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancel that races with the event being set, and stop() would hang.
                try:
                    async with asyncio.timeout(timeout):
                        await self._wakeup.wait()
                except TimeoutError:
                    pass
            self._wakeup.clear()
            try:
                if loop.time() >= next_full:
                    offset = await self._flush_all()
                    next_full = loop.time() + self._interval_s
                elif self._mode is FlushMode.SYNC and self._waiters:
                    offset = await self._flush_commit_log()
                else:
                    continue
            except Exception as exc:
                log.debug("store flush failed: %s", exc)
                self.fail_all(StoreError(f"store flush failed ({exc}); the messages were not "
                                         "acknowledged, retry later"))
                self._on_failure(exc)
                self._retry_at = next_full = loop.time() + self._retry_s
                self._resumed.clear()
                continue
            self.flushed(offset)
