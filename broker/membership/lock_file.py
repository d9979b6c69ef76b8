"""queueLocks.json: the queue locks a broker granted, kept across its restarts.

A client counts on a queue lock for half the broker's lock expiry after it
asked for the last renewal the broker answered (client/consumer/lock_hold.py).
A broker that forgot its locks when it restarted granted a queue at once to
the next member that asked, while a holder cut off from it (no broken stream
to tell it the broker had gone) went on calling its listener with the queue's
messages for the rest of that half: two members consuming one orderly queue.
With the table on disk, a restarted broker holds each lock that was held for
half its expiry more (QueueLockManager.restore), and the holder still alive
renews it and goes on under the same owner epoch and lock token: no re-lock,
no re-read, its commits not fenced.

When it is written (QueueHandover):
- a LockQueues call that made a new grant is answered once a table with that
  grant is on disk (`save`; the calls of one moment share a write, made on
  the loop for a small table without fsync, else in a worker thread);
  renewals of a live grant change nothing here and wait for nothing;
- releases (unlocks, expiries, members gone) are written within 0.1 s, not
  waited for (`save_soon`; a grant meanwhile writes them with it): one not
  yet on disk when the broker dies costs its queue's next owner half an
  expiry after the restart, no more.
A write that fails (a full disk) is logged and the grant answered all the
same: the broker is then as it was without the file, and the next change
writes the whole table again.

A replica keeps a copy of its master's table, sent whole on the replication
stream with each change (masterQueueLocks.json on disk; from a master older
than that, with the rest of its metadata once a second): promoted, it holds
those locks in the same way (`adopt_master`), keeping any grant of its own
still held. A master answers a grant once its replicas in sync acknowledged
the table holding it (ReplicationSource.wait_table_replicated), so a replica
promoted after the answer holds the lock.

The file is replaced atomically (a temp file renamed into place) and fsynced
when the broker flushes messages synchronously (flush=sync), as its messages
are: a machine that crashes with async flush loses what the page cache had,
and restarting takes longer than half an expiry anyway. Damaged, it is set
aside (`.damaged`) and the broker starts with no locks, as before the file
existed.

    {"version": 1, "lockExpiryMs": 60000, "locks": [{"group": "g", "topic": "t", "queueId": 0, "clientId": "c",
      "ownerEpoch": 17, "lockToken": 18, "held": true, "startOffset": 42}, ...]}
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path

from tidemark.broker.membership.locks import QueueLockManager, SavedLock
from tidemark.common.fsutil import atomic_write
from tidemark.common.logs import get_logger
from tidemark.common.scheduler import TaskSet

log = get_logger("tidemark.broker")

LOCK_FILE_NAME = "queueLocks.json"
# A replica's copy of its master's table (ReplicationChunk.queue_locks), for a promotion.
MASTER_LOCK_FILE_NAME = "masterQueueLocks.json"
# Up to this many locks, a write without fsync is made on the broker's loop (about 0.1-0.5 ms): through a
# worker thread it cost a join 4.5 ms between the grant and its answer on a busy broker (two writes in a
# row, each waiting for the GIL behind the loop; `python -m bench.join_timeline`). Larger tables, and every
# fsynced write, go to a thread.
INLINE_MAX_LOCKS = 500
# A replica writes its copy of its master's table on the loop up to this size (about INLINE_MAX_LOCKS locks).
INLINE_MAX_MASTER_BYTES = 64 << 10
# How long a release waits to be written (save_soon): in a handover the next owner's grant follows it at
# once and writes both.
SOON_S = 0.1
VERSION = 1
_FIELDS = (("group", str), ("topic", str), ("queueId", int), ("clientId", str), ("ownerEpoch", int),
           ("lockToken", int), ("held", bool))


def encode_locks(saved: list[SavedLock], expiry_ms: int) -> bytes:
    """The file's bytes for a table (QueueLockManager.snapshot) and the lock expiry its grants were told."""
    return json.dumps({"version": VERSION, "lockExpiryMs": expiry_ms, "locks": [
        {"group": lk.group, "topic": lk.topic, "queueId": lk.queue_id, "clientId": lk.client_id,
         "ownerEpoch": lk.owner_epoch, "lockToken": lk.token, "held": lk.held, "startOffset": lk.start_offset}
        for lk in saved]}, separators=(",", ":")).encode()


