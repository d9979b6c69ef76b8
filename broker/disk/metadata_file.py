"""Loading and saving the broker's small JSON config files (topics.json, subscriptionGroup.json).

Writes are atomic with the previous file kept as `.bak`, and run in a worker
thread (MetadataFile); a load falls back to the `.bak` when the main file is
missing, empty or not valid JSON, and refuses (ConfigFileError) when a present
file is unreadable and no good backup exists.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tidemark.broker.errors import ConfigFileError, StoreError
from tidemark.broker.store.writability import describe
from tidemark.common.fsutil import atomic_write, backup_path
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.config")


def _read(path: Path) -> tuple[dict[str, Any] | None, str]:
    """Parse a JSON object from path; (None, reason) when it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None, "missing"
    except OSError as e:
        return None, f"unreadable ({e.strerror})"
    if not text.strip():
        return None, "empty"
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at line {e.lineno})"
    if not isinstance(doc, dict):
        return None, "not a JSON object"
    return doc, "ok"


def load_json(path: Path, logger: logging.Logger | Any) -> dict[str, Any] | None:
    """The file's JSON object, its backup's, or None on a first start (neither exists)."""
    logger = get_logger(logger)
    doc, why = _read(path)
    if doc is not None:
        logger.info("config file loaded", event="config_load", file=path, source="json")
        return doc
    bak = backup_path(path)
    bak_doc, bak_why = _read(bak)
    if bak_doc is not None:
        logger.warning("config file fell back to backup", event="config_load", file=path, source="bak", reason=why)
        return bak_doc
    if why == "missing" and bak_why == "missing":
        return None
    raise ConfigFileError(f"{path} is {why} and its backup {bak.name} is {bak_why}; "
                          "refusing to start with an empty configuration")


def save_json(path: Path, doc: dict[str, Any], *, mode: int | None = None) -> None:
    atomic_write(path, json.dumps(doc, indent=4, sort_keys=True).encode("utf-8"), keep_backup=True, mode=mode)


class MetadataFile:
    """One config file whose writes happen in a worker thread, never on the event loop.

    The owner calls `changed(undo)` after each in-memory change; a writer task
    then renders the current document on the loop (a cheap snapshot) and writes
    it atomically in a thread, again until nothing changed meanwhile: a burst
    of changes costs one or two writes. `flush()` waits until every change made
    so far is on disk; request handlers await it before they answer, so an
    acknowledged change is durable. Without a running loop (load, tests of the
    managers alone) changes are written at once.

    When a write fails (a full disk) `flush()` raises StoreError (UNAVAILABLE:
    "disk full: ... retry later") and first rolls back, through the `undo`
    callables, every change not yet written: the caller was told its change
    did not happen, so it must not be visible either. Each flush gets a fresh
    write attempt, and `retry()` (a broker timer) rewrites a file left dirty,
    so nothing latches. `on_state(ok, reason)` and one log line mark each
    change between writable and failing, not each failed attempt.
    """

    def __init__(self, path: Path, render: Callable[[], dict[str, Any]], *, mode: int | None = None) -> None:
        self.path = path
        self._render = render
        self._mode = mode  # file permissions, for files holding secrets (users.json: 0o600)
        self._version = 0
        self._written = 0
        self._writer: asyncio.Task | None = None
        self._written_event: asyncio.Event | None = None
        self._failure: OSError | None = None
        self._undo: list[tuple[int, Callable[[], None]]] = []  # (version, undo) of unwritten changes
        # Versions (low, high] each rollback undid, newest last: a flush whose change is in one fails.
        self._undone: list[tuple[int, int]] = []
        self.on_state: Callable[[bool, str], None] | None = None

    @property
    def dirty(self) -> bool:
        return self._written != self._version

    @property
    def failing(self) -> bool:
        """Whether the last write attempt failed."""
        return self._failure is not None

    def changed(self, undo: Callable[[], None] | None = None) -> None:
        self._version += 1
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._save(self._render())
            self._written = self._version
            return
        if undo is not None:
            self._undo.append((self._version, undo))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write(), name=f"write:{self.path.name}")

    def retry(self) -> None:
        """Start a write if the file is behind or the last write failed, and none is under way (a timer
        calls this: a failing file is rewritten until a write works, which ends the failing state)."""
        if (self.dirty or self.failing) and (self._writer is None or self._writer.done()):
            self._writer = asyncio.get_running_loop().create_task(self._write(), name=f"write:{self.path.name}")

    async def _write(self) -> None:
        while self.dirty or self._failure is not None:
            version, doc = self._version, self._render()
            try:
                await asyncio.to_thread(self._save, doc)
            except OSError as e:
                self._set_failure(e)
                self._signal()
                return
            self._set_failure(None)
            self._written = version
            self._undo = [(v, undo) for v, undo in self._undo if v > version]
            self._signal()

    def _save(self, doc: dict[str, Any]) -> None:
        if self._mode is None:
            save_json(self.path, doc)
        else:
            save_json(self.path, doc, mode=self._mode)

    def _set_failure(self, error: OSError | None) -> None:
        was_failing, self._failure = self._failure is not None, error
        if (error is not None) == was_failing:
            return
        reason = describe(error) if error is not None else ""
        if error is not None:
            log.error("config file cannot be written: %s; changes are refused until it can", reason,
                      event="config_write_failed", file=self.path, error=error)
        else:
            log.info("config file written again", event="config_write_recovered", file=self.path)
        if self.on_state is not None:
            self.on_state(error is None, reason)

    def _signal(self) -> None:
        if self._written_event is not None:
            self._written_event.set()
            self._written_event = None

    async def flush(self) -> None:
        """Wait until every change so far is written; StoreError if the write failed and the changes
        were rolled back, whichever caller's flush did the rollback."""
        target = self._version
        attempted = False
        while True:
            if any(low < target <= high for low, high in self._undone):
                raise StoreError(f"{describe(self._failure or OSError('write failed'))}: cannot write "
                                 f"{self.path.name}; the change was not applied, retry later")
            if self._written >= target:
                return
            if self._writer is None or self._writer.done():
                if attempted and self._failure is not None:
                    self._roll_back()
                    continue
                self._writer = asyncio.get_running_loop().create_task(self._write())
            attempted = True
            if self._written_event is None:
                self._written_event = asyncio.Event()
            await self._written_event.wait()

    def _roll_back(self) -> None:
        """Undo the unwritten changes, newest first.

        When every one of them had an undo, memory is back to the last written
        document and the file is clean again; a dirty file would make every
        later request (reads included: the rpc layer flushes after each) fail
        while the disk stays full. Known gap: a write that failed after its
        rename (fsync of the directory) did put the change on disk.
        """
        undo, self._undo = self._undo, []
        for _version, fn in reversed(undo):
            fn()
        self._undone = [*self._undone[-15:], (self._written, self._version)]
        complete = len(undo) == self._version - self._written
        # A new version: requests after the rollback (reads flush too) are not among the undone ones.
        self._version += 1
        if complete:
            self._written = self._version  # memory is the written document again
        # else something had no undo: memory differs from the file, and the next write puts it there
