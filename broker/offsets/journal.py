"""The offset journal: every change of the offset table since the last consumerOffset.json snapshot.

consumerOffset.json is written every 5 s, as in RocketMQ. A broker killed
between two snapshots used to come back with offsets up to 5 s old, and every
consumer re-read those 5 s of messages; a broker restarted every few seconds
re-delivered the same messages again and again. The journal closes that gap:
each applied change (a commit batch, an admin reset with its generation, a
group removal, a topic cleanup) is appended to a small log beside the snapshot,
and loading replays it on top of the snapshot.

Files: `consumerOffset.journal.<n>` in the config directory, n counting up.
A snapshot *rotates* the journal (later records go to segment n+1) before it
copies the table, so every record of segments <= n is in that snapshot; the
snapshot file says so (its "offsetJournalFrom" is n+1), and once it is durably
on disk those segments are deleted. A failed snapshot deletes nothing, and the
next successful one deletes them all. Loading replays, oldest first, every
segment from the snapshot's mark on (all of them for a file without the mark).

Why the mark: records are assignments ("queue q of topic@group is at offset
o", "entries of group g are gone"), so replaying a segment the snapshot already
contains would be harmless *if every change had been journalled*. It is not
when an append failed (a full disk): the change stands in memory and reaches
the snapshot, but an older record of the same entry is still in a covered
segment. A crash between writing the snapshot and deleting those segments
would then replay the older record over the newer snapshot and move the offset
backwards. Covered segments are therefore never replayed.

A failed append (the disk is full) is raised to the manager, which keeps the
change in memory and reports the journal as failing. The segment it went to
stays usable unless part of the write reached it: a write that failed wrote
nothing, so the next append continues the same intact segment, and a segment
nothing ever reached is removed, so a long disk-full episode leaves no trail of
empty files. Only a short write (a torn record inside the segment, which would
hide every later record from the replay) moves on to a new segment.

Durability: records are written with one os.write per applied batch (group
commit: a CommitOffsets batch of 500 commits is one write), not fsynced. That
is enough for a process crash (kill -9, OOM): what reached the kernel survives.
After a power loss the snapshot is the guarantee, as before. The write happens
on the event loop before the commit is answered; it copies a few hundred bytes
into the page cache and never waits for the disk.

Record layout (little-endian), one after another, no file header:

    u32 body length | u32 crc32(body) | body
    body: u8 op | u16 topic length | topic | u16 group length | group
          | u32 queue id | i64 offset | i64 reset generation

A torn tail (the process died inside a write) or a damaged record ends the
replay of that segment: the records before it count, the rest is ignored and
logged. A new process never appends to an old segment, so a torn tail is never
followed by good records in the same file.

Pure functions for the format; OffsetJournal does the file work.
"""

from __future__ import annotations

import enum
import errno
import os
import re
import struct
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

JOURNAL_PREFIX = "consumerOffset.journal."
_SEGMENT_NAME = re.compile(re.escape(JOURNAL_PREFIX) + r"(\d{1,19})")
_FRAME = struct.Struct("<II")  # body length, crc32 of the body
_HEAD = struct.Struct("<BH")  # op, topic length
_NAME_LEN = struct.Struct("<H")
_TAIL = struct.Struct("<Iqq")  # queue id, offset, reset generation
# Topic and group names are far shorter; anything bigger is damage, not a record.
MAX_BODY = _HEAD.size + 2 * 0xFFFF + _NAME_LEN.size + _TAIL.size


class Op(enum.IntEnum):
    SET = 1  # topic, group, queue id, offset: a commit (or replayed commit) stored this offset
    RESET = 2  # topic, group, queue id, offset, generation: an admin reset
    REMOVE_GROUP = 3  # group: every entry of the group is gone
    CLEAN_TOPIC = 4  # topic: every entry of the topic is gone


@dataclass(frozen=True, slots=True)
class JournalRecord:
    op: Op
    topic: str = ""
    group: str = ""
    queue_id: int = 0
    offset: int = 0
    generation: int = 0


class JournalDamage(ValueError):
    """Bytes that are not a whole, intact record."""


# -- encode / decode ----------------------------------------------------------


def encode_record(record: JournalRecord) -> bytes:
    topic = record.topic.encode("utf-8")
    group = record.group.encode("utf-8")
    body = b"".join((_HEAD.pack(record.op, len(topic)), topic, _NAME_LEN.pack(len(group)), group,
                     _TAIL.pack(record.queue_id, record.offset, record.generation)))
    return _FRAME.pack(len(body), zlib.crc32(body)) + body


def encode_records(records: Iterable[JournalRecord]) -> bytes:
    return b"".join(encode_record(r) for r in records)


@dataclass(frozen=True, slots=True)
class DecodedSegment:
    records: list[JournalRecord]
    valid_bytes: int  # the length of the intact prefix
    damage: str | None = None  # why decoding stopped before the end (None: the whole segment was intact)


def decode_records(data: bytes) -> DecodedSegment:
    """Decode the intact prefix of a segment; stop at the first torn or damaged record."""
    records: list[JournalRecord] = []
    pos = 0
    view = memoryview(data)
    while pos < len(data):
        try:
            record, size = _decode_one(view, pos)
        except JournalDamage as e:
            return DecodedSegment(records, pos, f"at byte {pos}: {e}")
        records.append(record)
        pos += size
    return DecodedSegment(records, pos)


