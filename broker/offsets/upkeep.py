"""OffsetUpkeep: the offset table's 5 s snapshot timer and its final snapshot, with their failures told.

A snapshot that cannot be written (a full disk) keeps the table dirty, so the
next tick writes it again; the failure is logged once when it starts and once
when it ends, and in between the broker's health shows CONSUMER_OFFSETS as
failing, as it does while the offset journal cannot be written (either
reason, or both, named). The final snapshot at shutdown releases the
journal's open segment after it: what the snapshot could not take stays in
the journal for the next start to replay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tidemark.broker.observe.health import CONSUMER_OFFSETS, PersistenceHealth
from tidemark.broker.offsets.manager import ConsumerOffsetManager
from tidemark.broker.offsets.snapshots import PersistReport
from tidemark.broker.store.writability import describe
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.controller")


class OffsetUpkeep:
    def __init__(self, offsets: ConsumerOffsetManager, health: PersistenceHealth, *, interval_s: float,
                 written: Callable[[PersistReport], None]) -> None:
        self._offsets = offsets
        self._health = health
        self._interval_s = interval_s
        self._written = written  # (report) -> None: the metrics of a snapshot written
        self._snapshot_error: str | None = None
        offsets.on_journal_state = lambda _error: self._report()

    async def tick(self) -> None:
        """The timer's job: a snapshot if the table changed (or the journal fails: one that works ends it)."""
        try:
            report = await self._offsets.persist_if_dirty()
        except Exception as e:
            if self._snapshot_error is None:
                log.error("consumer offsets cannot be persisted: %s; retrying every %.0f s", describe(e),
                          self._interval_s, event="offsets_persist_failed", error=e)
            self._snapshot_error = describe(e)
            self._report()
            return
        if self._snapshot_error is not None:
            log.info("consumer offsets persisted again", event="offsets_persist_recovered")
            self._snapshot_error = None
            self._report()
        if report is not None:
            self._written(report)
            log.debug("consumer offsets persisted",
                      event="offsets_persisted", entries=report.entries, bytes=report.size_bytes,
                      duration_s=report.duration_s)

    async def final(self) -> None:
        """Shutdown: one snapshot, dirty or not, in a worker thread; then the journal's segment is closed."""
        try:
            report = await asyncio.to_thread(self._offsets.persist_now)
        finally:
            self._offsets.close()
        if report is not None:
            log.info("consumer offsets flushed",
                     event="offsets_flushed", entries=report.entries, bytes=report.size_bytes,
                     duration_s=round(report.duration_s, 4))

    def _report(self) -> None:
        reasons = [r for r in (self._snapshot_error, self._offsets.journal_error) if r]
        if reasons:
            self._health.failing(CONSUMER_OFFSETS, "; ".join(reasons))
        else:
            self._health.ok(CONSUMER_OFFSETS)
