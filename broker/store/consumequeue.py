"""ConsumeQueue: the per-(topic, queue id) index of commit-log positions.

`consumequeue/<topic>/<queueId>/` holds files of fixed 20-byte entries
(commit-log offset int64, size int32, tags code int64), each named by the
20-digit byte offset of its first entry in the logical queue, so queue offset
N lives at byte N * 20. max_offset comes from file sizes; entries are pread on
demand, never loaded into memory. Entries of one queue point at increasing
commit-log offsets, which is what makes the binary searches here valid.

Files are opened on demand through one OpenFiles cache shared by every queue
of the store, which bounds the fds held (a broker with 100,000 queues runs
under `ulimit -n 1024`); a queue keeps its files' sizes in memory, so
max_offset never needs an fd. Loading a queue only lists and stats its files.

Runs on the event-loop thread; flush jobs from the shared DirtySet run in the
flush thread.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from tidemark.broker.errors import StoreError
from tidemark.broker.store.codec import CQ_DTYPE, CQ_ENTRY, CQ_ENTRY_SIZE
from tidemark.broker.store.flush import DirtySet, FileHandle, FlushJob
from tidemark.broker.store.openfiles import OpenFiles
from tidemark.common.fsutil import fsync_dir
from tidemark.common.logs import get_logger
from tidemark.common.protocol import InvalidNameError, check_topic_name

log = get_logger("tidemark.broker.store")

FILE_NAME = re.compile(r"\d{20}")  # fullmatch
_TRASH_PREFIX = ".deleted-"  # topic names cannot start with '.', so these never clash

Entry = tuple[int, int, int]  # commit-log offset, size, tags code


class ConsumeQueue:
    def __init__(
        self,
        directory: Path,
        *,
        entries_per_file: int,
        dirty: DirtySet,
        open_files: OpenFiles,
        files: list[FileHandle] | None = None,
    ) -> None:
        self._dir = directory
        self._file_bytes = entries_per_file * CQ_ENTRY_SIZE
        self._dirty = dirty
        self._open_files = open_files
        self._files = files or []
        self._starts = [f.start for f in self._files]
        # RocketMQ's minLogicOffset: entries below it point at deleted commit-log segments.
        self._min_byte = self._files[0].start if self._files else 0

    @classmethod
    def load(
        cls, directory: Path, *, entries_per_file: int, dirty: DirtySet, open_files: OpenFiles
    ) -> tuple[ConsumeQueue, int]:
        """Find a queue's files (stat only, no fd), cutting torn entries and anything after a gap.

        Returns the queue and the number of entries dropped.
        """
        names = sorted(p.name for p in directory.iterdir() if FILE_NAME.fullmatch(p.name))
        files: list[FileHandle] = []
        dropped = 0
        for name in names:
            path = directory / name
            size = path.stat().st_size
            if files and files[-1].end != int(name):
                log.warning(
                    "consume queue %s has a gap before %s; dropping it and later files",
                    directory,
                    name,
                )
                dropped += size // CQ_ENTRY_SIZE
                path.unlink()
                dirty.add_dir(directory)
                continue
            if size % CQ_ENTRY_SIZE:
                log.warning("consume queue file %s ends in a torn entry; truncating", path)
                size -= size % CQ_ENTRY_SIZE
                os.truncate(path, size)
                dropped += 1
            files.append(FileHandle(path, int(name), size, size, cache=open_files))
        if files:
            files[-1].capacity = max(entries_per_file * CQ_ENTRY_SIZE, files[-1].size)
        queue = cls(directory, entries_per_file=entries_per_file, dirty=dirty,
                    open_files=open_files, files=files)
        return queue, dropped

    @property
    def min_offset(self) -> int:
        return min(self._min_byte, self._end_byte()) // CQ_ENTRY_SIZE

    @property
    def max_offset(self) -> int:
        """The next queue offset to assign."""
        return self._end_byte() // CQ_ENTRY_SIZE

    def _end_byte(self) -> int:
        return self._files[-1].end if self._files else self._min_byte

    def size_bytes(self) -> int:
        return sum(f.size for f in self._files)

    def files(self) -> list[FileHandle]:
        return list(self._files)

    # -- writing -------------------------------------------------------------------

    def append(self, first_offset: int, entries: bytes | bytearray) -> None:
        """Append encoded entries; `first_offset` must be max_offset (dispatch is in order)."""
        if first_offset != self.max_offset:
            raise StoreError(
                f"consume queue {self._dir} expected offset {self.max_offset}, got {first_offset}"
            )
        view = memoryview(entries)
        pos = first_offset * CQ_ENTRY_SIZE
        done = 0
        while done < len(view):
            handle = self._writable_file(pos)
            n = min(handle.start + handle.capacity - pos, len(view) - done)
            handle.pwrite(view[done : done + n], pos - handle.start)
            self._dirty.add_file(handle)
            done += n
            pos += n

    def _writable_file(self, pos: int) -> FileHandle:
        if self._files:
            last = self._files[-1]
            if last.size < last.capacity:
                return last
            pos = last.end
        if not self._dir.exists():
            self._dir.mkdir(parents=True)
            self._dirty.add_dir(self._dir.parent)
            self._dirty.add_dir(self._dir.parent.parent)
        handle = FileHandle.create(self._dir / f"{pos:020d}", pos, self._file_bytes,
                                   cache=self._open_files)
        self._files.append(handle)
        self._starts.append(pos)
        self._dirty.add_dir(self._dir)
        return handle

    # -- reading -------------------------------------------------------------------

    def read_entries(self, offset: int, count: int) -> list[Entry]:
        """Up to `count` entries from `offset` (clamped to what the files hold)."""
        return list(CQ_ENTRY.iter_unpack(self._read_raw(offset, count)))

    def read_array(self, offset: int, count: int) -> np.ndarray:
        """Up to `count` entries from `offset` as one numpy array (CQ_DTYPE: phys, size, tags)."""
        return np.frombuffer(self._read_raw(offset, count), dtype=CQ_DTYPE)

    def _read_raw(self, offset: int, count: int) -> bytes | memoryview:
        """The bytes of up to `count` whole entries from `offset`."""
        pos = offset * CQ_ENTRY_SIZE
        if not self._files or pos < self._files[0].start:
            return b""
        end = min((offset + count) * CQ_ENTRY_SIZE, self._end_byte())
        parts: list[bytes] = []
        while pos < end:
            handle = self._files[bisect_right(self._starts, pos) - 1]
            n = min(end, handle.end) - pos
            if n <= 0:
                break
            data = handle.pread(n, pos - handle.start)
            usable = len(data) - len(data) % CQ_ENTRY_SIZE
            parts.append(data if usable == len(data) else data[:usable])
            if usable < n:
                break
            pos += n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def entry_at(self, offset: int) -> Entry | None:
        entries = self.read_entries(offset, 1)
        return entries[0] if entries else None

    def first_offset_where(self, lo: int, hi: int, predicate: Callable[[Entry], bool]) -> int:
        """Binary search: the first offset in [lo, hi) whose entry satisfies a monotone predicate."""
        while lo < hi:
            mid = (lo + hi) // 2
            entry = self.entry_at(mid)
            if entry is not None and predicate(entry):
                hi = mid
            else:
                lo = mid + 1
        return lo

    # -- recovery and retention ----------------------------------------------------

    def ensure_entry(self, offset: int, commit_log_offset: int, size: int, tags_code: int) -> bool:
        """Recovery: make the entry at `offset` point at this record; True when it had to be written."""
        max_offset = self.max_offset
        if offset == max_offset:
            self.append(offset, CQ_ENTRY.pack(commit_log_offset, size, tags_code))
            return True
        if offset > max_offset:
            log.warning(
                "consume queue %s: record at %d has queue offset %d past max %d; not dispatched",
                self._dir,
                commit_log_offset,
                offset,
                max_offset,
            )
            return False
        if offset < self.min_offset:
            return False
        wanted = (commit_log_offset, size, tags_code)
        pos = offset * CQ_ENTRY_SIZE
        handle = self._files[bisect_right(self._starts, pos) - 1]
        # Present but maybe only in the page cache of the process that crashed:
        # it must be fsynced before the checkpoint moves past its record, even
        # if its fd is evicted before the flush job runs.
        handle.mark_unsynced()
        self._dirty.add_file(handle)
        if self.entry_at(offset) == wanted:
            return False
        # The commit log is the source of truth: repoint the entry in place.
        log.warning(
            "consume queue %s: entry %d disagrees with the commit log; rewriting", self._dir, offset
        )
        handle.pwrite(CQ_ENTRY.pack(*wanted), pos - handle.start)
        return True

    def truncate_from_commit_log_offset(self, commit_log_end: int) -> int:
        """Drop entries pointing at or past `commit_log_end`; return how many were dropped."""
        if not self._files:
            return 0
        hi = self.max_offset
        last = self.entry_at(hi - 1) if hi > 0 else None
        if last is None or last[0] < commit_log_end:
            return 0
        lo = self._files[0].start // CQ_ENTRY_SIZE
        cut = self.first_offset_where(lo, hi, lambda e: e[0] >= commit_log_end)
        self._truncate_to(cut)
        return hi - cut

    def _truncate_to(self, offset: int) -> None:
        pos = offset * CQ_ENTRY_SIZE
        index = max(bisect_right(self._starts, pos) - 1, 0)
        for later in self._files[index + 1 :]:
            later.destroy()
            self._dirty.discard_file(later)
        del self._files[index + 1 :]
        del self._starts[index + 1 :]
        handle = self._files[index]
        keep = max(0, pos - handle.start)
        if keep < handle.size:
            handle.truncate(keep)
            self._dirty.add_file(handle)
        handle.capacity = max(self._file_bytes, handle.capacity)
        # New entries will reuse the dropped offsets; they must not hide below min.
        self._min_byte = min(self._min_byte, handle.end)
        self._dirty.add_dir(self._dir)

    def correct_min_offset(self, commit_log_min: int) -> None:
        """Move min_offset to the first entry at or above the commit log's min offset and
        delete files wholly below it (never the last one, which carries max_offset)."""
        lo, hi = self.min_offset, self.max_offset
        first = self.entry_at(lo) if lo < hi else None
        if first is not None and first[0] < commit_log_min:
            new_min = self.first_offset_where(lo, hi, lambda e: e[0] >= commit_log_min)
            self._min_byte = new_min * CQ_ENTRY_SIZE
        while len(self._files) > 1 and self._files[0].end <= self._min_byte:
            handle = self._files.pop(0)
            del self._starts[0]
            handle.destroy()
            self._dirty.discard_file(handle)
            self._dirty.add_dir(self._dir)

    def close(self) -> None:
        for handle in self._files:
            handle.close()
            self._dirty.discard_file(handle)


class ConsumeQueueTable:
    """Every consume queue, by topic and queue id; created on first dispatch."""

    def __init__(
        self, root: Path, *, entries_per_file: int, dirty: DirtySet, max_open_files: int
    ) -> None:
        self._root = root
        self._entries_per_file = entries_per_file
        self._dirty = dirty
        self.open_files = OpenFiles(max_open_files)
        self._queues: dict[str, dict[int, ConsumeQueue]] = {}

    def load(self) -> int:
        """Open every queue directory; returns the number of torn entries dropped."""
        self._root.mkdir(parents=True, exist_ok=True)
        dropped = 0
        for topic_dir in sorted(self._root.iterdir()):
            if topic_dir.name.startswith(_TRASH_PREFIX):
                shutil.rmtree(topic_dir, ignore_errors=True)  # a delete_topic cut short
                continue
            try:
                check_topic_name(topic_dir.name)
            except InvalidNameError:
                log.warning("ignoring %s: not a topic directory", topic_dir)
                continue
            if not topic_dir.is_dir():
                continue
            for queue_dir in topic_dir.iterdir():
                if queue_dir.is_dir() and queue_dir.name.isascii() and queue_dir.name.isdigit():
                    queue, n = ConsumeQueue.load(
                        queue_dir, entries_per_file=self._entries_per_file, dirty=self._dirty,
                        open_files=self.open_files,
                    )
                    self._queues.setdefault(topic_dir.name, {})[int(queue_dir.name)] = queue
                    dropped += n
        return dropped

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        queues = self._queues.get(topic)
        return queues.get(queue_id) if queues else None

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        queues = self._queues.setdefault(topic, {})
        queue = queues.get(queue_id)
        if queue is None:
            directory = self._root / topic / str(queue_id)
            queue = queues[queue_id] = ConsumeQueue(
                directory, entries_per_file=self._entries_per_file, dirty=self._dirty,
                open_files=self.open_files,
            )
        return queue

    def __iter__(self) -> Iterator[ConsumeQueue]:
        for queues in self._queues.values():
            yield from queues.values()

    def topics(self) -> list[str]:
        return sorted(self._queues)

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(self._queues.get(topic, ()))

    def size_bytes(self) -> int:
        return sum(queue.size_bytes() for queue in self)

    def take_flush_job(self) -> FlushJob:
        return self._dirty.take()

    def restore_flush_job(self, job: FlushJob) -> None:
        self._dirty.restore(job)

    def full_flush_job(self) -> FlushJob:
        """Every file (shutdown): open ones are fsynced, evicted ones only if written since
        their last fsync, so 100,000 idle queues cost no open() each."""
        dirs = self._dirty.take().dirs
        return FlushJob(tuple(f for queue in self for f in queue.files()), dirs + (self._root,))

    def detach_topic(self, topic: str) -> None:
        """Forget the topic's queues and close their files (loop thread; remove_topic_dir follows)."""
        for queue in self._queues.pop(topic, {}).values():
            queue.close()

    def remove_topic_dir(self, topic: str) -> None:
        """Remove a detached topic's directory; durable before returning (flush thread).

        The directory is first renamed aside and the rename fsynced, so a crash
        can never bring back part of the old queues; load() sweeps leftovers.
        """
        topic_dir = self._root / topic
        if not topic_dir.exists():
            return
        trash = self._root / f"{_TRASH_PREFIX}{topic}-{time.time_ns()}"
        os.rename(topic_dir, trash)
        fsync_dir(self._root)
        shutil.rmtree(trash, ignore_errors=True)

    def close(self) -> None:
        for queue in self:
            queue.close()
