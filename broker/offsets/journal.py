"""The offset journal: every change of the offset table since the last consumerOffset.json snapshot.

consumerOffset.json is written every 5 s, as in RocketMQ. A broker killed
between two snapshots used to come back with offsets up to 5 s old, and every
consumer re-read those 5 s of messages; a broker restarted every few seconds
re-delivered the same messages again and again. The journal closes that gap:
each applied change (a commit batch, an admin reset with its generation, a
group removal, a topic cleanup, a group's offsets of one topic deleted) is appended to a small log beside the snapshot,
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
when an append failed (a full disk) for a change the manager keeps anyway (a
pop watermark, a mirrored table: manager.py): the change stands in memory and
reaches the snapshot, but an older record of the same entry is still in a
covered segment. A crash between writing the snapshot and deleting those segments
would then replay the older record over the newer snapshot and move the offset
backwards. Covered segments are therefore never replayed.

A failed append (the disk is full) is raised to the manager, which refuses
and undoes the change (or, for the changes above, keeps it in memory) and
reports the journal as failing. The segment it went to stays usable: a write
that failed wrote nothing, so the next append continues the same intact
segment; a short write is cut off again, so none of its records comes back at
the next replay (the manager refused them all); and a segment nothing ever
reached is removed, so a long disk-full episode leaves no trail of empty files.
Only a short write that cannot be cut off moves on to a new segment.

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
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tidemark.broker.disk import segments
from tidemark.broker.disk.segments import FRAME, DecodedSegment, RecordDamage, SegmentedLog, frame
from tidemark.common.crc import crc32

JOURNAL_PREFIX = "consumerOffset.journal."
_HEAD = struct.Struct("<BH")  # op, topic length
_NAME_LEN = struct.Struct("<H")
_TAIL = struct.Struct("<Iqq")  # queue id, offset, reset generation
# Topic and group names are far shorter; anything bigger is damage, not a record.
MIN_BODY = _HEAD.size + _NAME_LEN.size + _TAIL.size
MAX_BODY = _HEAD.size + 2 * 0xFFFF + _NAME_LEN.size + _TAIL.size


class Op(enum.IntEnum):
    SET = 1  # topic, group, queue id, offset: a commit (or replayed commit) stored this offset
    RESET = 2  # topic, group, queue id, offset, generation: an admin reset
    REMOVE_GROUP = 3  # group: every entry of the group is gone
    CLEAN_TOPIC = 4  # topic: every entry of the topic is gone
    REMOVE_GROUP_TOPIC = 5  # topic, group: the group's entries of that topic are gone (delete-offsets)


@dataclass(slots=True)  # not frozen: one is built per applied commit (for a master's replicas), 4x faster so
class JournalRecord:
    op: Op
    topic: str = ""
    group: str = ""
    queue_id: int = 0
    offset: int = 0
    generation: int = 0


# -- encode / decode ----------------------------------------------------------


def encode_record(record: JournalRecord) -> bytes:
    topic = record.topic.encode("utf-8")
    group = record.group.encode("utf-8")
    return frame(b"".join((_HEAD.pack(record.op, len(topic)), topic, _NAME_LEN.pack(len(group)), group,
                           _TAIL.pack(record.queue_id, record.offset, record.generation))))


def encode_records(records: Iterable[JournalRecord]) -> bytes:
    return b"".join(encode_record(r) for r in records)


class SetEncoder:
    """`encode_record` of SET records, with each entry's op and names encoded once: commits write the same
    few entries again and again (a CommitOffsets message is one commit per queue of a few topic@groups).
    The same bytes as encode_record (tested)."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit  # entries kept; past it the cache starts again (a table of many groups)
        self._prefixes: dict[tuple[str, str], bytes] = {}

    def encode(self, topic: str, group: str, queue_id: int, offset: int) -> bytes:
        prefix = self._prefixes.get((topic, group))
        if prefix is None:
            if len(self._prefixes) >= self._limit:
                self._prefixes.clear()
            t, g = topic.encode("utf-8"), group.encode("utf-8")
            prefix = self._prefixes[(topic, group)] = b"".join(
                (_HEAD.pack(Op.SET, len(t)), t, _NAME_LEN.pack(len(g)), g))
        body = prefix + _TAIL.pack(queue_id, offset, 0)
        return FRAME.pack(len(body), crc32(body)) + body


def decode_records(data: bytes) -> DecodedSegment[JournalRecord]:
    """Decode the intact prefix of a segment; stop at the first torn or damaged record."""
    return segments.decode_segment(data, _decode_body, min_body=MIN_BODY, max_body=MAX_BODY)


def _decode_body(body: memoryview) -> JournalRecord:
    op, topic_len = _HEAD.unpack_from(body, 0)
    at = _HEAD.size
    topic = bytes(body[at:at + topic_len]).decode("utf-8")
    at += topic_len
    (group_len,) = _NAME_LEN.unpack_from(body, at)
    at += _NAME_LEN.size
    group = bytes(body[at:at + group_len]).decode("utf-8")
    at += group_len
    queue_id, offset, generation = _TAIL.unpack_from(body, at)
    if at + _TAIL.size != len(body):
        raise RecordDamage("record length does not match its fields")
    return JournalRecord(Op(op), topic, group, queue_id, offset, generation)


# -- files ----------------------------------------------------------------------


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(number, path) of every journal segment in `directory`, oldest first."""
    return segments.list_segments(directory, JOURNAL_PREFIX)


@dataclass(frozen=True, slots=True)
class ReplayReport:
    segments: int  # replayed
    records: int
    damage: list[str]  # one line per segment whose tail was torn or damaged
    covered: int = 0  # segments left unread: the snapshot holds them (deleted by the next snapshot)


class OffsetJournal(SegmentedLog):
    """Append-only segments of JournalRecords beside consumerOffset.json (broker/disk/segments.py: a short
    write is cut off again; see the module docstring for the other failures)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, JOURNAL_PREFIX, "offset journal")

    def _failed_locked(self, *, torn: bool) -> None:
        if torn and self._fd is not None:
            # Cut the short write off: the manager refused the whole batch, so none of its whole records
            # may come back at the next replay, and a torn one would hide every later record. Shrinking a
            # file needs no space; only if even that fails does the next append move on to a new segment.
            try:
                os.ftruncate(self._fd, self._size)
                return
            except OSError:
                pass
        super()._failed_locked(torn=torn)

    def read_all(self, first: int = 0) -> tuple[list[JournalRecord], ReplayReport]:
        """Every intact record of the segments numbered `first` or higher (those below are in the
        snapshot), oldest first; later appends go to a new segment."""
        read = self.read_segments(decode_records, first)
        return read.items, ReplayReport(read.replayed, len(read.items), read.damage, read.covered)


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
        elif r.op is Op.REMOVE_GROUP_TOPIC:
            table.pop(key, None)
            generations.pop(key, None)
        elif r.op is Op.REMOVE_GROUP or r.op is Op.CLEAN_TOPIC:
            index = 1 if r.op is Op.REMOVE_GROUP else 0
            name = r.group if index else r.topic
            for k in [k for k in table if k[index] == name]:
                del table[k]
            for k in [k for k in generations if k[index] == name]:
                del generations[k]
        applied += 1
    return applied
