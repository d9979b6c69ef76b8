"""Segmented logs of framed records: the files under the offset journal and the pop journal.

A log is numbered segment files `<prefix><n>` in one directory, written by
appending framed records, read back oldest first. What each record holds is its
owner's business (offsets/journal.py, pop/journal.py); this module keeps the
rules both need:

- a frame is `u32 body length | u32 crc32(body) | body` (little-endian); a
  reader stops at the first torn or damaged frame of a segment and keeps what
  came before it, and a good checksum over fields that make no sense (a broken
  writer) stops it all the same;
- an append is one os.write, no fsync (what reached the kernel survives a
  process crash); a write that failed having written nothing leaves the
  segment usable, and a segment nothing ever reached is removed, so a long
  disk-full episode leaves no trail of empty files; a short write (a torn
  record, which would hide every later one) moves on to a new segment;
- reading starts a new segment for later appends: a torn tail is never
  followed by good records in the same file;
- `rotate` before a snapshot, `discard_before` once the snapshot is durable.

append() runs on the event loop; rotate() and discard_before() may run in a
worker thread (a snapshot write), so the current segment is guarded by a lock.
"""

from __future__ import annotations

import errno
import os
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from tidemark.common.crc import crc32

T = TypeVar("T")
FRAME = struct.Struct("<II")  # body length, crc32 of the body


class RecordDamage(ValueError):
    """Bytes that are not a whole, intact record."""


def frame(body: bytes) -> bytes:
    return FRAME.pack(len(body), crc32(body)) + body


@dataclass(frozen=True, slots=True)
class DecodedSegment(Generic[T]):
    items: list[T]
    valid_bytes: int  # the length of the intact prefix
    damage: str | None = None  # why decoding stopped before the end (None: the whole segment was intact)


def decode_segment(data: bytes, decode_body: Callable[[memoryview], T], *, min_body: int,
                   max_body: int) -> DecodedSegment[T]:
    """The intact prefix of a segment, each body decoded by `decode_body` (which raises RecordDamage,
    or ValueError, TypeError, KeyError, struct.error, UnicodeDecodeError for fields that make no sense)."""
    items: list[T] = []
    pos = 0
    view = memoryview(data)
    while pos < len(data):
        try:
            body = _body_at(view, pos, min_body, max_body)
            try:
                items.append(decode_body(body))
            except RecordDamage:
                raise
            except (ValueError, TypeError, KeyError, RecursionError, struct.error) as e:
                raise RecordDamage(f"malformed record ({e})") from None
        except RecordDamage as e:
            return DecodedSegment(items, pos, f"at byte {pos}: {e}")
        pos += FRAME.size + len(body)
    return DecodedSegment(items, pos)


def _body_at(view: memoryview, pos: int, min_body: int, max_body: int) -> memoryview:
    if len(view) - pos < FRAME.size:
        raise RecordDamage(f"torn record header ({len(view) - pos} bytes)")
    length, crc = FRAME.unpack_from(view, pos)
    start = pos + FRAME.size
    if not min_body <= length <= max_body:
        raise RecordDamage(f"impossible record length {length}")
    if len(view) - start < length:
        raise RecordDamage(f"torn record ({len(view) - start} of {length} bytes)")
    body = view[start:start + length]
    if crc32(body) != crc:
        raise RecordDamage("checksum mismatch")
    return body


def segment_path(directory: Path, prefix: str, seq: int) -> Path:
    return directory / f"{prefix}{seq:010d}"


def list_segments(directory: Path, prefix: str) -> list[tuple[int, Path]]:
    """(number, path) of every segment of the log `prefix` in `directory`, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    pattern = re.compile(re.escape(prefix) + r"(\d{1,19})")
    return sorted((int(m.group(1)), directory / name) for name in names if (m := pattern.fullmatch(name)))


@dataclass(frozen=True, slots=True)
class SegmentsRead(Generic[T]):
    items: list[T]
    damage: list[str]  # one line per segment whose tail was torn or damaged, or that could not be read
    replayed: int  # segments read
    covered: int  # segments left unread: numbered below `first` (a snapshot holds them)


class SegmentedLog:
    def __init__(self, directory: Path, prefix: str, what: str) -> None:
        self._dir = Path(directory)
        self._prefix = prefix
        self._what = what  # "offset journal": for error messages
        self._lock = threading.Lock()
        self._seq = 1
        self._fd: int | None = None
        self._size = 0  # bytes that reached segment _seq (kept across close(): a reopen appends)
        self.write_errors = 0

    @property
    def current_seq(self) -> int:
        return self._seq

    def segments(self) -> list[tuple[int, Path]]:
        return list_segments(self._dir, self._prefix)

    def read_segments(self, decode: Callable[[bytes], DecodedSegment[T]], first: int = 0) -> SegmentsRead[T]:
        """Every intact item of the segments numbered `first` or higher (those below are in the
        snapshot), oldest first; later appends go to a new segment."""
        items: list[T] = []
        damage: list[str] = []
        segments = self.segments()
        replayed = [(number, path) for number, path in segments if number >= first]
        for _, path in replayed:
            try:
                decoded = decode(path.read_bytes())
            except OSError as e:
                damage.append(f"{path.name}: cannot be read ({e.strerror or e})")
                continue
            items.extend(decoded.items)
            if decoded.damage is not None:
                damage.append(f"{path.name} {decoded.damage}; {len(decoded.items)} records before it kept")
        with self._lock:
            self._close_locked()
            # Never below `first`: a segment numbered under the snapshot's mark would never be replayed.
            self._seq, self._size = max((segments[-1][0] + 1) if segments else 1, first), 0
        return SegmentsRead(items, damage, len(replayed), len(segments) - len(replayed))

    def append(self, data: bytes) -> None:
        """Write encoded records to the current segment (one write; no fsync). Raises OSError."""
        if not data:
            return
        with self._lock:
            written = 0
            try:
                if self._fd is None:
                    self._dir.mkdir(parents=True, exist_ok=True)
                    self._fd = os.open(segment_path(self._dir, self._prefix, self._seq),
                                       os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
                written = os.write(self._fd, data)
                if written != len(data):
                    # A short write on a regular file means the next one would fail: the disk is full.
                    raise OSError(errno.ENOSPC, f"short write to the {self._what} "
                                                f"({written} of {len(data)} bytes)")
                self._size += written
            except OSError:
                self.write_errors += 1
                self._failed_locked(torn=written > 0)
                raise

    def _failed_locked(self, *, torn: bool) -> None:
        if torn:
            # Part of a record reached the segment: nothing after it would ever be replayed.
            self._close_locked()
            self._seq, self._size = self._seq + 1, 0
        elif self._size == 0:
            # Nothing ever reached this segment (O_CREAT made it empty): remove it and use the same
            # number next time, so each failed batch of a disk-full episode does not leave a file.
            self._close_locked()
            try:
                segment_path(self._dir, self._prefix, self._seq).unlink()
            except OSError:
                pass  # never created, or cannot go: an empty segment replays as nothing
        # else: the failed write wrote nothing; the segment is intact and the next append continues it.

    def rotate(self) -> int:
        """Start a new segment; return its number. Segments below it may go once a snapshot taken after
        this call is durable."""
        with self._lock:
            self._close_locked()
            self._seq, self._size = self._seq + 1, 0
            return self._seq

    def discard_before(self, seq: int) -> int:
        """Delete the segments numbered below `seq` (a snapshot covers them); return how many."""
        removed = 0
        for number, path in self.segments():
            if number >= seq:
                break
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass
        return removed

    def close(self) -> None:
        """Close the current segment (shutdown). An append after it opens the segment again."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass
