"""Reading a queue: the two scans behind MessageStore.get_messages and read_records, and the search by
store time.

Both walk a consume queue from an offset, skip entries whose commit-log bytes
retention already deleted, and stop after max_scan entries, so a pull that
matched nothing still moves forward. get_messages decodes each message (the
unary pull, tools); read_records returns the records as stored, reading runs
that lie back to back in the commit log (a producer's batch) with one pread
(the Fetch stream). Arguments are validated by the facade; these functions only
read, on the event-loop thread.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from tidemark.broker.store import codec
from tidemark.broker.store.commitlog import CommitLog
from tidemark.broker.store.consumequeue import ConsumeQueue
from tidemark.broker.store.model import GetResult, GetStatus, RawRead, StoredMessage
from tidemark.common.records import (
    HEADER_SIZE,
    I64,
    QUEUE_OFFSET_OFFSET,
    U16,
    U32,
    RawProperties,
    record_spans,
)

# Consume-queue entries read per pread while scanning for matches.
ENTRY_READ_BATCH = 256
# Below this many records a read's runs are found with a Python loop (numpy's calls cost more).
_SCALAR_RUNS = 16
# A properties filter reads whole records in runs of at most this many bytes (one pread each).
RUN_READ_BYTES = 1 << 20
# A filter on a record's properties (an SQL92 subscription); it only calls their get(name).
PropertiesFilter = Callable[[Mapping[str, str]], bool]


def position_status(offset: int, low: int, high: int, *, follower: bool = False,
                    stored_high: int | None = None) -> GetStatus | None:
    """Why nothing can be read at `offset` of a queue holding [low, high); None when something can.

    A follower (a replica behind its master) answers a position past its end as "at the end": the reader
    waits there while the replica catches up, instead of being sent back to the start. So does a master
    whose readers see the queue end at `high` while it holds up to `stored_high` (its read bound): a
    position in between is a real one, not yet readable; past `stored_high` it is wrong as anywhere."""
    if stored_high is not None and high < offset <= stored_high:
        return GetStatus.OFFSET_OVERFLOW_ONE
    if follower and offset > high:
        return GetStatus.OFFSET_OVERFLOW_ONE
    if high == 0 or low == high:
        return GetStatus.NO_MESSAGE_IN_QUEUE
    if offset < low:
        return GetStatus.OFFSET_TOO_SMALL
    if offset == high:
        return GetStatus.OFFSET_OVERFLOW_ONE
    if offset > high:
        return GetStatus.OFFSET_OVERFLOW_BADLY
    return None


def _next_offset(status: GetStatus, offset: int, low: int, high: int) -> int:
    """Where a reader that got `status` goes next (RocketMQ's answers; OVERFLOW_BADLY: min when 0, else max)."""
    return {GetStatus.NO_MESSAGE_IN_QUEUE: high, GetStatus.OFFSET_TOO_SMALL: low,
            GetStatus.OFFSET_OVERFLOW_ONE: offset, GetStatus.OFFSET_OVERFLOW_BADLY: low if low == 0 else high}[status]


def readable_high(queue: ConsumeQueue | None, limit: int | None) -> int:
    """The end of what readers may see of a queue: its entries whose records end at or before the commit-log
    offset `limit` (what a master's replica acknowledged), or all of them when `limit` is None."""
    if queue is None:
        return 0
    low, high = queue.min_offset, queue.max_offset
    if limit is None or high <= low:
        return high
    last = queue.entry_at(high - 1)
    if last is None or last[0] + last[1] <= limit:
        return high
    return queue.first_offset_where(low, high - 1, lambda e: e[0] + e[1] > limit)


def offset_at_time(queue: ConsumeQueue | None, commitlog: CommitLog, timestamp: int) -> int:
    """The queue's first offset in [min, max) stored at or after `timestamp` (a binary search over its
    entries' store times); max when there is none, 0 without the queue."""
    if queue is None:
        return 0

    def stored_at_or_after(entry: tuple[int, int, int]) -> bool:
        stored = commitlog.read_store_timestamp(entry[0])
        return stored is not None and stored >= timestamp

    return queue.first_offset_where(queue.min_offset, queue.max_offset, stored_at_or_after)


def get_messages(queue: ConsumeQueue | None, commitlog: CommitLog, offset: int, max_count: int, *,
                 matcher: Callable[[int], bool] | None, exact_matcher: Callable[[StoredMessage], bool] | None,
                 max_scan: int, follower: bool = False, limit: int | None = None,
                 properties_filter: PropertiesFilter | None = None) -> GetResult:
    """Up to max_count matching messages from `offset`, examining at most max_scan entries.

    `matcher` sees the consume queue's tags code (cheap); `exact_matcher` the decoded message;
    `properties_filter` (an SQL92 subscription, instead of both) the record's properties before it is
    decoded. next_begin_offset follows the last entry examined. With a `limit` (readable_high) the queue
    ends there for the reader, who waits at a position between there and the stored end."""
    low, high = (queue.min_offset, readable_high(queue, limit)) if queue is not None else (0, 0)
    status = position_status(offset, low, high, follower=follower,
                             stored_high=queue.max_offset if queue is not None and limit is not None else None)
    if status is not None:
        return GetResult(status, [], _next_offset(status, offset, low, high), low, high)
    if properties_filter is not None:
        return _get_by_properties(queue, commitlog, offset, min(high, offset + max_scan), low, high,
                                  max_count=max_count, accept=properties_filter)
    messages: list[StoredMessage] = []
    commit_log_min = commitlog.min_offset
    limit = min(high, offset + max_scan)
    pos = offset
    chunk = max(max_count, 32)
    while pos < limit and len(messages) < max_count:
        entries = queue.read_entries(pos, min(limit - pos, chunk))
        if not entries:
            break
        chunk = ENTRY_READ_BATCH
        for phys, size, tags_code in entries:
            pos += 1
            if phys < commit_log_min or (matcher is not None and not matcher(tags_code)):
                continue
            message = commitlog.read_message(phys, size)
            if message is None or (exact_matcher is not None and not exact_matcher(message)):
                continue
            messages.append(message)
            if len(messages) >= max_count:
                break
    status = GetStatus.FOUND if messages else GetStatus.NO_MATCHED_MESSAGE
    return GetResult(status, messages, pos, low, high)


def read_records(queue: ConsumeQueue | None, commitlog: CommitLog, offset: int, *, max_count: int, max_bytes: int,
                 tags_codes: frozenset[int] | None, max_scan: int, follower: bool = False,
                 limit: int | None = None, properties_filter: PropertiesFilter | None = None) -> RawRead:
    """Up to max_count records (and max_bytes, at least one record) from `offset`, as stored.

    Consume-queue entries are filtered by tags code, the whole scan window in one vectorised pass;
    the consumer checks tags exactly (hash codes may collide). With a properties_filter (SQL92) every
    record of the window is read and only those whose properties it accepts are kept. `limit` as in
    get_messages."""
    low, high = (queue.min_offset, readable_high(queue, limit)) if queue is not None else (0, 0)
    status = position_status(offset, low, high, follower=follower,
                             stored_high=queue.max_offset if queue is not None and limit is not None else None)
    if status is not None:
        return RawRead(status, b"", 0, _next_offset(status, offset, low, high), low, high)
    if properties_filter is not None:
        return _read_by_properties(queue, commitlog, offset, min(high, offset + max_scan), low, high,
                                   max_count=max_count, max_bytes=max_bytes, accept=properties_filter)
    commit_log_min = commitlog.min_offset
    pieces: list[bytes] = []
    planned = nbytes = count = 0
    run_start = run_end = -1
    run_sizes: list[int] = []
    limit = min(high, offset + max_scan)
    pos = offset
    full = False
    codes = None if tags_codes is None else np.fromiter(tags_codes, dtype=np.int64, count=len(tags_codes))
    while pos < limit and not full:
        entries = queue.read_array(pos, min(limit - pos, max(max_count - planned, 32), ENTRY_READ_BATCH)
                                   if codes is None else limit - pos)
        scanned = len(entries)
        if not scanned:
            break
        if codes is None and scanned < _SCALAR_RUNS:  # (a round's read: a few records; numpy's calls cost more)
            cut, phys, sizes = _fitting_rows(entries.tolist(), commit_log_min, planned, nbytes, max_count, max_bytes)
            took, refused = len(phys), cut < scanned
            bounds = _row_run_bounds(phys, sizes)
        else:
            keep = entries["phys"] >= commit_log_min
            if codes is not None:
                keep &= np.isin(entries["tags"], codes)
            chosen = np.flatnonzero(keep)
            took, refused = _fitting(entries["size"][chosen], planned, nbytes, max_count, max_bytes)
            cut = int(chosen[took]) if refused else scanned  # the first record not taken
            taken_phys, taken_sizes = entries["phys"][chosen[:took]], entries["size"][chosen[:took]]
            phys, sizes = taken_phys.tolist(), taken_sizes.tolist()
            bounds = _run_bounds(taken_phys, taken_sizes)
        end = pos + cut
        full = refused
        # Runs of records lying back to back, each one pread (the first may continue the last batch's run).
        for a, b in bounds:
            if a or phys[0] != run_end:
                if run_sizes:
                    data, ok = commitlog.read_run(run_start, run_sizes)
                    pieces.append(data)
                    count += ok
                run_start, run_sizes = phys[a], []
            run_sizes.extend(sizes[a:b])
        if took:
            run_end = phys[-1] + sizes[-1]
            planned += took
            nbytes += sum(sizes)
        pos = end
    if run_sizes:
        data, ok = commitlog.read_run(run_start, run_sizes)
        pieces.append(data)
        count += ok
    data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return RawRead(GetStatus.FOUND if count else GetStatus.NO_MATCHED_MESSAGE, data, count, pos, low, high)



def _fitting(sizes: np.ndarray, planned: int, nbytes: int, max_count: int, max_bytes: int) -> tuple[int, bool]:
    """How many of these records (in order) a read that holds `planned` records of `nbytes` bytes takes, and
    whether one was refused: a record goes in unless the read holds one already and is then at max_count,
    or would pass max_bytes with it (so a read always takes at least one record, however large)."""
    sizes = sizes[:max(max_count - planned, 1) + 1]  # (past these, the count refuses one anyway)
    n = len(sizes)
    if n < _SCALAR_RUNS:  # (numpy's calls cost more than the loop)
        for i, size in enumerate(sizes.tolist()):
            if planned + i and (planned + i >= max_count or nbytes + size > max_bytes):
                return i, True
            nbytes += size
        return n, False
    held = planned + np.arange(n)  # records before each one
    refused = (held > 0) & ((held >= max_count) | (nbytes + np.cumsum(sizes) > max_bytes))
    first = int(refused.argmax())
    return (first, True) if refused[first] else (n, False)


def _fitting_rows(rows: list[tuple[int, int, int]], commit_log_min: int, planned: int, nbytes: int, max_count: int,
                  max_bytes: int) -> tuple[int, list[int], list[int]]:
    """_fitting over a few consume-queue entries as Python tuples (phys, size, tags), skipping those whose
    bytes retention deleted: the index of the first entry refused (len(rows) if none was), and the commit-log
    positions and sizes of the records taken. The same rule as _fitting, without a numpy call (each costs
    more than this loop over the 4 records of a round)."""
    phys: list[int] = []
    sizes: list[int] = []
    held = planned
    for i, (p, size, _) in enumerate(rows):
        if p < commit_log_min:
            continue
        if held and (held >= max_count or nbytes + size > max_bytes):
            return i, phys, sizes
        phys.append(p)
        sizes.append(size)
        held += 1
        nbytes += size
    return len(rows), phys, sizes


def _row_run_bounds(p: list[int], z: list[int]) -> list[tuple[int, int]]:
    """_run_bounds of positions and sizes as lists."""
    n = len(p)
    bounds, a = [], 0
    for i in range(1, n):
        if p[i] != p[i - 1] + z[i - 1]:
            bounds.append((a, i))
            a = i
    return [*bounds, (a, n)] if n else []


def _run_bounds(phys: np.ndarray, sizes: np.ndarray) -> list[tuple[int, int]]:
    """[a, b) of each run of records lying back to back (phys[i] + sizes[i] == phys[i + 1])."""
    n = len(phys)
    if n < _SCALAR_RUNS:
        return _row_run_bounds(phys.tolist(), sizes.tolist())
    cuts = [0, *(np.flatnonzero(phys[1:] != phys[:-1] + sizes[:-1]) + 1).tolist(), n]
    return list(itertools.pairwise(cuts))


def _read_by_properties(queue: ConsumeQueue, commitlog: CommitLog, offset: int, limit: int, low: int, high: int, *,
                        max_count: int, max_bytes: int, accept: PropertiesFilter) -> RawRead:
    """read_records' scan when every record's properties decide (see _by_properties). The reading continues
    after the last record examined, or at the first match that did not fit."""
    kept: list[bytes] = []
    nbytes = 0
    progress = [offset]
    for data, start, size in _by_properties(queue, commitlog, offset, limit, accept, progress):
        if kept and (len(kept) >= max_count or nbytes + size > max_bytes):
            (queue_offset,) = I64.unpack_from(data, start + QUEUE_OFFSET_OFFSET)
            return _kept(kept, queue_offset, low, high)
        kept.append(data[start:start + size])
        nbytes += size
    return _kept(kept, progress[0], low, high)


def _get_by_properties(queue: ConsumeQueue, commitlog: CommitLog, offset: int, limit: int, low: int, high: int, *,
                       max_count: int, accept: PropertiesFilter) -> GetResult:
    """get_messages' scan when every record's properties decide: only the matching records are decoded."""
    messages: list[StoredMessage] = []
    progress = [offset]
    for data, start, _ in _by_properties(queue, commitlog, offset, limit, accept, progress):
        try:
            message = codec.decode_record(data, start)
        except codec.CorruptRecordError:
            continue
        messages.append(message)
        if len(messages) >= max_count:
            return GetResult(GetStatus.FOUND, messages, message.queue_offset + 1, low, high)
    return GetResult(GetStatus.FOUND if messages else GetStatus.NO_MATCHED_MESSAGE, messages, progress[0], low, high)


def _by_properties(queue: ConsumeQueue, commitlog: CommitLog, offset: int, limit: int, accept: PropertiesFilter,
                   progress: list[int]) -> Iterator[tuple[bytes, int, int]]:
    """(bytes, start, size) of each record of [offset, limit) whose properties `accept` takes, in order.

    The records are read in runs that lie back to back in the commit log (one pread each) and their
    properties looked up in place (RawProperties: only those the filter names are decoded). progress[0]
    is where the scan stands once a batch of entries is examined."""
    commit_log_min = commitlog.min_offset
    u16, u32 = U16.unpack_from, U32.unpack_from
    pos = offset
    while pos < limit:
        entries = queue.read_entries(pos, min(limit - pos, ENTRY_READ_BATCH))
        if not entries:
            break
        for phys, sizes in _runs(entries, commit_log_min):
            data, _ = commitlog.read_run(phys, sizes)
            for start, size in record_spans(data):
                try:
                    p = start + HEADER_SIZE  # born host, topic, then the properties (common/records.py)
                    p += 2 + u16(data, p)[0]
                    p += 2 + u16(data, p)[0]
                    n = u32(data, p)[0]
                except struct.error:
                    continue  # lengths past the data: a damaged record matches nothing (decode would skip it)
                if p + 4 + n > start + size:
                    continue  # its fields run past its own end: damaged, as above
                if accept(RawProperties(data[p + 4:p + 4 + n])):
                    yield data, start, size
        pos += len(entries)
        progress[0] = pos


def _runs(entries: list[tuple[int, int, int]], commit_log_min: int,
          max_bytes: int = RUN_READ_BYTES) -> list[tuple[int, list[int]]]:
    """The entries whose records are still stored, as (first commit-log offset, sizes) of back-to-back runs
    of at most `max_bytes` each (a larger record alone): each run is one read, bodies included, most of
    which a properties filter never keeps."""
    runs: list[tuple[int, list[int]]] = []
    end, run_bytes = -1, 0
    for phys, size, _ in entries:
        if phys < commit_log_min:
            continue
        if phys == end and run_bytes + size <= max_bytes:
            runs[-1][1].append(size)
            run_bytes += size
        else:
            runs.append((phys, [size]))
            run_bytes = size
        end = phys + size
    return runs


def _kept(kept: list[bytes], next_offset: int, low: int, high: int) -> RawRead:
    data = kept[0] if len(kept) == 1 else b"".join(kept)
    return RawRead(GetStatus.FOUND if kept else GetStatus.NO_MATCHED_MESSAGE, data, len(kept), next_offset, low, high)
