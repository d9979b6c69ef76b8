"""Persistence of the pop ledger: a snapshot file plus a journal of events.

The same discipline as the offset journal (broker/offsets/journal.py says
why in detail):

- `popState.json`, the snapshot: the ledger's `snapshot()` dict plus
  `"popJournalFrom": n`, written atomically with the previous file kept as
  `.bak` (tidemark.common.fsutil.atomic_write), every few seconds when the ledger
  changed and at shutdown.
- `popState.journal.<n>`, the journal: every event the ledger emits, appended
  with one os.write per batch (one request, or one renewal sweep) before the
  caller answers; no fsync, so a process crash (kill -9) loses nothing that
  was answered, and a power cut falls back to the snapshot (pop ids stay
  unique through the ledger's `pop_id_floor`).
- A snapshot rotates the journal *on the event loop, in the same step as it
  copies the state*, so segments below the new one hold only events the copy
  contains. It records that number and deletes those segments only once the
  file is durable; a failed snapshot deletes nothing. Loading replays the
  segments from the mark on. Unlike offset records, pop events are not
  assignments (an Acked applied twice is wrong, not idempotent), so a covered
  segment must never be replayed; the mark makes sure of it, and the ledger's
  `apply` still skips any event that does not fit (a snapshot from `.bak`,
  older than the mark's segments).

A failed append raises OSError *before* the ledger changes (the journal is the
ledger's sink): the request is refused and memory stays what the disk says.
A short write poisons its segment (the next append opens a new one); a write
that wrote nothing leaves it usable, and a segment nothing reached is removed.

Record layout: `u32 body length | u32 crc32(body) | body`, one record per
event, no file header. The body is a compact JSON array, `[code, group, topic,
queue id, fields...]` (a Popped's entries flattened into one array of
offset, pop id, attempt triples). JSON rather than struct because a Popped
carries a variable number of entries and three strings: the C codec handles
that in one call, at the same speed as a struct loop of equal size, and the
framing (length + CRC) already gives what struct would (torn and damaged
records are detected before the body is read). A torn tail or damaged record
ends the replay of its segment; a new process never appends to an old one.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from tidemark.broker.disk import segments
from tidemark.broker.disk.segments import DecodedSegment, SegmentedLog, frame
from tidemark.broker.errors import ConfigFileError
from tidemark.broker.offsets.persistence import remove_leftover_temp_files
from tidemark.broker.pop.handles import QueueKey
from tidemark.broker.pop.ledger import (
    Acked,
    Changed,
    Dropped,
    PopEvent,
    PopLedger,
    Popped,
    PopSettings,
    PopStateError,
    Redelivered,
    Renewed,
    Reset,
    Revived,
)
from tidemark.common.fsutil import atomic_write, backup_path
from tidemark.common.logs import get_logger

STATE_FILE_NAME = "popState.json"
JOURNAL_PREFIX = "popState.journal."
JOURNAL_FROM_KEY = "popJournalFrom"
FORMAT_KEY, FORMAT = "format", 1
MAX_BODY = 1 << 24  # far above any pop batch; a bigger length is damage, not a record
_MAX_INT = 2**63 - 1

log = get_logger("tidemark.broker.pop")

# Event class -> (code, field kinds after the key): i int >= 0, s str, b bool, e entries, g message groups
# (str or null each), h held offsets. Kinds after a "/" are fields added later: a record written before
# them ends early and they keep their defaults, and a record whose later fields hold their defaults is
# written without them, in the older shape (a Popped of a concurrent pop is what it always was; only FIFO
# pops write groups and held offsets).
_SCHEMA: dict[type, tuple[int, str]] = {
    Reset: (1, "i"), Dropped: (2, ""), Popped: (3, "iiisbie/igh"), Acked: (4, "ii"),
    Changed: (5, "iiii"), Renewed: (6, "iii"), Revived: (7, "ii"), Redelivered: (8, "ii"),
}
_BY_CODE = {code: (cls, kinds) for cls, (code, kinds) in _SCHEMA.items()}


# -- encode / decode ----------------------------------------------------------------------------


def encode_event(event: PopEvent) -> bytes:
    code, kinds = _SCHEMA[type(event)]
    written = fields(event)[1:]  # the key is first
    required = len(kinds.partition("/")[0])
    while len(written) > required and getattr(event, written[-1].name) == written[-1].default:
        written = written[:-1]  # a later field at its default is left out: the older shape
    values: list = [code, *event.key]
    for f in written:
        value = getattr(event, f.name)
        if f.name in ("entries", "held"):
            value = [n for entry in value for n in entry]
        elif f.name == "groups":
            value = list(value)
        elif isinstance(value, bool):
            value = int(value)
        values.append(value)
    return frame(json.dumps(values, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


def encode_events(events: Iterable[PopEvent]) -> bytes:
    return b"".join(encode_event(e) for e in events)


def decode_events(data: bytes) -> DecodedSegment[PopEvent]:
    """Decode the intact prefix of a segment; stop at the first torn or damaged record."""
    return segments.decode_segment(data, lambda body: _event(json.loads(bytes(body).decode("utf-8"))),
                                   min_body=2, max_body=MAX_BODY)


def _event(values: object) -> PopEvent:
    if not isinstance(values, list) or len(values) < 4:
        raise ValueError("not an event array")
    cls, kinds = _BY_CODE[_int(values[0])]
    group, topic, queue_id, *rest = values[1:]
    required, _, later = kinds.partition("/")
    kinds = (required + later)[:len(rest)]
    if not len(required) <= len(rest) <= len(required) + len(later) or not isinstance(group, str) \
            or not isinstance(topic, str):
        raise ValueError(f"wrong fields for {cls.__name__}")
    args: list = [QueueKey(group, topic, _int(queue_id))]
    for kind, value in zip(kinds, rest, strict=True):
        if kind == "i":
            args.append(_int(value))
        elif kind == "s" and isinstance(value, str):
            args.append(value)
        elif kind == "b" and value in (0, 1) and not isinstance(value, bool):
            args.append(bool(value))
        elif kind == "e" and isinstance(value, list) and len(value) % 3 == 0:
            flat = [_int(v) for v in value]
            args.append(tuple(zip(flat[0::3], flat[1::3], flat[2::3], strict=True)))
        elif kind == "g" and isinstance(value, list) and all(v is None or isinstance(v, str) for v in value):
            args.append(tuple(value))
        elif kind == "h" and isinstance(value, list) and len(value) % 3 == 0 \
                and all(isinstance(g, str) for g in value[2::3]):
            args.append(tuple(zip([_int(v) for v in value[0::3]], [_int(v) for v in value[1::3]], value[2::3],
                                  strict=True)))
        else:
            raise ValueError(f"bad {cls.__name__} field {value!r}")
    return cls(*args)


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_INT:
        raise ValueError(f"{value!r} is not an offset-sized integer")
    return value


# -- segments -------------------------------------------------------------------------------------


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """(number, path) of every journal segment in `directory`, oldest first."""
    return segments.list_segments(directory, JOURNAL_PREFIX)


class PopJournal(SegmentedLog):
    """Append-only segments of encoded events (broker/disk/segments.py)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory, JOURNAL_PREFIX, "pop journal")

    def read_all(self, first: int = 0) -> tuple[list[PopEvent], list[str], int]:
        """(events of the segments numbered >= `first`, damage lines, segments read). Later appends
        go to a new segment, never after a torn tail."""
        read = self.read_segments(decode_events, first)
        return read.items, read.damage, read.replayed