def _decode_one(view: memoryview, pos: int) -> tuple[JournalRecord, int]:
    if len(view) - pos < _FRAME.size:
        raise JournalDamage(f"torn record header ({len(view) - pos} bytes)")
    length, crc = _FRAME.unpack_from(view, pos)
    start = pos + _FRAME.size
    if length > MAX_BODY or length < _HEAD.size + _NAME_LEN.size + _TAIL.size:
        raise JournalDamage(f"impossible record length {length}")
    if len(view) - start < length:
        raise JournalDamage(f"torn record ({len(view) - start} of {length} bytes)")
    body = view[start:start + length]
    if zlib.crc32(body) != crc:
        raise JournalDamage("checksum mismatch")
    try:
        op, topic_len = _HEAD.unpack_from(body, 0)
        at = _HEAD.size
        topic = bytes(body[at:at + topic_len]).decode("utf-8")
        at += topic_len
        (group_len,) = _NAME_LEN.unpack_from(body, at)
        at += _NAME_LEN.size
        group = bytes(body[at:at + group_len]).decode("utf-8")
        at += group_len
        queue_id, offset, generation = _TAIL.unpack_from(body, at)
        if at + _TAIL.size != length:
            raise JournalDamage("record length does not match its fields")
        return JournalRecord(Op(op), topic, group, queue_id, offset, generation), _FRAME.size + length
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        # A record with a good checksum and bad fields was written by a broken writer; stop all the same.
        raise JournalDamage(f"malformed record ({e})") from None


# -- files ----------------------------------------------------------------------


def segment_path(directory: Path, seq: int) -> Path:
    return directory / f"{JOURNAL_PREFIX}{seq:010d}"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(number, path) of every journal segment in `directory`, oldest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), directory / name) for name in names if (m := _SEGMENT_NAME.fullmatch(name))]
    return sorted(found)


@dataclass(frozen=True, slots=True)
class ReplayReport:
    segments: int  # replayed
    records: int
    damage: list[str]  # one line per segment whose tail was torn or damaged
    covered: int = 0  # segments left unread: the snapshot holds them (deleted by the next snapshot)


class OffsetJournal:
    """Append-only segments of JournalRecords beside consumerOffset.json.

    append() runs on the event loop; rotate() and discard_before() may run in a
    worker thread (a shutdown snapshot), so the current segment is guarded by a
    lock. A short write poisons the segment (the next append starts a new one);
    see the module docstring for the other failures.
    """

    def __init__(self, directory: Path) -> None:
        self._dir = Path(directory)
        self._lock = threading.Lock()
        self._seq = 1
        self._fd: int | None = None
        self._size = 0  # bytes that reached segment _seq (kept across close(): a reopen appends)
        self.write_errors = 0

    @property
    def current_seq(self) -> int:
        return self._seq

    def read_all(self, first: int = 0) -> tuple[list[JournalRecord], ReplayReport]:
        """Every intact record of the segments numbered `first` or higher (those below are in the
        snapshot), oldest first; later appends go to a new segment."""
        records: list[JournalRecord] = []
        damage: list[str] = []
        segments = list_segments(self._dir)
        replayed = [(number, path) for number, path in segments if number >= first]
        for _, path in replayed:
            try:
                decoded = decode_records(path.read_bytes())
            except OSError as e:
                damage.append(f"{path.name}: cannot be read ({e.strerror or e})")
                continue
            records.extend(decoded.records)
            if decoded.damage is not None:
                damage.append(f"{path.name} {decoded.damage}; {len(decoded.records)} records before it kept")
        with self._lock:
            self._close_locked()
            # Never below `first`: a segment numbered under the snapshot's mark would never be replayed.
            self._seq, self._size = max((segments[-1][0] + 1) if segments else 1, first), 0
        return records, ReplayReport(len(replayed), len(records), damage, len(segments) - len(replayed))

    def append(self, data: bytes) -> None:
        """Write encoded records to the current segment (one write; no fsync). Raises OSError."""
        if not data:
            return
        with self._lock:
            written = 0
            try:
                if self._fd is None:
                    self._dir.mkdir(parents=True, exist_ok=True)
                    self._fd = os.open(segment_path(self._dir, self._seq),
                                       os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
                written = os.write(self._fd, data)
                if written != len(data):
                    # A short write on a regular file means the next one would fail: the disk is full.
                    raise OSError(errno.ENOSPC, f"short write to the offset journal "
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
                segment_path(self._dir, self._seq).unlink()
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
        for number, path in list_segments(self._dir):
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


# -- replay -----------------------------------------------------------------------


def apply_records(table: dict, generations: dict, records: Iterable[JournalRecord]) -> int:
    """Apply records in order to an offset table and its reset generations (both
    `(topic, group) -> {queue id: value}`, changed in place); return how many were applied.

    The same rules as ConsumerOffsetManager's changes: a SET stores an offset, a RESET an offset and
    its generation, a removal drops every entry (offsets and generations) of a group or a topic.
    Records with impossible values (a writer bug; the checksum was fine) are skipped.
    """
    applied = 0
    for r in records:
        key = (r.topic, r.group)
        if r.op is Op.SET or r.op is Op.RESET:
            if not (r.topic and r.group and r.queue_id >= 0 and r.offset >= 0):
                continue
            table.setdefault(key, {})[r.queue_id] = r.offset
            if r.op is Op.RESET:
                generations.setdefault(key, {})[r.queue_id] = r.generation
        elif r.op is Op.REMOVE_GROUP or r.op is Op.CLEAN_TOPIC:
            index = 1 if r.op is Op.REMOVE_GROUP else 0
            name = r.group if index else r.topic
            for k in [k for k in table if k[index] == name]:
                del table[k]
            for k in [k for k in generations if k[index] == name]:
                del generations[k]
        applied += 1
    return applied
