"""Reading a commit log's record layout without decoding records: where records start, a record's digest,
where the files end, and recovery's check of a segment's records (scan_segment). What replication compares
between two logs (broker/cluster/divergence.py) and what the first election ranks by
(broker/cluster/controller_mode.py).

The functions read through a `Read` (n bytes at a position in one segment file), so the same walk runs on
the loop thread through a segment's own fd or in another thread through a duplicate of it
(`CommitLog.segment_reader`): a master's bytes below its end never change, and a duplicate fd keeps a
segment readable even when retention deletes it meanwhile.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

from tidemark.broker.store import codec
from tidemark.common.crc import crc32
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.store")

# Walks read segments in chunks this big (a bigger record gets its own read).
SCAN_CHUNK = 4 * 1024 * 1024
SEGMENT_NAME = re.compile(r"\d{20}")  # fullmatch: `$` would accept a trailing newline

# read(n, position in the segment file) -> at most n bytes
Read = Callable[[int, int], bytes]


def end_on_disk(directory: Path) -> int:
    """Where the commit log in `directory` ends as its files say (its last segment's start plus that file's
    size), without opening it: recovery may still cut a torn tail off. 0 without a segment."""
    try:
        names = sorted(p.name for p in directory.iterdir() if SEGMENT_NAME.fullmatch(p.name))
    except FileNotFoundError:
        return 0
    return int(names[-1]) + (directory / names[-1]).stat().st_size if names else 0


def segment_record_starts(read: Read, segment_start: int, segment_end: int, start: int,
                          end: int) -> Iterator[int]:
    """The offsets where records (and an end-of-segment marker) start in [start, end) of one segment holding
    [segment_start, segment_end), from `start` (a record start) on, reading their headers a chunk at a time;
    stops early at anything that is not a record. After a marker the walk is over: the segment ends."""
    pos, end = start, min(end, segment_end)
    while pos < end:
        chunk = read(min(SCAN_CHUNK, segment_end - pos), pos - segment_start)
        off = 0
        while off + codec.BLANK_SIZE <= len(chunk) and pos + off < end:
            total, magic = codec.PREFIX.unpack_from(chunk, off)
            if magic == codec.BLANK_MAGIC:
                yield pos + off
                return
            if magic != codec.MESSAGE_MAGIC or total < codec.MIN_RECORD_SIZE:
                return
            yield pos + off
            off += total
        if off == 0:
            return
        pos += off


def sample_record_starts(read: Read, segment_start: int, segment_end: int, lo: int, hi: int,
                         probes: int) -> tuple[list[int], bool]:
    """Up to `probes` record starts of [lo, hi) in one segment, spread over its bytes, `lo` first; and
    whether they are every record start there. Reads every header in the range: divergence.Search runs it
    off the event loop (a round over a 2 GiB segment takes seconds)."""
    step, asked, seen = max(1, (hi - lo) // probes), [], 0
    for start in segment_record_starts(read, segment_start, segment_end, lo, hi):
        seen += 1
        if start >= lo + len(asked) * step:
            asked.append(start)
    return asked, seen == len(asked)


def record_digest(read: Read, segment_start: int, offset: int) -> int:
    """crc32 of the record starting at `offset` (a record start; of an end-of-segment marker: its header),
    with the offset: how two logs tell whether they hold the same record there."""
    pos = offset - segment_start
    total, magic = codec.PREFIX.unpack_from(read(codec.BLANK_SIZE, pos))
    record = read(codec.BLANK_SIZE if magic == codec.BLANK_MAGIC else total, pos)
    return crc32(record, crc32(offset.to_bytes(8, "big")))


# on_record(topic, queue_id, queue_offset, commit_log_offset, size, tags_code)
RecordCallback = Callable[[str, int, int, int, int, int], None]


def scan_segment(read: Read, segment_start: int, segment_end: int, pos: int,
                 on_record: RecordCallback) -> tuple[int, bool]:
    """Recovery's check of one segment holding [segment_start, segment_end), from `pos` (a record start) on:
    every record's magic, size, CRC, stated offset and topic, on_record called for each valid one, an
    end-of-segment marker valid only where it ends the data. Returns (position reached, whether everything
    was valid)."""
    data_end = segment_end
    want = SCAN_CHUNK
    while pos < data_end:
        chunk = memoryview(read(min(want, data_end - pos), pos - segment_start))
        n = len(chunk)
        if n == 0:
            return pos, False
        want = SCAN_CHUNK
        off = 0
        while off + codec.BLANK_SIZE <= n:
            total, magic = codec.PREFIX.unpack_from(chunk, off)
            here = pos + off
            if magic == codec.BLANK_MAGIC:
                # Valid only as the last thing in a segment padded to its end.
                if total < codec.BLANK_SIZE or here + total != data_end:
                    return here, False
                return data_end, True
            if magic != codec.MESSAGE_MAGIC or total < codec.MIN_RECORD_SIZE or here + total > data_end:
                return here, False
            if off + total > n:
                want = max(SCAN_CHUNK, total)  # read again from this record
                break
            if not codec.crc_ok(chunk, off, total):
                log.warning("commit log record at %d fails its CRC", here)
                return here, False
            _, _, _, queue_id, _, queue_offset, phys = codec.SCAN_FIELDS.unpack_from(chunk, off)
            if phys != here:
                return here, False
            (tags_code,) = codec.TAGS_FIELD.unpack_from(chunk, off + codec.TAGS_OFFSET)
            try:
                topic = codec.scan_topic(chunk, off)
            except (ValueError, UnicodeDecodeError):
                return here, False
            on_record(topic, queue_id, queue_offset, here, total, tags_code)
            off += total
        else:
            if off < n and pos + n == data_end:
                return pos + off, False  # fewer bytes left than a record prefix: torn
        pos += off
    return pos, True
