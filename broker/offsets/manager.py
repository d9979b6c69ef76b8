"""ConsumerOffsetManager: committed consumer offsets per (topic, group, queue), with fencing.

RocketMQ's broker keeps `topic@group -> queueId -> offset` in memory, answers
queries from it and flushes it to consumerOffset.json every 5 s. Tidemark adds
fencing (docs/architecture.md, "Offsets and fencing"): a commit may carry the
committer's owner epoch and the reset generation it last saw, so a consumer
that lost its queue, or that has not yet seen an admin reset, cannot move the
offset.

The fencing rules are fencing.py's. Fencing state (last fenced commit) lives
in memory only; reset generations are persisted beside the table.
Generations and epochs come from the broker-wide EpochSequence, whose values
grow across restarts, so a value quoted by a client from before a restart
never looks newer than one issued after it.

The table is kept as two parallel maps rather than one record per entry: the
plain `{queue: offset}` dicts are exactly what gets persisted, so a snapshot is
a shallow copy of 1,000 small dicts instead of building 100,000 objects on the
event loop. The fencing state exists only for entries that were ever fenced or
reset.

Every change of the table is also appended to the offset journal
(journal.py) before the call returns, so a broker killed between two 5 s
snapshots loses no applied commit: load() replays the journal on top of the
snapshot, and each successful snapshot deletes the journal segments it covers.
Each public change is one `batch()`; batches.py says how a batch reaches the
journal and the replicas, and why one the journal cannot take is refused and
undone (or, for state kept elsewhere, stands in memory).

Threading: every method except the file write runs on the broker's event-loop
thread. persist_if_dirty copies the table there, then encodes and writes in a
worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path

from tidemark.broker.membership.epoch import EpochSequence
from tidemark.broker.offsets.batches import JournaledBatches
from tidemark.broker.offsets.fencing import (
    NO_FENCE_STATE,
    Fence,
    FenceState,
    OwnershipView,
    check_fence,
)
from tidemark.broker.offsets.journal import (
    JournalRecord,
    OffsetJournal,
    Op,
    ReplayReport,
    apply_records,
)
from tidemark.broker.offsets.persistence import (
    OFFSET_FILE_NAME,
    LoadReport,
    OffsetTable,
    TableKey,
    count_entries,
    invalid_names,
    load_offset_file,
    table_key,
)
from tidemark.broker.offsets.snapshots import (
    PersistReport,
    SnapshotWriter,
    check_entry,
    check_offset,
)
from tidemark.broker.offsets.undo import BatchUndo
from tidemark.common.logs import get_logger

_log = logging.getLogger("tidemark.broker.offsets")


class ConsumerOffsetManager:
    """The broker's committed-offset table (RocketMQ's ConsumerOffsetManager)."""

    def __init__(
        self,
        config_dir: Path,
        *,
        epochs: EpochSequence,
        ownership: OwnershipView | None = None,
        allow_empty_on_corruption: bool = False,
        journal: bool = True,
        logger: logging.Logger | None = None,
    ) -> None:
        self._path = Path(config_dir) / OFFSET_FILE_NAME
        self._epochs = epochs
        self._ownership = ownership
        self._allow_empty_on_corruption = allow_empty_on_corruption
        self._log = get_logger(logger or _log)
        self._offsets: OffsetTable = {}
        self._fences: dict[TableKey, dict[int, FenceState]] = {}
        # Generations of reset entries, persisted beside the offsets (small: resets are rare).
        self._generations: dict[TableKey, dict[int, int]] = {}
        # Entries removed by an admin (delete-offsets, a deleted group or topic) since this start, until the
        # group commits there again: a replica's table handed back must not bring them back (take_back).
        self._removed: set[TableKey] = set()
        # Dirty tracking by version numbers, not a flag: a persist records the
        # version it snapshotted, so a commit landing during the write keeps
        # the table dirty.
        self._version = 0
        self._persisted_version = 0
        self._persist_lock = asyncio.Lock()
        # Nothing is written before load() succeeded: a broker that refuses to
        # start on a damaged file must not replace it with an empty table on its
        # way out (the next start would then silently rewind every group).
        self._loaded = False
        # Without a journal (journal=False) a crash loses the changes since the last snapshot, as in RocketMQ.
        self._journal = OffsetJournal(self._path.parent) if journal else None
        # Snapshots written in version order, the journal segments each covers then deleted.
        self._snapshots = SnapshotWriter(self._path, self._journal)
        # Called with each batch's records once they hold (journaled, or standing in memory): a master's
        # replicas (broker/cluster/replication.py), which take them within milliseconds instead of at the next mirror.
        self.listeners: list[Callable[[list[JournalRecord]], None]] = []
        # The batch under way, its one journal write, and the journal's failing state (batches.py).
        self._batches = JournaledBatches(
            self._journal, listeners=self.listeners, log=self._log, version=lambda: self._version,
            undo=lambda: BatchUndo((self._offsets, self._fences, self._generations), self._removed),
            on_state=self._report_journal_state)
        self.journal_report: ReplayReport | None = None
        self._mirror_skipped: frozenset[TableKey] = frozenset()  # entries of the master's table with bad names
        # Called on the event loop with journal_error whenever the journal starts or stops failing.
        self.on_journal_state: Callable[[str | None], None] | None = None

    @property
    def path(self) -> Path:
        return self._path

    @property
    def journal_error(self) -> str | None:
        """Why the offset journal cannot be written now; None when it can (or there is none)."""
        return self._batches.error

    # -- load ----------------------------------------------------------------

    def load(self) -> LoadReport:
        """Replace the table with consumerOffset.json's content (or its .bak).

        Raises ConfigFileError when the files are damaged and no good backup
        exists, unless the manager was built with allow_empty_on_corruption.
        """
        table, report = load_offset_file(
            self._path, allow_empty_on_corruption=self._allow_empty_on_corruption, logger=self._log
        )
        self._offsets = table
        self._generations = {key: dict(queues) for key, queues in report.reset_generations.items()}
        replayed = self._replay_journal(report.journal_from)
        self._fences = {key: {q: FenceState(reset_generation=g) for q, g in queues.items()}
                        for key, queues in self._generations.items()}
        self._version += 1
        self._persisted_version = self._version
        if replayed:
            self._version += 1  # the next snapshot takes the replayed changes in and retires the journal
        self._loaded = True
        self._log.info("loaded %d consumer offsets", report.entries, event="offsets_load",
                       source=report.source.value, file=report.path, entries=report.entries,
                       journal_records=replayed)
        return report

    def _replay_journal(self, first: int) -> int:
        """Apply the journal segments the snapshot does not hold (numbered `first` or higher)."""
        if self._journal is None:
            return 0
        records, replay = self._journal.read_all(first)
        self.journal_report = replay
        for problem in replay.damage:
            # Expected after a crash inside a write: the commits of that last write were never answered.
            self._log.warning("offset journal %s", problem, event="offsets_journal_damage")
        return apply_records(self._offsets, self._generations, records)

    def batch(self, *, must_journal: bool = True) -> AbstractContextManager[None]:
        """Changes made inside are one unit, journaled in one write when the outermost batch ends; when
        that write fails, `must_journal` decides whether they are undone (StoreError) or stand in memory
        (batches.py)."""
        return self._batches.batch(must_journal=must_journal)

    def _journal_change(self, record: JournalRecord) -> None:
        """Queue a record for the write that ends the running batch (every change runs in one)."""
        if self._loaded:
            self._batches.add(record)

    def _report_journal_state(self, error: str | None) -> None:
        if self.on_journal_state is not None:
            self.on_journal_state(error)

    def _touch(self, key: TableKey) -> None:
        """Call before every change of an entry: a batch the journal refuses puts it back."""
        undo = self._batches.undo
        if undo is not None:
            undo.keep(key)

    # -- commit / query / reset ---------------------------------------------

    def commit(
        self, group: str, topic: str, queue_id: int, offset: int, fence: Fence | None = None,
        *, allow_rewind: bool = False,
    ) -> bool:
        """Store `offset` (the next offset to consume); return True if the stored value changed.

        Without an owner epoch or reset generation in `fence`, the last write
        wins, as in RocketMQ. Otherwise:
        - reset generation older than the entry's -> StaleResetGenerationError;
        - owner epoch older than the queue's current epoch -> FencedError (the
          lock manager decides; when it knows no epoch for the queue, the epoch
          of the entry's last fenced commit stands in);
        - same owner epoch and generation as the last fenced commit -> the
          offset only moves forward (a smaller one is ignored, returns False),
          unless allow_rewind: an acknowledged commit is the committer's latest
          word (e.g. after seeking back), only late oneway commits are stale;
        - an owner epoch nothing vouches for (no lock on the queue and no fenced
          commit since this broker started) -> forward only as well: after a
          restart a consumer that lost the queue before it may still commit.
        Nothing changes when an error is raised.
        """
        check_entry(group, topic, queue_id)
        check_offset(offset)
        if self._batches.depth:
            return self.commit_checked(group, topic, queue_id, offset, fence, allow_rewind=allow_rewind)
        with self.batch():
            return self.commit_checked(group, topic, queue_id, offset, fence, allow_rewind=allow_rewind)

    def commit_checked(self, group: str, topic: str, queue_id: int, offset: int, fence: Fence | None = None,
                       *, allow_rewind: bool = False) -> bool:
        """`commit` inside a batch, for a caller that checked the names, the queue id and the offset
        (OffsetCommitService's batches); the fence is checked here."""
        key = (topic, group)
        if fence is None or not fence.fenced:
            return self._store(key, queue_id, offset)
        state = self._fence_state(key, queue_id)
        self._check_fence(group, topic, queue_id, fence, state)
        pair = None if fence.owner_epoch is None else (fence.owner_epoch, state.reset_generation)
        # A commit whose owner nothing here can vouch for (no lock on the queue, no fenced commit seen since
        # this start: the broker restarted) may be a stale owner's: it may move the offset forward only.
        unverified = pair is not None and state.last_fenced is None and self._ownership is not None and \
            self._ownership.current_epoch(group, topic, queue_id) is None
        if pair is not None and (state.last_fenced == pair and not allow_rewind or unverified) \
                and offset < self.query(group, topic, queue_id):
            return False
        if pair is not None and state.last_fenced != pair and not unverified:  # an unverified epoch
            self._set_fence_state(key, queue_id, replace(state, last_fenced=pair))  # proves nothing
        return self._store(key, queue_id, offset)

    def check_fence(self, group: str, topic: str, queue_id: int, fence: Fence | None) -> None:
        """What commit() would refuse for its fence (FencedError, StaleResetGenerationError), changing
        nothing: a caller with side effects to make first (a group config) refuses before them."""
        check_entry(group, topic, queue_id)
        if fence is not None and fence.fenced:
            self._check_fence(group, topic, queue_id, fence, self._fence_state((topic, group), queue_id))

    def advance(self, group: str, topic: str, queue_id: int, offset: int) -> bool:
        """Move the committed offset forward to `offset`, never back; True if it moved.

        For groups whose progress the broker tracks itself (pop consumption: the
        smallest offset not yet acknowledged, broker/pop/ledger.py): there is no
        queue owner to fence, and a late call with an older watermark is ignored. The pop journal holds the
        acknowledgements the watermark comes from, so a journal failure keeps the move in memory (for the
        next snapshot) instead of refusing an acknowledgement that happened."""
        check_entry(group, topic, queue_id)
        check_offset(offset)
        if offset <= self.query(group, topic, queue_id):
            return False
        with self.batch(must_journal=False):
            return self._store((topic, group), queue_id, offset)

    def mirror(self, table: Mapping[TableKey, Mapping[int, int]],
               generations: Mapping[TableKey, Mapping[int, int]], *, report_skipped: bool = True) -> int:
        """A replica's copy of its master's table; returns how many entries changed. An entry moves
        forward to the master's offset, never back, so commits the replica took while the master was
        away are not rewound by an older copy; an admin reset on the master (a newer reset generation)
        is taken as it is, backwards too. Fencing was the master's job. Entries the master dropped stay
        until the replica's own cleanup (a deleted group or topic). Entries with names no RPC accepts
        (`invalid_names`) are skipped. The master holds the table, so what the replica's journal cannot
        take stands in memory (the next mirror or snapshot repeats it) rather than failing the mirror."""
        changed = 0
        skipped = invalid_names(table)
        if report_skipped and skipped.keys() != self._mirror_skipped:
            self._mirror_skipped = frozenset(skipped)  # said once per change, not every second
            for key, why in list(skipped.items())[:5]:
                self._log.warning("mirrored offsets of %r skipped: %s", table_key(*key), why,
                                  event="offsets_mirror_skipped", total=len(skipped))
        with self.batch(must_journal=False):
            for key, queues in table.items():
                if key in skipped:
                    continue
                for queue_id, offset in queues.items():
                    generation = generations.get(key, {}).get(queue_id, 0)
                    if generation > self._generations.get(key, {}).get(queue_id, 0):
                        state = self._fence_state(key, queue_id)
                        self._set_fence_state(key, queue_id, replace(state, reset_generation=generation))
                        self._generations.setdefault(key, {})[queue_id] = generation
                        self._store(key, queue_id, offset, journal=False)
                        self._version += 1
                        self._journal_change(JournalRecord(Op.RESET, key[0], key[1], queue_id, offset, generation))
                        changed += 1
                    elif offset > self._offsets.get(key, {}).get(queue_id, -1):
                        changed += self._store(key, queue_id, offset)
        return changed

    def mirror_records(self, records: list[JournalRecord]) -> int:
        """A replica taking its master's journal records as they come (broker/cluster/replication.py), by `mirror`'s
        rules, in order: commits forward only, resets by generation, removals left to its own cleanup."""
        changed = 0
        with self.batch(must_journal=False):
            for r in records:
                if r.op is Op.SET or r.op is Op.RESET:
                    key = (r.topic, r.group)
                    changed += self.mirror({key: {r.queue_id: r.offset}},
                                           {key: {r.queue_id: r.generation}} if r.op is Op.RESET else {},
                                           report_skipped=False)  # the one-second mirror says it, once
        return changed

    def take_back(self, table: Mapping[TableKey, Mapping[int, int]],
                  generations: Mapping[TableKey, Mapping[int, int]]) -> int:
        """A master taking back the commits its replica held while it was away: each entry moves forward
        to the replica's offset, never back, and only when both saw the same reset generation (a reset
        made here meanwhile wins), and never into an entry an admin removed here since this start. Returns
        how many moved. Names are the caller's to check first (`invalid_names`): the table comes from
        another process. StoreError, nothing moved, when the journal cannot take it."""
        moved = 0
        with self.batch():
            for key, queues in table.items():
                for queue_id, offset in queues.items():
                    same_reset = generations.get(key, {}).get(queue_id, 0) == \
                        self._generations.get(key, {}).get(queue_id, 0)
                    if same_reset and key not in self._removed and offset > self._offsets.get(key, {}).get(queue_id, -1):
                        moved += self._store(key, queue_id, offset)
        return moved

    def table(self, *, well_named: bool = False) -> tuple[OffsetTable, OffsetTable]:
        """Copies of the offset table and its reset generations (what a replica mirrors); `well_named`
        leaves out entries with names the master refuses (a replica's hand-back: one would refuse it all)."""
        bad = invalid_names(self._offsets) if well_named else {}
        return ({key: queues.copy() for key, queues in self._offsets.items() if key not in bad},
                {key: queues.copy() for key, queues in self._generations.items() if key not in bad})

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when none (RocketMQ's answer)."""
        queues = self._offsets.get((topic, group))
        if queues is None:
            return -1
        return queues.get(queue_id, -1)

    def reset_generation(self, group: str, topic: str, queue_id: int) -> int:
        """The entry's reset generation; 0 when never reset since the broker started."""
        return self._fence_state((topic, group), queue_id).reset_generation

    def reset(self, group: str, topic: str, queue_id: int, offset: int) -> int:
        """Admin reset: set the offset, start a new generation; return the old offset (-1 if none).

        Commits quoting an older generation are rejected from now on; pulls
        quoting one are answered OFFSET_RESET by the gRPC layer.
        """
        check_entry(group, topic, queue_id)
        check_offset(offset)
        key = (topic, group)
        old = self.query(group, topic, queue_id)
        state = self._fence_state(key, queue_id)
        generation = self._epochs.next()
        with self.batch():
            self._set_fence_state(key, queue_id, replace(state, reset_generation=generation))
            self._generations.setdefault(key, {})[queue_id] = generation
            self._store(key, queue_id, offset, journal=False)
            self._version += 1  # the new generation must reach the file even if the offset is unchanged
            self._journal_change(JournalRecord(Op.RESET, topic, group, queue_id, offset, generation))
        return old

    # -- removal -----------------------------------------------------------

    def remove_group(self, group: str) -> int:
        """Forget every offset of `group` (all its topics, retry topic included).

        Returns the number of queue entries removed.
        """
        return self._remove(
            [k for k in self._offsets if k[1] == group] + [k for k in self._fences if k[1] == group],
            JournalRecord(Op.REMOVE_GROUP, group=group),
        )

    def remove_group_topic(self, group: str, topic: str) -> int:
        """Forget `group`'s offsets (and reset generations) of one topic; return the queue entries removed."""
        return self._remove([(topic, group)], JournalRecord(Op.REMOVE_GROUP_TOPIC, topic=topic, group=group))

    def clean_topic(self, topic: str) -> int:
        """Forget every group's offsets of a deleted topic; return the queue entries removed. The topic is
        gone already, so a journal failure keeps the removal in memory (for the next snapshot)."""
        return self._remove(
            [k for k in self._offsets if k[0] == topic] + [k for k in self._fences if k[0] == topic],
            JournalRecord(Op.CLEAN_TOPIC, topic=topic), must_journal=False,
        )

    def _remove(self, keys: list[TableKey], record: JournalRecord, *, must_journal: bool = True) -> int:
        removed = 0
        generations = False
        with self.batch(must_journal=must_journal):
            for key in keys:
                self._touch(key)
                self._removed.add(key)
                queues = self._offsets.pop(key, None)
                self._fences.pop(key, None)
                generations = self._generations.pop(key, None) is not None or generations
                if queues:
                    removed += len(queues)
            if removed or generations:
                self._version += 1
                self._journal_change(record)
        return removed

    # -- views -------------------------------------------------------------

    def groups_of_topic(self, topic: str) -> list[str]:
        return sorted({g for t, g in self._offsets if t == topic})

    def topics_of_group(self, group: str) -> list[str]:
        return sorted({t for t, g in self._offsets if g == group})

    def groups(self) -> list[str]:
        return sorted({g for _, g in self._offsets})

    def offsets(self, group: str, topic: str) -> dict[int, int]:
        """Committed offsets of one topic for one group, by queue id (ascending)."""
        queues = self._offsets.get((topic, group), {})
        return {q: queues[q] for q in sorted(queues)}

    def lag(self, group: str, topic: str, max_offsets: Mapping[int, int]) -> dict[int, int]:
        """Messages not yet consumed, per queue of `max_offsets` (queue id -> broker max offset).

        A queue with no committed offset counts as committed at 0, i.e. its
        whole content is lag, as RocketMQ's getConsumeStats does. Never
        negative: a commit past the max (possible right after a store
        truncation) shows as 0.
        """
        queues = self._offsets.get((topic, group), {})
        result = {}
        for queue_id in sorted(max_offsets):
            committed = max(queues.get(queue_id, 0), 0)
            result[queue_id] = max(max_offsets[queue_id] - committed, 0)
        return result

    @property
    def dirty(self) -> bool:
        """True when the table changed since the last successful write."""
        return self._version != self._persisted_version

    def entry_count(self) -> int:
        return count_entries(self._offsets)

    # -- persistence ---------------------------------------------------------

    async def persist_if_dirty(self) -> PersistReport | None:
        """Write consumerOffset.json if the table changed since the last write; else None.

        The copy is taken on the event loop; encoding and the fsync'ed write
        run in the default executor so a large table does not stall other
        RPCs. Callers are serialised: a second caller waits, then finds the
        table clean (or writes what changed meanwhile). A commit that lands
        during the write keeps the table dirty for the next round.
        """
        async with self._persist_lock:
            # While the journal fails, a snapshot is written even when nothing changed: one that works
            # proves the disk takes writes again, which ends the failing state.
            if not (self.dirty or self._batches.error is not None) or not self._loaded:
                return None
            started = time.perf_counter()
            snapshot = self._snapshots.take(self._version, self._offsets, self._generations)
            snapshot_s = time.perf_counter() - started
            size, removed = await asyncio.get_running_loop().run_in_executor(None, self._snapshots.write, snapshot)
            self._mark_persisted(snapshot.version)
            self._batches.snapshot_written(snapshot.version)
            return PersistReport(
                time.perf_counter() - started, size, count_entries(snapshot.offsets), snapshot_s, removed
            )

    def persist_now(self) -> PersistReport | None:
        """Write consumerOffset.json synchronously, dirty or not (graceful shutdown).

        None, writing nothing, when the table was never loaded (startup failed).
        """
        if not self._loaded:
            self._log.warning("consumer offsets were never loaded; leaving %s untouched", self._path)
            return None
        started = time.perf_counter()
        snapshot = self._snapshots.take(self._version, self._offsets, self._generations)
        snapshot_s = time.perf_counter() - started
        size, removed = self._snapshots.write(snapshot)
        self._mark_persisted(snapshot.version)
        return PersistReport(
            time.perf_counter() - started, size, count_entries(snapshot.offsets), snapshot_s, removed
        )

    def _mark_persisted(self, version: int) -> None:
        self._persisted_version = max(self._persisted_version, version)

    def close(self) -> None:
        """Release the journal's open segment (shutdown, after the final snapshot)."""
        if self._journal is not None:
            self._journal.close()

    # -- helpers -------------------------------------------------------------

    def _check_fence(self, group: str, topic: str, queue_id: int, fence: Fence, state: FenceState) -> None:
        current = self._ownership.current_epoch(group, topic, queue_id) if self._ownership is not None else None
        check_fence(f"queue {topic}:{queue_id} of group {group!r}", fence, state, current,
                    self.query(group, topic, queue_id))

    def _fence_state(self, key: TableKey, queue_id: int) -> FenceState:
        states = self._fences.get(key)
        if states is None:
            return NO_FENCE_STATE
        return states.get(queue_id, NO_FENCE_STATE)

    def _set_fence_state(self, key: TableKey, queue_id: int, state: FenceState) -> None:
        self._touch(key)
        self._fences.setdefault(key, {})[queue_id] = state

    def _store(self, key: TableKey, queue_id: int, offset: int, *, journal: bool = True) -> bool:
        queues = self._offsets.get(key)
        if queues is not None and queues.get(queue_id) == offset:
            return False
        self._touch(key)
        if queues is None:
            queues = self._offsets[key] = {}
            self._removed.discard(key)
        queues[queue_id] = offset
        self._version += 1
        if journal and self._loaded:  # _journal_change's work, with the record encoded the fast way
            self._batches.add_set(key[0], key[1], queue_id, offset)
        return True