def decode_locks(data: bytes) -> tuple[list[SavedLock], int]:
    """The table in a file's bytes and the lock expiry its grants were told; ValueError naming what is
    wrong (every entry must be whole: a table with a lock missing would hand that queue to the next
    member that asks)."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("locks"), list):
        raise ValueError(f"not a version {VERSION} lock table")
    expiry_ms = doc.get("lockExpiryMs")
    if not isinstance(expiry_ms, int) or isinstance(expiry_ms, bool) or expiry_ms <= 0:
        raise ValueError(f"lockExpiryMs is {expiry_ms!r}")
    out: list[SavedLock] = []
    for i, entry in enumerate(doc["locks"]):
        if not isinstance(entry, dict):
            raise ValueError(f"entry {i} is not an object")
        values = []
        for name, kind in _FIELDS:
            value = entry.get(name)
            # (bool is an int in Python: a count must not be true, a flag must be a flag)
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise ValueError(f"entry {i}: {name} is {value!r}, not {kind.__name__}")
            values.append(value)
        start = entry.get("startOffset")
        if start is not None and (not isinstance(start, int) or isinstance(start, bool)):
            raise ValueError(f"entry {i}: startOffset is {start!r}")
        out.append(SavedLock(*values, start_offset=start))
    return out, expiry_ms


class LockFile:
    """Keeps a QueueLockManager's table in `path`: loaded at start, saved as it changes."""

    def __init__(self, path: Path, locks: QueueLockManager, *, fsync: bool) -> None:
        self.path = Path(path)
        self._locks = locks
        self._fsync = fsync
        self._covered = 0  # the changes counted when the last write ended began (written or failed)
        self._written = 0  # the changes counted when the last successful write began
        self._writing: asyncio.Task | None = None
        self._soon_pending = False  # a save_soon() waits for its moment
        self._master = b""  # a replica: its master's table as last kept (keep_master)
        self._master_on_disk = b""  # ... and as last written to masterQueueLocks.json
        self._encoded: tuple[int, bytes] = (-1, b"")  # (changes, the table's bytes then): encoded()
        self._soon = TaskSet("lock_file_write_failed", "queue lock table write failed", log)
        # Told of each change about to be written (a master's replication streams send the table: replication.py).
        self.on_change: Callable[[], None] = lambda: None
        # A replica: a large copy of its master's table being written off the loop (waited for at close).
        self._master_writing = False
        self._master_writes = TaskSet("master_lock_file_write_failed", "master queue lock table write failed", log)

    def load(self) -> int:
        """Restore the saved table (QueueLockManager.restore); the number of locks held again. No file: none
        (a new broker). A damaged file is set aside and logged, and nothing is restored."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return 0
        try:
            saved, expiry_ms = decode_locks(data)
        except ValueError as e:
            aside = self.path.with_name(self.path.name + ".damaged")
            try:
                os.replace(self.path, aside)
            except OSError:
                aside = self.path  # (left where it is: the next write replaces it)
            log.warning("queue lock table damaged: starting with no locks (a member cut off when the broker "
                        "stopped may still consume what it fetched, beside the queue's next owner)",
                        event="lock_file_damaged", path=str(aside), error=str(e))
            return 0
        self._locks.restore(saved, earlier_expiry_ms=expiry_ms)
        self._covered = self._written = self._locks.changes  # (what is on disk already)
        held = sum(1 for lk in saved if lk.held)
        log.info("queue locks restored", event="locks_restored", held=held, history=len(saved) - held)
        return held

    # -- a replica's copy of its master's table ----------------------------------------------------

    @property
    def changes(self) -> int:
        """The table's changes so far (QueueLockManager.changes): what a copy of it follows."""
        return self._locks.changes

    def encoded(self) -> bytes:
        """The table as the file holds it (what a master's replicas copy): encoded again only when it
        changed."""
        if self._encoded[0] != self._locks.changes:
            self._encoded = (self._locks.changes, encode_locks(self._locks.snapshot(), self._locks.expiry_ms))
        return self._encoded[1]

    def keep_master(self, data: bytes) -> None:
        """A replica: keep its master's table, as copied, for a promotion: in memory, and on disk so that a
        replica restarted just before it is promoted still has it (a small table at once, on the loop; a large
        one in a worker thread, the latest copy when the previous write ends). A copy that cannot be written
        (a full disk) is logged and written at the next copy; the one in memory is kept all the same."""
        self._master = data
        if data == self._master_on_disk or self._master_writing:
            return
        if len(data) <= INLINE_MAX_MASTER_BYTES:
            self._write_master(data)
        else:
            self._master_writing = True
            self._master_writes.spawn(self._write_master_off_loop(), name="master-queue-lock-file")

    async def _write_master_off_loop(self) -> None:
        try:
            while self._master != self._master_on_disk:
                if not await asyncio.to_thread(self._write_master, self._master):
                    return  # (logged; the next copy tries again)
        finally:
            self._master_writing = False

    def _write_master(self, data: bytes) -> bool:
        try:
            atomic_write(self.path.with_name(MASTER_LOCK_FILE_NAME), data, sync=False)
        except OSError as e:
            log.warning("the master's queue lock table not written: a promotion after a restart would not hold "
                        "its locks", event="master_locks_not_kept", error=e.strerror or str(e))
            return False
        self._master_on_disk = data
        return True

    def adopt_master(self) -> int:
        """A replica promoted: the locks its master held, as last copied (in this run, else from the file),
        held here for half the expiry as after a restart (QueueLockManager.restore; a queue granted here and
        still held keeps that grant). The number of locks taken; none when no copy was kept or it is
        unreadable (logged)."""
        path = self.path.with_name(MASTER_LOCK_FILE_NAME)
        try:
            saved, expiry_ms = decode_locks(self._master or path.read_bytes())
        except FileNotFoundError:
            return 0
        except ValueError as e:
            log.warning("the master's queue lock table is unreadable: promoted without its locks",
                        event="master_locks_unreadable", path=str(path), error=str(e))
            return 0
        taken = self._locks.restore(saved, earlier_expiry_ms=expiry_ms, keep_live=True)
        log.info("the master's queue locks taken over", event="master_locks_adopted",
                 held=sum(1 for lk in saved if lk.held), taken=taken)
        return taken

    async def save(self) -> None:
        """Until a write that began after the table's latest change has ended (written, or its failure
        logged). A small table without fsync is written at once, on the loop; else callers at one moment
        share one write, in a worker thread. Nothing to write returns at once."""
        wanted = self._locks.changes
        if self._covered < wanted:
            self.on_change()
        while self._covered < wanted:
            if self._writing is None:
                if self._write_inline():
                    continue
                self._writing = asyncio.get_running_loop().create_task(self._write(), name="queue-lock-file")
            await asyncio.shield(self._writing)

    def save_soon(self) -> None:
        """Write the table's latest changes within SOON_S, not waited for (releases): a grant made meanwhile
        (a handover's next owner, answered at the release) writes them with it, in one write."""
        if self._covered < self._locks.changes and not self._soon_pending:
            self.on_change()
            self._soon_pending = True
            self._soon.spawn(self._save_later(), name="queue-lock-file-soon")

    async def _save_later(self) -> None:
        try:
            await asyncio.sleep(SOON_S)
        finally:
            self._soon_pending = False
        await self.save()

    async def close(self) -> None:
        """At shutdown: what is not on disk yet (a failed write included) is written once more; a replica's
        copy of its master's table being written is finished."""
        await self._soon.close()
        self._covered = self._written
        await self.save()
        await self._master_writes.wait()
        await self._master_writes.close()

    def _write_inline(self) -> bool:
        """Write a small table at once, on the loop (no fsync); False when it must go to a thread."""
        if self._fsync or self._locks.size > INLINE_MAX_LOCKS:
            return False
        began = self._locks.changes
        self._done(began, self._write_file(self._locks.snapshot()))
        return True

    async def _write(self) -> None:
        began = self._locks.changes
        saved = self._locks.snapshot()
        try:
            error = await asyncio.to_thread(self._write_file, saved)
        finally:
            self._writing = None
        self._done(began, error)

    def _done(self, began: int, error: OSError | None) -> None:
        """A write that began at change `began` ended (`error`: it failed)."""
        if error is None:
            self._written = began
        else:
            log.warning("queue lock table not written: a restart before the next write forgets the locks "
                        "granted since", event="lock_file_write_failed", path=str(self.path),
                        error=error.strerror or str(error))
        self._covered = max(self._covered, began)

    def _write_file(self, saved: list[SavedLock]) -> OSError | None:
        """Write the table; the error when it could not be written."""
        try:
            atomic_write(self.path, encode_locks(saved, self._locks.expiry_ms), sync=self._fsync)
        except OSError as e:
            return e
        return None
