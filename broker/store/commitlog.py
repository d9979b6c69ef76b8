"""CommitLog: every message of every topic, appended to fixed-size segment files.

Segments live in `commitlog/`, each named by the 20-digit commit-log offset of
its first byte (RocketMQ's MappedFileQueue). A record never spans segments:
when the next record does not fit, the rest of the segment gets an
end-of-segment marker followed by zero padding (the file is extended to its
logical size), and writing continues in a new segment at start + segment size.
Room for the marker is always kept free, so a full segment always ends with one.

Nothing is kept in memory per message: reads pread the record from the
segment's fd. All methods run on the event-loop thread; flush jobs handed out by
`take_flush_job` run in the flush thread (see flush.py for the fd lifecycle).
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tidemark.broker.errors import StoreError, TruncateBelowOldestError
from tidemark.broker.store import batches, codec, logscan
from tidemark.broker.store.flush import DirtySet, FileHandle, FlushJob
from tidemark.broker.store.logscan import SEGMENT_NAME, RecordCallback
from tidemark.broker.store.model import StoredMessage
from tidemark.common.crc import crc32
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.store")

# Bytes before a replica's end that it and its master compare (CommitLog.tail_digest).
TAIL_DIGEST_BYTES = 4096
# A first read that catches most records whole, so one pread usually suffices.
_READ_GUESS = 4096

_PHYS = codec.PHYS_FIELD.unpack_from


def _run_intact(data: bytes, offset: int, sizes: list[int]) -> bool:
    """Whether `data` holds records of exactly these sizes, each stating its own offset."""
    if len(data) != sum(sizes):
        return False
    if len(sizes) >= _BULK_RUN:
        return _run_intact_bulk(data, offset, sizes)
    pos = 0
    prefix = codec.PREFIX.unpack_from
    for size in sizes:
        total, magic = prefix(data, pos)
        if total != size or magic != codec.MESSAGE_MAGIC or size < codec.MIN_RECORD_SIZE \
                or _PHYS(data, pos + codec.PHYS_OFFSET_FIELD)[0] != offset + pos:
            return False
        pos += size
    return True


# From this many records a run's check is one numpy pass over the gathered fields (fewer: a loop is cheaper).
_BULK_RUN = 32


def _run_intact_bulk(data: bytes, offset: int, sizes: list[int]) -> bool:
    """_run_intact over numpy: every record's size and magic fields, and its physical offset field, gathered
    at the starts the sizes give (each record at least MIN_RECORD_SIZE, so every field lies inside it)."""
    lengths = np.array(sizes, dtype=np.int64)
    if int(lengths.min()) < codec.MIN_RECORD_SIZE:
        return False
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    rows = batches._rows(np.frombuffer(data, dtype=np.uint8), 8)
    prefix = rows[starts].view(">i4")  # (size, magic) of each record
    phys = rows[starts + codec.PHYS_OFFSET_FIELD].view(">i8").reshape(-1)
    return bool((prefix[:, 0] == lengths).all() and (prefix[:, 1] == codec.MESSAGE_MAGIC).all()
                and (phys == starts + offset).all())


@dataclass(frozen=True, slots=True)
class ScanResult:
    scanned_from: int
    end: int
    truncated_bytes: int


class CommitLog:
    def __init__(self, directory: Path, *, segment_size: int, dirty: DirtySet) -> None:
        self._dir = directory
        self._segment_size = segment_size
        self._dirty = dirty
        self._segments: list[FileHandle] = []
        self._starts: list[int] = []  # parallel to _segments, for bisect
        self._write_end = 0

    @property
    def max_record_size(self) -> int:
        return self._segment_size - codec.BLANK_SIZE

    @property
    def segment_size(self) -> int:
        return self._segment_size

    @property
    def min_offset(self) -> int:
        return self._starts[0] if self._segments else self._write_end

    @property
    def max_offset(self) -> int:
        return self._write_end

    def size_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    # -- lifecycle -----------------------------------------------------------------

    def open(self) -> None:
        """Open the segment files; recover() then establishes the write position."""
        self._dir.mkdir(parents=True, exist_ok=True)
        names = sorted(p.name for p in self._dir.iterdir() if SEGMENT_NAME.fullmatch(p.name))
        for name in names:
            path = self._dir / name
            size = path.stat().st_size
            handle = FileHandle(path, int(name), size, size)
            handle.fd()
            self._segments.append(handle)
            self._starts.append(handle.start)
        if self._segments:
            last = self._segments[-1]
            last.capacity = max(self._segment_size, last.size)
            self._write_end = last.end

    def close(self) -> None:
        for segment in self._segments:
            segment.close()

    # -- writing -------------------------------------------------------------------

    def append(self, batch: codec.EncodedBatch) -> Sequence[int]:
        """Write an encoded batch (sealing each record); return each record's offset.

        The batch goes out in one pwrite unless it crosses a segment end. On an
        I/O error (a full disk) whatever part of the batch reached the files is
        cut back first, so the log ends where it ended before the call, then
        StoreError is raised (its __cause__ is the OSError). A batch that comes
        with its records' starts (checked in bulk) and fits its segment is
        sealed in bulk and its offsets are a numpy array.
        """
        buf = batch.buffer
        view = memoryview(buf)
        try:
            segment = self._writable_segment()
            start = self._write_end
            if batch.starts is not None and start + len(buf) <= segment.start + segment.capacity - codec.BLANK_SIZE:
                positions = batch.starts + start
                batches.seal_all(buf, batch.starts, batch.sizes, positions)
                self._write(segment, view, start)
                self._write_end = start + len(buf)
                return positions
            # (a batch checked in bulk that crosses a segment end: its positions as ints, as for any other)
            return self._append_each(segment, buf, view, batch.sizes if batch.starts is None else batch.sizes.tolist())
        except OSError as exc:
            try:
                self.cut_back(self._write_end)
            except OSError as undo:
                exc.add_note(f"cutting the commit log back to {self._write_end} failed too: {undo}")
            raise StoreError(f"commit log write failed: {exc}") from exc

    def _append_each(self, segment: FileHandle, buf: bytearray, view: memoryview, sizes: list[int]) -> list[int]:
        """append's record-by-record way: a segment end inside the batch, or a batch of the broker's own."""
        positions = []
        pos = chunk_pos = self._write_end
        limit = segment.start + segment.capacity - codec.BLANK_SIZE
        chunk_from = off = 0
        for size in sizes:
            if pos + size > limit:
                self._write(segment, view[chunk_from:off], chunk_pos)
                self._seal_segment(segment, pos)
                segment = self._new_segment(segment.start + segment.capacity)
                pos = chunk_pos = segment.start
                chunk_from = off
                limit = segment.start + segment.capacity - codec.BLANK_SIZE
            codec.seal(buf, view, off, size, pos)
            positions.append(pos)
            pos += size
            off += size
        self._write(segment, view[chunk_from:off], chunk_pos)
        self._write_end = pos
        return positions

    def cut_back(self, end: int) -> None:
        """Drop every byte at or past `end`, a record boundary at or below max_offset: the undo of
        appends that were not acknowledged (a batch a full disk cut short, or whose consume-queue
        entries could not be written).

        Unlike recovery's truncation this also cuts bytes past a segment's known
        size (a pwrite that failed half-way wrote some), and it never moves the
        write position forward. Raises OSError when the truncation fails; the
        caller retries later (writes stay refused meanwhile).
        """
        self.check_cut_back(end)
        index = bisect_right(self._starts, end) - 1
        if index >= 0:
            segment = self._segments[index]
            segment.truncate(max(0, end - segment.start))
            self._dirty.add_file(segment)
            for later in self._segments[index + 1 :]:
                later.destroy()
                self._dirty.discard_file(later)
            if len(self._segments) > index + 1:
                del self._segments[index + 1 :]
                del self._starts[index + 1 :]
                self._dirty.add_dir(self._dir)
        self._write_end = end

    def check_cut_back(self, end: int) -> None:
        """StoreError unless cut_back(end) may run: `end` within [min_offset, max_offset] (below the oldest
        record no segment holds it, and the log would end before it starts: TruncateBelowOldestError)."""
        if end > self._write_end:
            raise StoreError(f"cannot cut the commit log back to {end}: it ends at {self._write_end}")
        if end < self.min_offset:
            raise TruncateBelowOldestError(f"cannot cut the commit log back to {end}, below its oldest record "
                                           f"{self.min_offset}")

    def _writable_segment(self) -> FileHandle:
        if not self._segments:
            return self._new_segment(self._write_end)
        last = self._segments[-1]
        if self._write_end >= last.start + last.capacity:
            return self._new_segment(last.start + last.capacity)
        return last

    def _new_segment(self, start: int) -> FileHandle:
        handle = FileHandle.create(self._dir / f"{start:020d}", start, self._segment_size)
        self._segments.append(handle)
        self._starts.append(start)
        self._dirty.add_dir(self._dir)
        return handle

    def _write(self, segment: FileHandle, data: memoryview, pos: int) -> None:
        if data:
            segment.pwrite(data, pos - segment.start)
            self._dirty.add_file(segment)

    def _seal_segment(self, segment: FileHandle, pos: int) -> None:
        """End-of-segment marker, then extend the file to its logical size (zeros)."""
        segment.pwrite(
            codec.encode_blank(segment.start + segment.capacity - pos), pos - segment.start
        )
        segment.truncate(segment.capacity)
        self._dirty.add_file(segment)

    # -- replication -----------------------------------------------------------------

    def replication_chunk(self, offset: int, max_bytes: int) -> bytes:
        """Whole records from `offset` as they lie in the files (a segment's end marker comes with its
        padding), at most max_bytes unless the first record alone is bigger; b"" at the end. What a
        replica appends with append_replicated. StoreError when `offset` is outside the log."""
        if offset == self._write_end:
            return b""
        segment = self._segment_for(offset)
        if segment is None or offset > self._write_end or not self.is_boundary(offset):
            raise StoreError(f"offset {offset} is not a record start of the commit log "
                             f"[{self.min_offset}, {self._write_end}]")
        limit = min(segment.end, self._write_end) - offset
        data = segment.pread(min(max(max_bytes, codec.BLANK_SIZE), limit), offset - segment.start)
        pos = 0
        while pos + codec.BLANK_SIZE <= len(data):
            total, _magic = codec.PREFIX.unpack_from(data, pos)
            if total < codec.BLANK_SIZE or pos + total > len(data):
                break
            pos += total
        if pos == 0 and len(data) >= codec.BLANK_SIZE:  # one record bigger than max_bytes
            total, _magic = codec.PREFIX.unpack_from(data, 0)
            if codec.BLANK_SIZE <= total <= limit:
                return segment.pread(total, offset - segment.start)
        return data[:pos]

    def tail_digest(self, end: int) -> int | None:
        """crc32 of the bytes before the last message record ending at or before `end` (up to
        TAIL_DIGEST_BYTES, within its segment), with that record's end: how a replica and its master check
        that their logs agree up to the replica's end. Padding after a segment's end marker is left out
        (zeros in every log). None when `end` is not inside this log."""
        if end <= self.min_offset or end > self._write_end:
            return None
        segment = self._segment_for(end - 1)
        last = self._last_message_end(segment, end)
        start = max(segment.start, last - TAIL_DIGEST_BYTES)
        return crc32(last.to_bytes(8, "big"), crc32(segment.pread(last - start, start - segment.start)))

    def _last_message_end(self, segment: FileHandle, end: int) -> int:
        """The end of the last message record of `segment` ending at or before `end` (its start when none);
        walks the segment's record headers when `end` is past an end-of-segment marker."""
        if end < segment.start + segment.capacity:
            return end  # not a sealed segment's end: `end` follows a message record
        pos, last = segment.start, segment.start
        while pos + codec.BLANK_SIZE <= end:
            total, magic = codec.PREFIX.unpack_from(segment.pread(codec.BLANK_SIZE, pos - segment.start))
            if magic != codec.MESSAGE_MAGIC or total < codec.MIN_RECORD_SIZE:
                break
            pos += total
            last = pos
        return last

    def is_boundary(self, offset: int) -> bool:
        """Whether a record (or the log's end) starts at `offset`."""
        if offset == self._write_end:
            return True
        segment = self._segment_for(offset)
        if segment is None or offset >= segment.end:
            return False
        if offset == segment.start:
            return True
        header = segment.pread(codec.BLANK_SIZE, offset - segment.start)
        if len(header) < codec.BLANK_SIZE:
            return False
        total, magic = codec.PREFIX.unpack_from(header)
        if magic == codec.BLANK_MAGIC:
            return offset + total == segment.start + segment.capacity
        return magic == codec.MESSAGE_MAGIC and _PHYS(segment.pread(8, offset - segment.start
                                                                   + codec.PHYS_OFFSET_FIELD), 0)[0] == offset

    def record_digest(self, offset: int) -> int | None:
        """logscan.record_digest of the record starting at `offset`; None when no record starts there."""
        if offset >= self._write_end or not self.is_boundary(offset):
            return None
        segment = self._segment_for(offset)
        return logscan.record_digest(segment.pread, segment.start, offset)

    def record_starts(self, start: int, end: int) -> Iterator[int]:
        """The offsets where records (and end-of-segment markers) start in [start, end), from `start` (a record
        start) on, across segments (logscan.segment_record_starts)."""
        pos, end = start, min(end, self._write_end)
        while pos < end and (segment := self._segment_for(pos)) is not None:
            last = None
            for last in logscan.segment_record_starts(segment.pread, segment.start, segment.end, pos, end):
                yield last
            if last is None or segment.end < segment.start + segment.capacity or \
                    codec.PREFIX.unpack_from(segment.pread(codec.BLANK_SIZE, last - segment.start))[1] \
                    != codec.BLANK_MAGIC:
                return  # the end, or something that is not a record
            pos = segment.end  # after its end-of-segment marker: the next segment

    def segment_reader(self, offset: int) -> tuple[logscan.Read, int, int, Callable[[], None]] | None:
        """For reading the segment holding `offset` in another thread: a read through a duplicate of its fd
        (readable even if the segment is deleted meanwhile), the segment's start and end now, and what
        closes the duplicate. None when no segment holds it."""
        segment = self._segment_for(offset)
        if segment is None:
            return None
        fd = os.dup(segment.fd())
        return (lambda n, pos: os.pread(fd, n, pos)), segment.start, segment.end, lambda: os.close(fd)

    def segment_start(self, offset: int) -> int:
        """The start of the segment holding `offset` (a record boundary)."""
        return offset - offset % self._segment_size

    def append_replicated(self, offset: int, data: bytes, on_record: RecordCallback) -> None:
        """Write records copied from a master's commit log at the same offsets (the replica's side of
        replication_chunk). Every record is checked first (magic, size, CRC, its stated offset, an end
        marker exactly at its segment's end); StoreError and nothing written when one fails. An empty
        log starts at `offset` (the master's first segment); otherwise `offset` must be the end.
        on_record is called for each message, as in recovery."""
        if self._segments and offset != self._write_end:
            raise StoreError(f"replicated records start at {offset}, the commit log ends at {self._write_end}")
        if offset % self._segment_size:
            if not self._segments:
                raise StoreError(f"replication into an empty log must start at a segment, not at {offset}")
        view, pos, found = memoryview(data), 0, []
        while pos < len(data):
            here = offset + pos
            if pos + codec.BLANK_SIZE > len(data):
                raise StoreError(f"replicated data ends inside a record at {here}")
            total, magic = codec.PREFIX.unpack_from(view, pos)
            if total >= codec.BLANK_SIZE and pos + total > len(data):
                raise StoreError(f"replicated data ends inside a record at {here}")
            seg_end = here - here % self._segment_size + self._segment_size
            if magic == codec.BLANK_MAGIC:
                if here + total != seg_end:
                    raise StoreError(f"end-of-segment marker at {here} does not end its segment at {seg_end}")
            elif (magic != codec.MESSAGE_MAGIC or total < codec.MIN_RECORD_SIZE
                  or here + total > seg_end or not codec.crc_ok(view, pos, total)
                  or _PHYS(view, pos + codec.PHYS_OFFSET_FIELD)[0] != here):
                raise StoreError(f"replicated record at {here} is damaged or not where it says")
            else:
                _, _, _, queue_id, _, queue_offset, _ = codec.SCAN_FIELDS.unpack_from(view, pos)
                (tags_code,) = codec.TAGS_FIELD.unpack_from(view, pos + codec.TAGS_OFFSET)
                found.append((codec.scan_topic(view, pos), queue_id, queue_offset, here, total, tags_code))
            pos += total
        if not self._segments:
            self._write_end = offset
        pos = 0
        while pos < len(data):  # in pieces that end at segment ends
            segment = self._writable_segment()
            piece = min(len(data) - pos, segment.start + segment.capacity - self._write_end)
            try:
                self._write(segment, view[pos:pos + piece], self._write_end)
            except OSError as exc:
                self.cut_back(offset)
                raise StoreError(f"commit log write failed: {exc}") from exc
            self._write_end += piece
            pos += piece
        for record in found:
            on_record(*record)

    # -- flushing ------------------------------------------------------------------

    def take_flush_job(self) -> tuple[FlushJob, int]:
        """Dirty files and the offset they make durable once fsynced."""
        return self._dirty.take(), self._write_end

    def restore_flush_job(self, job: FlushJob) -> None:
        self._dirty.restore(job)

    def full_flush_job(self) -> tuple[FlushJob, int]:
        """Every open segment, dirty or not: for shutdown, after a job may have been lost."""
        self._dirty.take()
        return FlushJob(tuple(self._segments), (self._dir,)), self._write_end

    # -- reading -------------------------------------------------------------------

    def _segment_for(self, offset: int) -> FileHandle | None:
        i = bisect_right(self._starts, offset) - 1
        return self._segments[i] if i >= 0 else None

    def read_message(self, offset: int, size: int | None = None) -> StoredMessage | None:
        """The record starting at `offset`, or None when no record starts there."""
        segment = self._segment_for(offset)
        if segment is None or offset + codec.MIN_RECORD_SIZE > segment.end:
            return None
        available = segment.end - offset
        if size is not None and not codec.MIN_RECORD_SIZE <= size <= available:
            return None
        data = segment.pread(size or min(available, _READ_GUESS), offset - segment.start)
        if len(data) < codec.MIN_RECORD_SIZE:
            return None  # the file is shorter than we think: cut under us
        total, magic = codec.PREFIX.unpack_from(data)
        if magic != codec.MESSAGE_MAGIC or not codec.MIN_RECORD_SIZE <= total <= available:
            return None
        if size is not None and total != size:
            return None
        if total > len(data):
            data = segment.pread(total, offset - segment.start)
        try:
            message = codec.decode_record(data)
        except codec.CorruptRecordError:
            return None
        # A record stores its own offset: anything else means offset is inside some record.
        return message if message.commit_log_offset == offset else None

    def read_run(self, offset: int, sizes: list[int]) -> tuple[bytes, int]:
        """Records lying back to back from `offset` (sizes from the consume queue), with one pread.

        Returns their bytes and how many there are. A record that is not where
        and what the consume queue says (cut or overwritten under us) is left
        out, as read_message would return None for it.
        """
        total = sum(sizes)
        segment = self._segment_for(offset)
        if segment is not None and offset + total <= segment.end:
            data = segment.pread(total, offset - segment.start)
            if _run_intact(data, offset, sizes):
                return data, len(sizes)
        kept = []
        for size in sizes:
            record = self._read_record_bytes(offset, size)
            if record is not None:
                kept.append(record)
            offset += size
        return b"".join(kept), len(kept)

    def _read_record_bytes(self, offset: int, size: int) -> bytes | None:
        segment = self._segment_for(offset)
        if segment is None or offset + size > segment.end:
            return None
        data = segment.pread(size, offset - segment.start)
        return data if _run_intact(data, offset, [size]) else None

    def read_store_timestamp(self, offset: int) -> int | None:
        segment = self._segment_for(offset)
        if segment is None or offset + codec.HEADER_SIZE > segment.end:
            return None
        header = segment.pread(codec.HEADER_SIZE, offset - segment.start)
        fields = codec.HEADER.unpack_from(header)
        if fields[1] != codec.MESSAGE_MAGIC or fields[6] != offset:
            return None
        return fields[9]

    # -- recovery ------------------------------------------------------------------

    def recover(self, start: int | None, on_record: RecordCallback) -> ScanResult:
        """Validate records from `start` to the end; truncate at the first invalid one.

        `start` is the checkpoint (None: scan everything). Calls on_record for
        every valid record, in commit-log order. Work is proportional to the
        bytes after `start`.
        """
        if not self._segments:
            return ScanResult(self._write_end, self._write_end, 0)
        start = self._clamp_scan_start(start)
        index = bisect_right(self._starts, start) - 1
        pos = start
        while True:
            segment = self._segments[index]
            # Scanned bytes may sit only in the crashed process's page cache.
            self._dirty.add_file(segment)
            pos, ok = logscan.scan_segment(segment.pread, segment.start, segment.end, pos, on_record)
            if not ok or index + 1 == len(self._segments):
                break
            if self._starts[index + 1] != pos:
                log.warning("commit log has a gap: segment %s ends at %d", segment.path.name, pos)
                ok = False
                break
            index += 1
        truncated = 0 if ok else self._truncate_at(index, pos)
        self._write_end = pos
        return ScanResult(start, pos, truncated)

    def _clamp_scan_start(self, start: int | None) -> int:
        if start is None or start < self.min_offset:
            return self.min_offset
        segment = self._segment_for(start)
        if start > segment.end:
            # The checkpoint promises bytes the files no longer have (lost or cut
            # externally); a segment start is always a record boundary.
            log.warning(
                "checkpoint %d is past the commit log's data (%d); rescanning segment %s",
                start,
                segment.end,
                segment.path.name,
            )
            return segment.start
        return start

    def _truncate_at(self, index: int, pos: int) -> int:
        segment = self._segments[index]
        removed = segment.size - (pos - segment.start)
        if removed:
            segment.truncate(pos - segment.start)
            self._dirty.add_file(segment)
        for later in self._segments[index + 1 :]:
            removed += later.size
            later.destroy()
        del self._segments[index + 1 :]
        del self._starts[index + 1 :]
        segment.capacity = max(self._segment_size, segment.capacity)
        self._dirty.add_dir(self._dir)
        log.warning("truncated the commit log at %d", pos,
                    event="commitlog_truncated", offset=pos, dropped_bytes=removed)
        return removed

    # -- retention -----------------------------------------------------------------

    def delete_expired(self, *, now_s: float, reserved_s: float, force: bool) -> int:
        """Delete the oldest segments whose mtime is older than reserved_s; never the last one.

        Stops at the first segment still to keep, so the log never has holes
        (RocketMQ's deleteExpiredFileByTime).
        """
        deleted = 0
        while len(self._segments) > 1:
            segment = self._segments[0]
            if not force and now_s - segment.path.stat().st_mtime < reserved_s:
                break
            segment.destroy()
            self._dirty.discard_file(segment)
            del self._segments[0]
            del self._starts[0]
            deleted += 1
        if deleted:
            self._dirty.add_dir(self._dir)
            log.info(
                "deleted %d expired commit log segments; min offset is now %d",
                deleted,
                self.min_offset,
            )
        return deleted
