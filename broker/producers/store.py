"""Persistence of the producer table: producerState.json plus producerState.journal.<n>.

The pop ledger's discipline (broker/pop/journal.py explains it): every event is
appended to the journal (one os.write, no fsync) before the table changes and
before the batch it describes reaches the store; every few seconds, when the
table changed, a snapshot is written atomically (the previous file kept as
.bak) after rotating the journal in the same step as the copy, and the
segments it covers are deleted once it is durable. Loading reads the snapshot
(or its .bak) and replays the segments from its mark. Events are idempotent
under replay (`ProducerTable.apply` skips what does not fit), so a segment
replayed over an older .bak does no harm.

Record body: a compact JSON array, `[code, fields...]`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from tidemark.broker.disk import segments
from tidemark.broker.disk.segments import DecodedSegment, SegmentedLog, frame
from tidemark.broker.errors import ConfigFileError
from tidemark.broker.offsets.persistence import remove_leftover_temp_files
from tidemark.broker.producers.table import (
    Allocated,
    Appended,
    Forgotten,
    ProducerEvent,
    ProducerStateError,
    ProducerTable,
)
from tidemark.common.fsutil import atomic_write, backup_path
from tidemark.common.logs import get_logger

STATE_FILE_NAME = "producerState.json"
JOURNAL_PREFIX = "producerState.journal."
JOURNAL_FROM_KEY = "producerJournalFrom"
FORMAT_KEY, FORMAT = "format", 1
MAX_BODY = 1 << 16

log = get_logger("tidemark.broker.producers")

# code -> (event class, field kinds): i int >= 0, s str
_SCHEMA: dict[int, tuple[type, str]] = {1: (Allocated, "isi"), 2: (Appended, "iisiiiisi"), 3: (Forgotten, "i")}
_CODES = {cls: code for code, (cls, _) in _SCHEMA.items()}
# Field names per event class, in order (dataclasses.astuple deep-copies: a third of an append's cost).
_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls, _ in _SCHEMA.values()}
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
# An Appended body written by hand: every stored batch journals one, and the generic path (a list built
# by getattr, then the JSON encoder) was two thirds of the encoding. The same bytes as _encode_generic:
# ints as %d (what json writes for an int), strings through json's own escaper (ensure_ascii=False).
_APPENDED_BODY = f"[{_CODES[Appended]},%d,%d,%s,%d,%d,%d,%d,%s,%d]"
_quote = json.encoder.encode_basestring


def encode_events(events: Sequence[ProducerEvent]) -> bytes:
    if len(events) == 1:
        return _encode(events[0])
    return b"".join(_encode(e) for e in events)


def _encode(e: ProducerEvent) -> bytes:
    if type(e) is Appended:
        return frame((_APPENDED_BODY % (e.producer_id, e.epoch, _quote(e.topic), e.queue_id, e.base_seq, e.count,
                                        e.first_offset, _quote(e.first_msg_id), e.at_ms)).encode("utf-8"))
    return _encode_generic(e)


def _encode_generic(e: ProducerEvent) -> bytes:
    return frame(_ENCODER.encode([_CODES[type(e)], *[getattr(e, name) for name in _FIELDS[type(e)]]])
                 .encode("utf-8"))


def decode_events(data: bytes) -> DecodedSegment[ProducerEvent]:
    return segments.decode_segment(data, lambda body: _event(json.loads(bytes(body).decode("utf-8"))),
                                   min_body=2, max_body=MAX_BODY)


def _event(values: object) -> ProducerEvent:
    if not isinstance(values, list) or not values:
        raise ValueError("not an event array")
    cls, kinds = _SCHEMA[values[0]]
    args = values[1:]
    if len(args) != len(kinds):
        raise ValueError(f"wrong field count for {cls.__name__}")
    for kind, value in zip(kinds, args, strict=True):
        if kind == "s" and not isinstance(value, str):
            raise ValueError(f"{value!r} is not a string")
        if kind == "i" and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63):
            raise ValueError(f"{value!r} is not an integer")
    return cls(*args)


@dataclass(frozen=True, slots=True)
class ProducerLoadReport:
    source: str  # "json", "bak", "none"
    events: int
    skipped: int
    problems: list[str] = field(default_factory=list)


class ProducerStateStore:
    """producerState.json + producerState.journal.<n> in `directory` (the broker's config directory)."""

    def __init__(self, directory: Path, *, max_producers: int, expiry_ms: int, id_floor: int = 0) -> None:
        self.path = Path(directory) / STATE_FILE_NAME
        self._journal = SegmentedLog(Path(directory), JOURNAL_PREFIX, "producer journal")
        self._limits = {"max_producers": max_producers, "expiry_ms": expiry_ms, "id_floor": id_floor}
        self._written_version = 0
        self.report: ProducerLoadReport | None = None

    def load(self) -> ProducerTable:
        """The table as last journaled. ConfigFileError when both snapshots are damaged: starting without
        them would store every retried batch again."""
        remove_leftover_temp_files(self.path, log)
        problems: list[str] = []
        table, journal_from, source = None, 0, "none"
        for path, name in ((self.path, "json"), (backup_path(self.path), "bak")):
            try:
                doc = json.loads(path.read_bytes().decode("utf-8"))
                if not isinstance(doc, dict) or doc.get(FORMAT_KEY) != FORMAT:
                    raise ProducerStateError(f"not a producer state of format {FORMAT}")
                journal_from = doc[JOURNAL_FROM_KEY]
                if isinstance(journal_from, bool) or not isinstance(journal_from, int) or journal_from < 0:
                    raise ProducerStateError(f"{JOURNAL_FROM_KEY} {journal_from!r} is not a segment number")
                table = ProducerTable.from_snapshot(doc, **self._limits)
                source = name
                break
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, UnicodeDecodeError, ProducerStateError) as e:
                problems.append(f"{path.name} is unusable: {e}")
        if table is None:
            if problems:
                raise ConfigFileError(f"producer state {self.path} and its backup are unusable "
                                      f"({'; '.join(problems)}); refusing to start without them, which would "
                                      "store retried batches again; repair or remove the files")
            table = ProducerTable(**self._limits)
        read = self._journal.read_segments(decode_events, journal_from)
        applied = sum(table.apply(e) for e in read.items)
        self._written_version = -1 if applied or source == "bak" else table.version
        table.sink = self.append
        self.report = ProducerLoadReport(source, applied, len(read.items) - applied, problems + read.damage)
        return table

    def append(self, events: Sequence[ProducerEvent]) -> None:
        self._journal.append(encode_events(events))

    def dirty(self, table: ProducerTable) -> bool:
        return table.version != self._written_version

    def begin_snapshot(self, table: ProducerTable) -> tuple[dict, int, int]:
        """(copy, first segment it does not contain, version): on the event loop, in one step."""
        keep_from = self._journal.rotate()
        return table.snapshot(), keep_from, table.version

    def write_snapshot(self, pending: tuple[dict, int, int]) -> None:
        """Write the copy durably, then delete the segments it covers. Raises OSError."""
        doc, keep_from, version = pending
        data = json.dumps({FORMAT_KEY: FORMAT, JOURNAL_FROM_KEY: keep_from, **doc}, separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8")
        atomic_write(self.path, data, keep_backup=True)
        self._written_version = max(self._written_version, version)
        self._journal.discard_before(keep_from)

    def close(self) -> None:
        self._journal.close()
