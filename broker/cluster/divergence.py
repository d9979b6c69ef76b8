"""Where a replica's commit log and its master's part: the divergence point, found to the record.

A replica that was a master (replaced while it held records nobody else got) rejoins with a tail its new
master does not have. It must drop that tail and nothing more: what it holds before the point is the
master's, and keeping it keeps its consume queues and spares copying it again.

Records sit at the same offsets in every log of a broker name, and each holds its own offset, store time
and message id. A replica's log is a copy of a prefix of its master's, followed by whatever it wrote on its
own as a master, so once two logs hold different records at one offset they hold no common record after
it: "the record starting at b is the same in both logs" holds for every record start b before the
divergence point and for none at or after it (Raft's log matching, with a record's CRC in the place of
an entry's term). The master (`Search`) finds the point by asking the replica for the digests of the
records at chosen starts of its own log (`record_digests` answers, one stream message each way per
round): first at segment starts, which every log shares and which cost no scan, then within the segment
left at up to PROBES starts spread over the remaining bytes, until the first differing record is pinned.
A round divides what is left by PROBES, so a 1 GiB segment of 100-byte records takes four rounds.

It replaces a cut back to the start of the segment holding the replica's end, repeated until the tails
agreed: correct too, but it dropped and copied again every record of those segments before the point.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tidemark.broker.store.commitlog import CommitLog
from tidemark.broker.store.logscan import sample_record_starts

PROBES = 64
NO_RECORD = -1  # a digest on the wire for "no record starts there"


def agrees(log: CommitLog, end: int, tail_digest: int | None) -> bool:
    """Whether a replica ending at `end` with this tail digest (CommitLog.tail_digest) holds this log's
    records up to there (an empty replica does)."""
    if end == 0:
        return True
    return end <= log.max_offset and log.is_boundary(end) and log.tail_digest(end) == tail_digest


def record_digests(log: CommitLog, offsets: Sequence[int]) -> list[int]:
    """The replica's answer to a round: the digest of its record at each offset (NO_RECORD: none starts)."""
    return [NO_RECORD if (d := log.record_digest(o)) is None else d for o in offsets]


class Search:
    """The master's side: where a replica holding [replica_oldest, replica_end) must truncate to (`found`), by
    rounds of `probes()` answered with `answer()`. Invariant: the records starting before `lo` are the same
    in both logs (or one of them no longer holds them), and the point lies in [lo, hi].

    The search starts at the later of the two logs' oldest records: below the replica's, it answers that no
    record starts there, which says nothing about where the logs part, and a cut there would be below the
    replica's oldest record. (A replica whose oldest record is past the master's end gets a `found` below
    it: nothing of its log can be checked, it must copy the master again.)"""

    def __init__(self, log: CommitLog, replica_end: int, replica_oldest: int = 0) -> None:
        self._log = log
        self.lo = max(log.min_offset, replica_oldest)
        self._replica_end = replica_end
        self.hi = min(replica_end, log.max_offset)
        self.rounds = 0
        self.found: int | None = self.hi if self.lo >= self.hi else None
        self._asked: list[int] = []
        self._complete = False  # whether _asked holds every record start in [lo, hi)

    async def probes(self) -> list[int]:
        """The record starts of this log to ask the replica about next, `lo` first. Within one segment they
        are sampled from every record header of what is left, in another thread: seconds for a 2 GiB
        segment, longer than a master's lease leaves it to renew (the bytes below this log's end never
        change, and the thread reads a duplicate fd, which outlives the segment's deletion)."""
        log, lo, hi = self._log, self.lo, self.hi
        later_segments = range(log.segment_start(lo) + log.segment_size, hi, log.segment_size)
        if later_segments:  # across segments: their starts first, no scan
            step = -(-len(later_segments) // (PROBES - 1))
            self._asked, self._complete = [lo, *later_segments[::step]], False
            return self._asked
        reader = log.segment_reader(lo)
        if reader is None:
            asked, complete = [], True
        else:
            read, start, end, close = reader
            try:
                asked, complete = await asyncio.to_thread(sample_record_starts, read, start, end, lo, hi, PROBES)
            finally:
                close()
        self._asked, self._complete = asked or [lo], complete
        return self._asked

    def answer(self, digests: Sequence[int]) -> None:
        """The replica's digests of the records at the last probes, in their order."""
        asked = self._asked
        if len(digests) != len(asked):
            raise ValueError(f"{len(digests)} digests answer {len(asked)} probes")
        self.rounds += 1
        first = next((i for i, (offset, digest) in enumerate(zip(asked, digests, strict=True))
                      if digest == NO_RECORD or digest != self._log.record_digest(offset)), None)
        if first == 0:
            self.found = asked[0]
            return
        if first is not None:
            self.hi = asked[first]
        if self._complete:
            self.found = self.hi
            return
        self.lo = self._after(asked[-1] if first is None else asked[first - 1])
        if self.lo >= self.hi:
            self.found = self.hi

    def fall_back(self) -> None:
        """For a replica that answers no probes: past this log's end, to the end; else from the start of the
        segment holding its end (it then asks again from there: cut segment by segment)."""
        self.found = self.hi if self.hi < self._replica_end else self._log.segment_start(self.hi - 1)

    def _after(self, start: int) -> int:
        """Where the record after the one starting at `start` starts (at most `hi`)."""
        starts = self._log.record_starts(start, self.hi)
        next(starts, None)
        return next(starts, self.hi)
