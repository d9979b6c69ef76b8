"""Files, what is dirty in them, and the store's one background flush task.

Threading model: everything here is driven from the event-loop thread except
`FlushJob.run`, which fsyncs in the store's flush thread. A file can be closed
and deleted on the loop thread while the flush thread is about to fsync it, so
`FileHandle.fsync` takes the handle's lock only long enough to dup the fd: the
fsync then runs on the duplicate, which keeps the inode alive even if the file
was unlinked meanwhile (fsyncing a deleted file is harmless).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from broker.errors import StoreError
from broker.store.model import FlushMode
from tidemark.fsutil import fsync_dir
from tidemark.logs import get_logger

log = get_logger("tidemark.broker.store")


class FileHandle:
    """One segment or consume-queue file: its fd (opened lazily), logical start and size."""

    __slots__ = ("path", "start", "size", "capacity", "_fd", "_closed", "_lock")

    def __init__(self, path: Path, start: int, size: int, capacity: int) -> None:
        self.path = path
        self.start = start  # offset of byte 0 in the log this file belongs to
        self.size = size  # bytes in the file
        self.capacity = capacity  # logical size; the file is full at this size
        self._fd = -1
        self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def create(cls, path: Path, start: int, capacity: int) -> FileHandle:
        handle = cls(path, start, 0, capacity)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(fd).st_size:
            # A leftover from before a truncation; its bytes are not part of the log.
            log.warning("discarding stale content of %s", path)
            os.ftruncate(fd, 0)
        handle._fd = fd
        return handle

    @property
    def end(self) -> int:
        return self.start + self.size

    def fd(self) -> int:
        if self._fd < 0:
            if self._closed:
                raise StoreError(f"{self.path} is closed")
            with self._lock:
                self._fd = os.open(self.path, os.O_RDWR)
        return self._fd

    def pread(self, n: int, position: int) -> bytes:
        return os.pread(self.fd(), n, position)

    def pwrite(self, data: bytes | bytearray | memoryview, position: int) -> None:
        fd = self.fd()
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, position)
            view = view[written:]
            position += written
        self.size = max(self.size, position)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd(), size)
        self.size = size

    def fsync(self) -> None:
        """Flush-thread side: fsync unless the file was closed on the loop thread."""
        with self._lock:
            if self._fd < 0:
                return
            dup = os.dup(self._fd)
        try:
            os.fsync(dup)
        finally:
            os.close(dup)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

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

    When a flush fails the store cannot know what reached the disk, so the
    service fails every waiter, reports the error through `on_failure` and stops
    (fail-stop: the broker must restart and recover).
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
    ) -> None:
        self._mode = mode
        self._interval_s = interval_s
        self._flushed = flushed_offset
        self._flush_commit_log = flush_commit_log
        self._flush_all = flush_all
        self._on_failure = on_failure
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="store-flush")

    async def stop(self) -> None:
        """Cancel and await the task. Waiters stay queued for the caller's final flush."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # our caller is being cancelled too; do not swallow that
        except Exception:
            pass  # already reported through on_failure

    def wait_flushed(self, end_offset: int) -> asyncio.Future[None]:
        """A future resolved once the commit log is durable up to `end_offset`."""
        future = asyncio.get_running_loop().create_future()
        if self._failure is not None:
            future.set_exception(StoreError(f"store flush failed: {self._failure}"))
        elif end_offset <= self._flushed:
            future.set_result(None)
        else:
            self._waiters.append((end_offset, future))
            self._wakeup.set()
        return future

    def flushed(self, offset: int) -> None:
        """Release every waiter at or below `offset` (called after any commit-log fsync)."""
        self._flushed = max(self._flushed, offset)
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
            if timeout > 0 and not self._waiters:
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
                log.exception("store flush failed; refusing further writes")
                self._failure = exc
                self.fail_all(StoreError(f"store flush failed: {exc}"))
                self._on_failure(exc)
                return
            self.flushed(offset)