# -- the store --------------------------------------------------------------------------------------


class LoadSource(enum.Enum):
    MAIN = "json"
    BACKUP = "bak"
    NONE = "none"  # no snapshot yet: a new broker (the journal may still hold events)
    FORCED_EMPTY = "forced-empty"  # snapshots damaged, started without them because the caller allowed it


@dataclass(frozen=True, slots=True)
class PopLoadReport:
    source: LoadSource
    journal_from: int
    segments: int  # replayed
    events: int  # applied
    skipped: int  # decoded but not fitting the state (replay over an older snapshot)
    problems: list[str] = field(default_factory=list)  # damaged files and torn tails, for the log


@dataclass(frozen=True, slots=True)
class PendingSnapshot:
    """A copy of the ledger taken on the event loop; written by write_snapshot, maybe in a thread."""

    doc: dict
    keep_from: int  # the first journal segment the copy does not contain
    version: int


class PopStore:
    """popState.json + popState.journal.<n> in `directory` (the broker's config directory)."""

    def __init__(self, directory: Path, settings: PopSettings | None = None, *, pop_id_floor: int = 0,
                 allow_empty_on_corruption: bool = False) -> None:
        self.path = Path(directory) / STATE_FILE_NAME
        self._settings = settings
        self._floor = pop_id_floor
        self._allow_empty = allow_empty_on_corruption
        self._journal = PopJournal(Path(directory))
        self._written_version = 0
        self.report: PopLoadReport | None = None

    def load(self) -> PopLedger:
        """The ledger as last journaled: the snapshot (or its .bak) plus the journal after it. Its
        sink is this store's journal. ConfigFileError when both snapshots are damaged (unless
        allowed): starting without them would redeliver every in-flight and acked message."""
        remove_leftover_temp_files(self.path, log)
        problems: list[str] = []
        ledger, journal_from, source = self._read_snapshot(problems)
        events, damage, segments = self._journal.read_all(journal_from)
        applied = sum(ledger.apply(e) for e in events)
        # Dirty (a snapshot is due) when the files on disk are not yet the state: replayed events
        # are to be retired, and a state taken from .bak or started empty must become the main file.
        self._written_version = -1 if applied or source in (LoadSource.BACKUP, LoadSource.FORCED_EMPTY) else 0
        ledger.sink = self.append
        self.report = PopLoadReport(source, journal_from, segments, applied, len(events) - applied,
                                    problems + damage)
        return ledger

    def _read_snapshot(self, problems: list[str]) -> tuple[PopLedger, int, LoadSource]:
        """(ledger, first journal segment to replay, where from)."""
        main, bak = self.path, backup_path(self.path)
        damaged = False
        for path, source in ((main, LoadSource.MAIN), (bak, LoadSource.BACKUP)):
            try:
                doc = decode_snapshot(path.read_bytes())
                ledger = PopLedger.from_snapshot(doc, self._settings, pop_id_floor=self._floor)
            except FileNotFoundError:
                continue
            except (OSError, PopStateError) as e:
                problems.append(f"{path.name} is unusable: {e}")
                damaged = True
                continue
            if source is LoadSource.BACKUP and main.exists():
                # The next snapshot would rotate the damaged main file over this good backup.
                kept = main.with_name(main.name + ".corrupt")
                try:
                    main.replace(kept)
                    problems.append(f"loaded {bak.name}; the damaged {main.name} was moved to {kept.name}")
                except OSError as e:
                    problems.append(f"loaded {bak.name}; the damaged {main.name} could not be moved aside ({e})")
            return ledger, doc[JOURNAL_FROM_KEY], source
        empty = PopLedger(self._settings, pop_id_floor=self._floor)
        if not damaged:
            return empty, 0, LoadSource.NONE
        if not self._allow_empty:
            raise ConfigFileError(f"pop state {main} and its backup are unusable ({'; '.join(problems)}); "
                                  "refusing to start without them, which would redeliver every message "
                                  "in flight; repair or remove the files")
        return empty, 0, LoadSource.FORCED_EMPTY

    def append(self, events: Sequence[PopEvent]) -> None:
        """The ledger's sink: journal a batch in one write (raises OSError; the ledger then does not change)."""
        self._journal.append(encode_events(events))

    @property
    def settings(self) -> PopSettings | None:
        return self._settings

    def mark_dirty(self) -> None:
        """The ledger was replaced (a replica's mirror): the next persist writes it whatever its version."""
        self._written_version = -1

    def dirty(self, ledger: PopLedger) -> bool:
        return ledger.version != self._written_version

    def begin_snapshot(self, ledger: PopLedger) -> PendingSnapshot:
        """Copy the ledger and rotate the journal in one step (on the event loop)."""
        keep_from = self._journal.rotate()
        return PendingSnapshot(ledger.snapshot(), keep_from, ledger.version)

    def write_snapshot(self, pending: PendingSnapshot) -> int:
        """Write the copy durably, then delete the segments it covers; return how many. Raises OSError
        (nothing deleted: the next snapshot retires them)."""
        atomic_write(self.path, encode_snapshot(pending.doc, pending.keep_from), keep_backup=True)
        self._written_version = max(self._written_version, pending.version)
        return self._journal.discard_before(pending.keep_from)

    def snapshot(self, ledger: PopLedger) -> int:
        return self.write_snapshot(self.begin_snapshot(ledger))

    def close(self) -> None:
        self._journal.close()


def encode_snapshot(doc: dict, journal_from: int) -> bytes:
    """Compact JSON: the C encoder (json's `indent` falls back to the slow pure-Python one, and
    this file holds every in-flight entry)."""
    return json.dumps({FORMAT_KEY: FORMAT, JOURNAL_FROM_KEY: journal_from, **doc},
                      separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def decode_snapshot(data: bytes) -> dict:
    """The snapshot dict (PopLedger.from_snapshot's input); PopStateError when it is not one."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PopStateError(f"empty, truncated or not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get(FORMAT_KEY) != FORMAT:
        raise PopStateError(f"not a pop state of format {FORMAT}")
    mark = doc.get(JOURNAL_FROM_KEY)
    if not isinstance(mark, int) or isinstance(mark, bool) or not 0 <= mark <= _MAX_INT:
        raise PopStateError(f'"{JOURNAL_FROM_KEY}" {mark!r} is not a segment number')
    return doc
