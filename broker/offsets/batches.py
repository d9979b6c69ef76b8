"""JournaledBatches: how a batch of offset-table changes reaches the journal and the replicas, and what a
journal that cannot take it costs.

Every public change of ConsumerOffsetManager is one batch (a CommitOffsets
message is one too): its records are queued as the changes are made and go out
in one journal write when the outermost batch ends, before the call returns, so
a broker killed between two snapshots loses no applied commit (journal.py).
Then the batch's records go to the listeners (a master's replicas,
broker/cluster/replication.py), which take them within milliseconds instead of
at the next mirror.

When the journal cannot take that write (a full disk), what the caller asked
for is refused: every change of the batch is undone (undo.py) and StoreError
raised (UNAVAILABLE), as a send is refused, so an acknowledged commit is always
in the journal and a refused one is never applied, not even after a kill -9.
(Keeping such commits in memory, as RocketMQ does, acknowledged commits a crash
before the next snapshot lost.) Batches opened with `must_journal=False` are
the exception: changes that repeat state kept elsewhere (a pop watermark, whose
acknowledgements the pop journal holds; a deleted topic's entries; a master's
table mirrored on its replica) stand in memory and reach the next snapshot. A
refused batch is told to no listener.

The journal is then *failing*: logged once when it starts and once when it
ends, shown in `error` and passed to `on_state` (the manager's
`on_journal_state`: the broker's health). It ends with the next append that
works, or with a snapshot of the table version of the failure or later (it
holds every change the journal missed, and proves the disk takes writes again;
the snapshot timer writes one while the journal fails even when nothing
changed).

Apart from manager.py because it is the table's write path, not its rules: it
knows nothing of offsets, fences or generations, only that an entry is about to
change (the undo copies it) and that a record is to be written. The manager
says what changes; this says when the change holds and who hears of it.
Runs on the broker's event-loop thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tidemark.broker.errors import StoreError
from tidemark.broker.offsets.journal import (
    JournalRecord,
    OffsetJournal,
    Op,
    SetEncoder,
    encode_record,
)
from tidemark.broker.offsets.undo import BatchUndo
from tidemark.broker.store.writability import describe
from tidemark.common.logs import EventLogger


class JournaledBatches:
    """The batch under way: its records, how to undo it, and the journal's failing state."""

    def __init__(self, journal: OffsetJournal | None, *, undo: Callable[[], BatchUndo], version: Callable[[], int],
                 listeners: list[Callable[[list[JournalRecord]], None]], on_state: Callable[[str | None], None],
                 log: EventLogger) -> None:
        self._journal = journal  # None: nothing is journaled (a crash loses what the last snapshot lacks)
        self._new_undo = undo  # an undo over the table's maps as they are now (load() replaces them)
        self._version = version  # the table's version, remembered at a failure
        self._listeners = listeners
        self._on_state = on_state
        self._log = log
        self._pending: list[bytes] = []  # encoded records of the batch under way, written when it ends
        self._outgoing: list[JournalRecord] = []  # the same records for the listeners
        self._sets = SetEncoder()
        self.depth = 0  # batches under way, nested ones counted
        self.undo: BatchUndo | None = None  # how to undo the batch under way (None: no batch under way)
        self._must_journal = True  # the outermost batch's: undo and refuse when the journal fails
        # Why the journal cannot be written (None: it can), and the table version of the last failure:
        # a snapshot of that version or later holds every change the journal missed.
        self.error: str | None = None
        self._failed_version = 0

    @contextmanager
    def batch(self, *, must_journal: bool = True) -> Iterator[None]:
        """Changes made inside are one unit: they reach the journal in one write when the outermost batch
        ends. When that write fails, the outermost batch's `must_journal` decides: True, every change of
        the batch is undone and StoreError raised (the caller refuses what it was asked); False, they stand
        in memory and reach the next snapshot."""
        outer = self.depth == 0
        if outer:
            self.undo = self._new_undo()
            self._must_journal = must_journal
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if outer:
                undo, self.undo = self.undo, None
                outgoing, self._outgoing = self._outgoing, []
                self._flush(undo)  # a refused batch (StoreError) is undone, and told to nobody
                for listener in self._listeners if outgoing else ():
                    listener(outgoing)

    def add(self, record: JournalRecord) -> None:
        """Queue a record for the write that ends the running batch (every change runs in one)."""
        if self._journal is not None:
            self._pending.append(encode_record(record))
        if self._listeners:
            self._outgoing.append(record)

    def add_set(self, topic: str, group: str, queue_id: int, offset: int) -> None:
        """`add` of a commit's SET record, encoded the fast way (SetEncoder): the path every commit takes."""
        if self._journal is not None:
            self._pending.append(self._sets.encode(topic, group, queue_id, offset))
        if self._listeners:
            self._outgoing.append(JournalRecord(Op.SET, topic, group, queue_id, offset))

    def snapshot_written(self, version: int) -> None:
        """A snapshot of table `version` is on disk: it ends the failing state if it holds what was missed."""
        if self.error is not None and version >= self._failed_version:
            self._recovered("no longer needed: a snapshot holds what it missed")

    def _flush(self, undo: BatchUndo) -> None:
        if not self._pending:
            return
        records, self._pending = self._pending, []
        try:
            self._journal.append(b"".join(records))
        except OSError as e:
            self._failed(e, len(records))
            if not self._must_journal:
                return  # stands in memory; the next snapshot takes it (and ends the failing state)
            undo.restore()  # the version stays moved on: the next snapshot is also the failing state's probe
            raise StoreError(f"{describe(e)}: the offset journal cannot take the change, so it was not applied; "
                             f"retry later") from None
        if self.error is not None:
            self._recovered("written again")

    def _failed(self, error: OSError, records: int) -> None:
        self._failed_version = self._version()
        if self.error is None:
            self.error = f"offset journal: {describe(error)}"
            self._log.error("cannot append to the offset journal: %s; commits are refused until it can be "
                            "written", error, event="offsets_journal_failed", records=records)
            self._on_state(self.error)

    def _recovered(self, how: str) -> None:
        self.error = None
        self._log.info("offset journal %s after %d failed writes", how, self._journal.write_errors,
                       event="offsets_journal_recovered")
        self._on_state(None)

