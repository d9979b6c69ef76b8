"""The stores of DedupListener's marks (dedup.py): in memory, and in a file that survives a restart.

A mark per (consumer group, topic, key): CONSUMING while a listener runs the
message (with a token naming its holder and an expiry, so that a holder that
hung is taken over), CONSUMED once it succeeded (until it expires or the store
needs the room). `claim` is atomic: of two copies claimed at once, one runs.

MemoryDedupStore keeps the marks of one process in a bounded table.
FileDedupStore adds an append-only log of CONSUMED marks, so that they
survive a restart of the process: one line each, rewritten with the live marks
only once it has grown, and a lock on the file so that two stores never share
it. docs/dedup.md says what each promises.
"""

from __future__ import annotations

import enum
import fcntl
import itertools
import json
import math
import os
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tidemark.client.errors import ClientStateError, InvalidArgumentError, InvalidTypeError
from tidemark.common.fsutil import atomic_write
from tidemark.common.logs import get_logger

__all__ = ["Claim", "ClaimOutcome", "DedupStore", "FileDedupStore", "MemoryDedupStore", "RecordKey"]

log = get_logger("tidemark.client.dedup")

DEFAULT_MAX_ENTRIES = 100_000

RecordKey = tuple[str, str, str]  # (consumer group, topic, dedup key)


class ClaimOutcome(enum.Enum):
    ACQUIRED = "ACQUIRED"  # the caller now holds the CONSUMING mark: run the listener
    DUPLICATE = "DUPLICATE"  # CONSUMED already: skip the message
    IN_FLIGHT = "IN_FLIGHT"  # another call holds a live CONSUMING mark: retry the message later


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer of DedupStore.claim(); `token` names the holder's mark (ACQUIRED only)."""

    key: RecordKey
    outcome: ClaimOutcome
    token: object = None


class DedupStore(ABC):
    """Where the marks live; safe to call from many threads at once.

    To share marks between processes, implement it over a store they all reach; in Redis terms:
    claim = `SET k CONSUMING:<token> NX PX consuming_expire` (on failure GET k: CONSUMED... is a
    DUPLICATE, CONSUMING... IN_FLIGHT), mark_consumed = `SET k CONSUMED PX record_expire`, release
    = delete k only while it still holds the caller's token (a Lua compare-and-delete).
    """

    @abstractmethod
    def claim(self, key: RecordKey, consuming_expire_s: float) -> Claim:
        """Atomically: CONSUMED -> DUPLICATE; live CONSUMING -> IN_FLIGHT; else mark CONSUMING, ACQUIRED."""

    @abstractmethod
    def mark_consumed(self, claim: Claim, record_expire_s: float) -> None:
        """The listener succeeded: the key is CONSUMED for record_expire_s (even if the caller's CONSUMING
        mark expired and another call took it over: the side effect did happen)."""

    @abstractmethod
    def release(self, claim: Claim) -> None:
        """The listener failed: delete the caller's CONSUMING mark (not one another call took over)."""

    def close(self) -> None:  # noqa: B027 - only stores holding resources need it
        """Give back files or connections; the store is not used afterwards."""

    def __enter__(self) -> DedupStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _MarkTable:
    """The marks of the in-process stores. Pure: no lock, no clock (callers pass `now`), no I/O.

    Two maps, because they are bounded differently: CONSUMED marks are the window, capped at
    max_entries and kept in the order they were written (oldest evicted first; replaying the file
    store's log rebuilds the same order); CONSUMING marks are one per running listener call.
    """

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.consuming: dict[RecordKey, tuple[int, float]] = {}  # key -> (token, expires at)
        self.consumed: OrderedDict[RecordKey, float] = OrderedDict()  # key -> expires at, oldest first
        self._tokens = itertools.count(1)

    def claim(self, key: RecordKey, now: float, consuming_expire_s: float) -> Claim:
        expires = self.consumed.get(key)
        if expires is not None:
            if expires > now:
                return Claim(key, ClaimOutcome.DUPLICATE)
            del self.consumed[key]
        held = self.consuming.get(key)
        if held is not None and held[1] > now:
            return Claim(key, ClaimOutcome.IN_FLIGHT)
        token = next(self._tokens)
        self.consuming[key] = (token, now + consuming_expire_s)
        return Claim(key, ClaimOutcome.ACQUIRED, token)

    def mark_consumed(self, claim: Claim, now: float, record_expire_s: float) -> float:
        self.release(claim)
        expires = now + record_expire_s
        self.put_consumed(claim.key, expires, now)
        return expires

    def release(self, claim: Claim) -> None:
        held = self.consuming.get(claim.key)
        if held is not None and held[0] == claim.token:
            del self.consuming[claim.key]

    def put_consumed(self, key: RecordKey, expires: float, now: float) -> None:
        self.consumed[key] = expires
        self.consumed.move_to_end(key)
        while len(self.consumed) > self.max_entries:
            self.consumed.popitem(last=False)
        # Expired marks at the old end go too; one further in stays until it surfaces or is evicted
        # (listeners sharing a store may keep records for different times), which the cap bounds.
        while self.consumed:
            oldest, oldest_expires = next(iter(self.consumed.items()))
            if oldest_expires > now:
                break
            del self.consumed[oldest]


