"""DedupListener: run a push consumer's listener at most once per message key, within a bounded window.

Delivery is at least once: a consumer that dies before its offset
is committed, a broker that restarts before it persisted the offsets, a queue
moving to another consumer, a producer sending again after a timeout: each can
hand a listener a message it has already handled. Where the business
operation cannot be made idempotent itself, DedupListener wraps the listener
and keeps a mark per (consumer group, topic, key):

    absent --claim--> CONSUMING --listener succeeded--> CONSUMED --expiry or eviction--> absent
                       |      ^
                       |      +-- claimed again once consuming_expire_s has passed (a holder that hung)
                       +-- listener failed or raised: the mark is deleted, so the retry runs

Claiming is atomic. Absent (or an expired CONSUMING mark) becomes CONSUMING
and the message runs; CONSUMED means it ran already: skipped, it counts as
consumed; a live CONSUMING mark means a copy is running right now, so this one
is retried later, not skipped: the running copy may still fail, and a skip
would then lose the message.

Batches: the claims split a batch into skipped messages and a run that the
user's listener gets in one call, in batch order. The consume services count
the messages up to ack_index as consumed and retry the rest, so what goes back
must be a prefix of the batch; _settle() derives it. Nothing a call marks
CONSUMED lies after its prefix, so a handled message is never sent back.

The stores here serve one process (docs/dedup.md says what that promises);
marks shared between processes need a DedupStore over Redis or a database.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tidemark.client.consumer.consume_concurrently import checked_status
from tidemark.client.consumer.listener import (
    ConsumeConcurrentlyContext,
    ConsumeOrderlyContext,
    split_by_ack_index,
)
from tidemark.client.errors import ClientStateError, InvalidArgumentError, InvalidTypeError
from tidemark.client.message import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus, MessageExt
from tidemark.common.fsutil import atomic_write
from tidemark.common.logs import get_logger

__all__ = ["Claim", "ClaimOutcome", "DedupKey", "DedupListener", "DedupStats", "DedupStore", "FileDedupStore",
           "MemoryDedupStore"]

log = get_logger("tidemark.client.dedup")

DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_CONSUMING_EXPIRE_S = 60.0
# Longer than RocketMQ's whole retry schedule (16 retries take about 4 h 46 min), so a message that
# succeeded while one of its copies was still waiting in the retry topic is still remembered.
DEFAULT_RECORD_EXPIRE_S = 24 * 3600.0

RecordKey = tuple[str, str, str]  # (consumer group, topic, dedup key)
KeyFunction = Callable[[MessageExt], "str | None"]


class DedupKey(enum.Enum):
    """What identifies a message for deduplication."""

    # The message id (RocketMQ's UNIQ_KEY): the same across redeliveries, broker retries and the
    # producer's own retries of one send() call; a new one when the application sends again.
    MSG_ID = "MSG_ID"
    # Message.keys, the whole string: catches an application that sends the same business message
    # twice. A message without keys falls back to its message id.
    KEYS = "KEYS"


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


@dataclass(frozen=True, slots=True)
class DedupStats:
    skipped: int  # messages not given to the listener because their key was CONSUMED
    deferred: int  # messages retried later because a copy of them held a live CONSUMING mark


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


# -- the listener -------------------------------------------------------------------------------


class _Fate(enum.Enum):
    RUN = "RUN"  # given to the user's listener (run index: its place in the run)
    SKIP = "SKIP"  # CONSUMED already
    COPY = "COPY"  # a second message of the batch with a key the run holds (run index: that message's)


@dataclass(slots=True)
class _Plan:
    """One batch after claiming: what runs, what is skipped, where claiming stopped."""

    run: list[MessageExt] = field(default_factory=list)
    claims: list[Claim | None] = field(default_factory=list)  # per run member; None: not deduplicated
    fates: list[tuple[_Fate, int]] = field(default_factory=list)  # per claimed message of the batch, in order


class DedupListener:
    """Wraps a concurrent or orderly listener so it sees each key once (see the module docstring).

        store = FileDedupStore("/var/lib/app/orders.dedup", max_entries=200_000)
        consumer.register_message_listener(DedupListener(handle, group="orders", store=store, key=DedupKey.KEYS))

    The same object serves register_message_listener and register_message_listener_orderly: it
    tells them apart by the context it is called with. `group` must be the consumer's group: marks
    are per (group, topic, key), so one store can serve several groups. `key` is a DedupKey or a
    function of the message returning the key (None or "": that message is not deduplicated).
    A CONSUMING mark older than `consuming_expire_s` is taken over, so it must exceed the
    listener's longest run; a CONSUMED mark is kept `record_expire_s` (and while the store has room).
    """

    def __init__(self, listener: Callable[..., Any], *, group: str, store: DedupStore | None = None,
                 key: DedupKey | KeyFunction = DedupKey.MSG_ID,
                 consuming_expire_s: float = DEFAULT_CONSUMING_EXPIRE_S,
                 record_expire_s: float = DEFAULT_RECORD_EXPIRE_S) -> None:
        if not callable(listener):
            raise InvalidTypeError(f"listener must be callable, not {type(listener).__name__}")
        if not isinstance(group, str) or not group:
            raise InvalidArgumentError(f"group must be the consumer group's name, got {group!r}")
        if store is None:
            store = MemoryDedupStore()
        elif not isinstance(store, DedupStore):
            raise InvalidTypeError(f"store must be a DedupStore, not {type(store).__name__}")
        if not isinstance(key, DedupKey) and not callable(key):
            raise InvalidTypeError(f"key must be a DedupKey or a function of the message, got {key!r}")
        self.listener = listener
        self.group = group
        self.store = store
        self.key = key
        self.consuming_expire_s = _positive_seconds("consuming_expire_s", consuming_expire_s)
        self.record_expire_s = _positive_seconds("record_expire_s", record_expire_s)
        self._stats_lock = threading.Lock()
        self._skipped = 0
        self._deferred = 0

    def stats(self) -> DedupStats:
        with self._stats_lock:
            return DedupStats(self._skipped, self._deferred)

    def __call__(self, msgs: Sequence[MessageExt], context: ConsumeConcurrentlyContext | ConsumeOrderlyContext
                 ) -> ConsumeConcurrentlyStatus | ConsumeOrderlyStatus:
        if isinstance(context, ConsumeOrderlyContext):
            return self._consume_orderly(msgs, context)
        return self._consume_concurrently(msgs, context)

    def key_of(self, msg: MessageExt) -> str | None:
        """The message's dedup key; None: not deduplicated."""
        if self.key is DedupKey.MSG_ID:
            return msg.msg_id or None
        if self.key is DedupKey.KEYS:
            return msg.keys.strip() or msg.msg_id or None
        key = self.key(msg)
        if key is None or key == "":
            return None
        if not isinstance(key, str):
            raise InvalidTypeError(f"the dedup key function returned {type(key).__name__}, expected str or None")
        return key

    # -- one batch ----------------------------------------------------------------------------

    def _consume_concurrently(self, msgs: Sequence[MessageExt],
                              context: ConsumeConcurrentlyContext) -> ConsumeConcurrentlyStatus:
        plan = self._plan(msgs)
        ok = 0
        if plan.run:
            # The user's listener gets its own context: its ack_index counts in the run, not the batch.
            inner = ConsumeConcurrentlyContext(message_queue=context.message_queue,
                                               delay_level_when_next_consume=context.delay_level_when_next_consume)
            result = self._run(plan, inner)
            status = checked_status(result, context.message_queue)
            ok = split_by_ack_index(len(plan.run), status, inner.ack_index if status is result else None)
            context.delay_level_when_next_consume = inner.delay_level_when_next_consume
        consumed = self._settle(plan, ok)
        self._count(plan, consumed, len(msgs))
        if consumed == len(msgs):
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        context.ack_index = consumed - 1
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS if consumed else ConsumeConcurrentlyStatus.RECONSUME_LATER

    def _consume_orderly(self, msgs: Sequence[MessageExt], context: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        """Orderly batches are all or nothing: SUCCESS only once every message is consumed or skipped.
        A run that succeeded before a message in flight elsewhere stays CONSUMED: when the suspended
        batch comes back it is skipped, and the queue's order holds."""
        plan = self._plan(msgs)
        ok = 0
        if plan.run:
            result = self._run(plan, context)
            if result is ConsumeOrderlyStatus.SUCCESS:
                ok = len(plan.run)
            elif not isinstance(result, ConsumeOrderlyStatus):
                log.error("orderly listener returned %r; treating it as SUSPEND_CURRENT_QUEUE_A_MOMENT", result,
                          event="listener_bad_status", queue=context.message_queue)
        consumed = self._settle(plan, ok)
        complete = consumed == len(msgs)
        self._count(plan, consumed if complete else 0, len(msgs))
        return ConsumeOrderlyStatus.SUCCESS if complete else ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT

    def _plan(self, msgs: Sequence[MessageExt]) -> _Plan:
        """Claim the batch's keys in order, up to the first message in flight elsewhere: only a prefix
        can be reported consumed, so it and all after it are retried anyway, and running them now
        would be work thrown away (holding marks that block their copies)."""
        plan = _Plan()
        held: dict[RecordKey, int] = {}
        try:
            for msg in msgs:
                key = self.key_of(msg)
                if key is None:
                    plan.fates.append((_Fate.RUN, len(plan.run)))
                    plan.run.append(msg)
                    plan.claims.append(None)
                    continue
                record_key = (self.group, msg.topic, key)
                if record_key in held:
                    plan.fates.append((_Fate.COPY, held[record_key]))
                    continue
                claim = self.store.claim(record_key, self.consuming_expire_s)
                if claim.outcome is ClaimOutcome.DUPLICATE:
                    plan.fates.append((_Fate.SKIP, -1))
                elif claim.outcome is ClaimOutcome.IN_FLIGHT:
                    break
                else:
                    held[record_key] = len(plan.run)
                    plan.fates.append((_Fate.RUN, len(plan.run)))
                    plan.run.append(msg)
                    plan.claims.append(claim)
        except BaseException:
            self._release(plan.claims)
            raise
        return plan

    def _run(self, plan: _Plan, context: object) -> object:
        try:
            return self.listener(list(plan.run), context)
        except BaseException:
            # The consume service logs it and retries the whole batch: the retry must run again.
            self._release(plan.claims)
            raise

    def _settle(self, plan: _Plan, ok: int) -> int:
        """Mark the first `ok` run members CONSUMED and release the rest; return how many messages of
        the batch count as consumed: the longest prefix of claimed messages that are each skipped,
        a run member among the first `ok`, or a copy of one. The user's ack_index is a prefix of
        the run and the run keeps batch order, so every member marked CONSUMED lies in that prefix."""
        for i, claim in enumerate(plan.claims):
            if claim is None:
                continue
            try:
                if i < ok:
                    self.store.mark_consumed(claim, self.record_expire_s)
                else:
                    self.store.release(claim)
            except Exception:
                # The listener's outcome stands; the mark stays CONSUMING until consuming_expire_s.
                log.error("dedup store failed; the mark of %r stays CONSUMING until it expires", claim.key,
                          event="dedup_store_error", exc_info=True)
        consumed = 0
        for fate, index in plan.fates:
            if fate is not _Fate.SKIP and index >= ok:
                break
            consumed += 1
        return consumed

    def _release(self, claims: list[Claim | None]) -> None:
        for claim in claims:
            if claim is not None:
                try:
                    self.store.release(claim)
                except Exception:
                    log.error("dedup store failed to release %r; it stays CONSUMING until it expires", claim.key,
                              event="dedup_store_error", exc_info=True)

    def _count(self, plan: _Plan, consumed: int, size: int) -> None:
        # Only skips that count as consumed: the others come back and are counted then.
        skipped = sum(1 for fate, _ in plan.fates[:consumed] if fate is not _Fate.RUN)
        deferred = int(len(plan.fates) < size)
        if skipped or deferred:
            with self._stats_lock:
                self._skipped += skipped
                self._deferred += deferred


def _positive_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"{name} must be a positive number of seconds, got {value}")
    return float(value)
