"""Snapshots of the offset table: taken on the event loop, written in version order, journal retired.

A snapshot is a copy of the table (and the reset generations) at one table
version, with the first journal segment it does not hold. The journal rotates
*before* the copy: a change journaled in an older segment was made before the
rotation, so the copy has it; one made later lands in the new segment. Once
the snapshot is on disk (persistence.py: tmp, fsync, rename), the segments
before that one hold nothing the file lacks and are deleted.

Writes may overlap: the timer's write runs in a worker thread, and a shutdown's
synchronous write may start while an older one (its awaiting task perhaps
cancelled) is still queued. The newest snapshot must win, so a write older
than the last one written is skipped (the newer one covers its segments too).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from tidemark.broker.errors import InvalidArgumentError
from tidemark.broker.offsets.journal import OffsetJournal
from tidemark.broker.offsets.persistence import (
    TOPIC_GROUP_SEPARATOR,
    OffsetTable,
    encode_offset_table,
    write_offset_file,
)


@dataclass(frozen=True, slots=True)
class PersistReport:
    duration_s: float  # snapshot + encode + write, wall time
    size_bytes: int
    entries: int
    snapshot_s: float = 0.0  # the part spent on the event-loop thread
    journal_segments_removed: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    version: int
    offsets: OffsetTable
    generations: OffsetTable
    keep_from: int | None  # the first journal segment the copy does not hold (None: no journal)


class SnapshotWriter:
    def __init__(self, path: Path, journal: OffsetJournal | None) -> None:
        self._path = path
        self._journal = journal
        self._lock = threading.Lock()  # serialises the file writes themselves
        self._written_version = -1

    def take(self, version: int, offsets: OffsetTable, generations: OffsetTable) -> Snapshot:
        """Event loop: rotate the journal, then copy (inner dicts too: commits change them in place while a
        worker thread encodes)."""
        keep_from = self._journal.rotate() if self._journal is not None else None
        return Snapshot(version, {key: queues.copy() for key, queues in offsets.items()},
                        {key: queues.copy() for key, queues in generations.items()}, keep_from)

    def write(self, snapshot: Snapshot) -> tuple[int, int]:
        """Any thread: write the snapshot unless a newer one was written, then delete the journal segments
        it covers; (bytes, segments removed)."""
        data = encode_offset_table(snapshot.offsets, snapshot.generations, journal_from=snapshot.keep_from)
        with self._lock:
            if snapshot.version >= self._written_version:
                write_offset_file(self._path, data)
                self._written_version = snapshot.version
        removed = self._journal.discard_before(snapshot.keep_from) if snapshot.keep_from is not None else 0
        return len(data), removed


def check_entry(group: str, topic: str, queue_id: int) -> None:
    """Name rules are the gRPC layer's job; these guard the file format itself: an '@' inside a name would
    make the "topic@group" key ambiguous."""
    for kind, name in (("topic", topic), ("group", group)):
        if not name or TOPIC_GROUP_SEPARATOR in name:
            raise InvalidArgumentError(
                f"{kind} name {name!r} must be non-empty and must not contain '@'"
            )
    if isinstance(queue_id, bool) or not isinstance(queue_id, int) or queue_id < 0:
        raise InvalidArgumentError(f"queue id must be a non-negative integer, got {queue_id!r}")


def check_offset(offset: int) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise InvalidArgumentError(f"offset must be an integer, got {offset!r}")
    if offset < 0:
        raise InvalidArgumentError(
            f"offset {offset} is negative; a committed offset is the next offset to consume (>= 0)"
        )