class MemoryDedupStore(DedupStore):
    """Marks in this process's memory: shared by the listeners and threads of one process, lost on exit.

    `clock` (wall-clock seconds) is for tests.
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, *, clock: Callable[[], float] = time.time) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int):
            raise InvalidTypeError(f"max_entries must be an int, not {type(max_entries).__name__}")
        if max_entries < 1:
            raise InvalidArgumentError(f"max_entries must be at least 1, got {max_entries}")
        if not callable(clock):
            raise InvalidTypeError("clock must be callable")
        self._clock = clock
        self._lock = threading.Lock()
        self._table = _MarkTable(max_entries)

    def claim(self, key: RecordKey, consuming_expire_s: float) -> Claim:
        with self._lock:
            self._check_open()
            return self._table.claim(key, self._clock(), consuming_expire_s)

    def mark_consumed(self, claim: Claim, record_expire_s: float) -> None:
        _check_acquired(claim)
        with self._lock:
            self._check_open()
            expires = self._table.mark_consumed(claim, self._clock(), record_expire_s)
            self._persist(claim.key, expires)

    def release(self, claim: Claim) -> None:
        _check_acquired(claim)
        with self._lock:
            self._table.release(claim)

    def __len__(self) -> int:
        """CONSUMED marks held (expired ones not yet dropped included)."""
        with self._lock:
            return len(self._table.consumed)

    def _check_open(self) -> None:
        """Hook: a closed file store refuses further use."""

    def _persist(self, key: RecordKey, expires: float) -> None:
        """Hook, called under the lock after a key became CONSUMED."""


# -- the file store -----------------------------------------------------------------------------

_HEADER = {"format": "tidemark-dedup", "version": 1}
_HEADER_LINE = json.dumps(_HEADER, separators=(",", ":")) + "\n"
# Rewrite the log once this many records were appended since the last rewrite (at least; max_entries
# when larger), so the file stays under about twice the window without rewriting it per message.
_MIN_COMPACT_AFTER = 1024


def encode_record(key: RecordKey, expires: float) -> str:
    """One log line: `["group","topic","key",expires]`. ASCII JSON: a newline in a key is escaped."""
    return json.dumps([*key, round(expires, 3)], separators=(",", ":")) + "\n"


def decode_log(data: bytes, path: object = "dedup file") -> tuple[list[tuple[RecordKey, float]], int]:
    """The records of a FileDedupStore log in write order, and how many lines were skipped.

    Raises InvalidArgumentError when the file is not empty and does not start with our header: it
    is some other file, and the store's next rewrite would destroy it. A line a crash cut short (the
    last one, with no newline) or a damaged line is skipped: losing a record only weakens dedup.
    """
    if not data:
        return [], 0
    lines = data.split(b"\n")
    try:
        header = json.loads(lines[0])
    except ValueError:
        header = None
    if header != _HEADER:
        raise InvalidArgumentError(f"{path} is not a Tidemark dedup file (no {_HEADER_LINE.strip()} header); "
                                   "refusing to overwrite it")
    records: list[tuple[RecordKey, float]] = []
    # split() leaves b"" after a final newline; anything else in last place is a torn append.
    body, tail = lines[1:-1], lines[-1] if len(lines) > 1 else b""
    skipped = int(bool(tail))
    for line in body:
        try:
            group, topic, key, expires = json.loads(line)
        except (ValueError, TypeError):  # not JSON, or not a list of four
            skipped += 1
            continue
        if (not all(isinstance(s, str) for s in (group, topic, key)) or isinstance(expires, bool)
                or not isinstance(expires, int | float) or not math.isfinite(expires)):
            skipped += 1
            continue
        records.append(((group, topic, key), float(expires)))
    return records, skipped


class FileDedupStore(MemoryDedupStore):
    """MemoryDedupStore whose CONSUMED marks survive a restart of the process, in an append-only log.

    A CONSUMED mark appends one line: a plain write survives the process crashing, not a power loss
    unless `fsync=True` (a disk flush per message). At start, and after max(max_entries, 1024)
    appends, the log is rewritten with the live marks only, atomically (temp file, fsync, rename, as
    broker/offsets/persistence.py writes offsets). CONSUMING marks are not written: only this
    process's threads honour them, and none of them outlives it. One store per file: `<path>.lock`
    is flock()ed while the store is open. A failed write is logged and the next mark rewrites the
    file; the marks in memory stay right meanwhile.
    """

    def __init__(self, path: str | os.PathLike[str], max_entries: int = DEFAULT_MAX_ENTRIES, *,
                 fsync: bool = False, clock: Callable[[], float] = time.time) -> None:
        super().__init__(max_entries, clock=clock)
        if not isinstance(path, str | os.PathLike):
            raise InvalidTypeError(f"path must be a str or a path, not {type(path).__name__}")
        self.path = Path(path)
        if self.path.is_dir():
            raise InvalidArgumentError(f"dedup file {self.path} is a directory")
        self._fsync = bool(fsync)
        self._compact_after = max(max_entries, _MIN_COMPACT_AFTER)
        self._appended = 0
        self._rewrite_needed = False
        self._fd: int | None = None
        self._lock_fd: int | None = self._take_file_lock()
        try:
            self._load()
        except BaseException:
            self._give_back_file_lock()
            raise

    def _take_file_lock(self) -> int:
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise InvalidArgumentError(f"cannot open dedup file lock {lock_path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise InvalidArgumentError(
                f"dedup file {self.path} is in use by another FileDedupStore (in this or another process); "
                "give each process its own file, or share marks through a DedupStore over Redis or a database"
            ) from None
        return fd

    def _give_back_file_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        except OSError as e:
            raise InvalidArgumentError(f"cannot read dedup file {self.path}: {e.strerror or e}") from None
        records, skipped = decode_log(data, self.path)
        if skipped:
            log.warning("%s: skipped %d damaged or cut-short record(s)", self.path, skipped,
                        event="dedup_load_skipped", count=skipped)
        # Replayed in write order with nothing expiring meanwhile, the records evict each other as the
        # marks did when they were written; a key's last record decides. Then what expired goes.
        table = self._table
        for key, expires in records:
            table.put_consumed(key, expires, now=-math.inf)
        now = self._clock()
        for key in [k for k, expires in table.consumed.items() if expires <= now]:
            del table.consumed[key]
        # Always rewritten: drops what expired or was evicted, and a torn last line that the next
        # append would otherwise glue a record to.
        try:
            self._rewrite()
        except OSError as e:
            raise InvalidArgumentError(f"cannot write dedup file {self.path}: {e.strerror or e}") from None
        log.info("dedup file loaded", event="dedup_load", path=str(self.path), records=len(table.consumed))

    def _rewrite(self) -> None:
        text = _HEADER_LINE + "".join(encode_record(k, x) for k, x in self._table.consumed.items())
        atomic_write(self.path, text.encode("ascii"))
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._appended = 0
        self._rewrite_needed = False

    def _persist(self, key: RecordKey, expires: float) -> None:
        try:
            if self._rewrite_needed or self._appended >= self._compact_after:
                self._rewrite()  # the table holds the new mark already
                return
            data = encode_record(key, expires).encode("ascii")
            while data:
                data = data[os.write(self._fd, data):]
            if self._fsync:
                os.fsync(self._fd)
            self._appended += 1
        except OSError as e:
            # A partial line may be on disk: the next mark rewrites the whole file instead of appending.
            self._rewrite_needed = True
            log.error("cannot write dedup file %s: %s; the mark holds in memory, a restart may forget it",
                      self.path, e.strerror or e, event="dedup_write_failed", path=str(self.path))

    def _check_open(self) -> None:
        if self._fd is None:
            raise ClientStateError(f"dedup file store {self.path} is closed")

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._give_back_file_lock()


def _check_acquired(claim: Claim) -> None:
    if not isinstance(claim, Claim) or claim.outcome is not ClaimOutcome.ACQUIRED:
        raise InvalidArgumentError(f"only an ACQUIRED claim can be marked consumed or released, got {claim!r}")
