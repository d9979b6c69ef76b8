"""The store checkpoint and the abort marker (RocketMQ's StoreCheckpoint and abort file).

`checkpoint` holds the commit-log offset up to which both the commit log and
the consume queues were fsynced: recovery rescans the commit log from there
only. It also carries deleted-topic tombstones: a topic deleted at commit-log
offset X must not get its older records re-dispatched by a recovery that scans
from below X. A tombstone is dropped once the checkpoint passes X, because no
scan starts below the checkpoint any more.

The file is small JSON, replaced atomically:

    {"version": 1, "commit_log_offset": 123456, "deleted_topics": {"t": 120000}}
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from tidemark.common.fsutil import atomic_write, fsync_dir
from tidemark.common.logs import get_logger

log = get_logger("tidemark.broker.store")

CHECKPOINT_FILE_NAME = "checkpoint"
ABORT_FILE_NAME = "abort"
_VERSION = 1


class StoreCheckpoint:
    """Thread-safe: the flush thread writes it while the loop thread adds tombstones."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._offset: int | None = None
        self._tombstones: dict[str, int] = {}

    @property
    def offset(self) -> int | None:
        return self._offset

    def tombstones(self) -> dict[str, int]:
        with self._lock:
            return dict(self._tombstones)

    def load(self) -> int | None:
        """Read the file; None when missing or unusable (recovery then scans everything)."""
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            doc = json.loads(raw)
            offset = doc["commit_log_offset"]
            tombstones = doc.get("deleted_topics", {})
            if type(offset) is not int or offset < 0:
                raise ValueError(f"commit_log_offset {offset!r} is not a non-negative integer")
            if not all(type(k) is str and type(v) is int for k, v in tombstones.items()):
                raise ValueError("deleted_topics must map topic names to offsets")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error(
                "store checkpoint %s is unusable (%s); recovery will scan the whole commit log",
                self._path,
                exc,
            )
            return None
        with self._lock:
            self._offset = offset
            self._tombstones = dict(tombstones)
        return offset

    def write(self, offset: int, *, allow_backwards: bool = False) -> bool:
        """Record that everything below `offset` is durable; returns whether the file changed.

        Offsets only move forward except after recovery truncated the commit
        log (allow_backwards). Runs in the flush thread or at load.
        """
        with self._lock:
            if self._offset is not None and not allow_backwards and offset < self._offset:
                return False
            if offset == self._offset and not any(at <= offset for at in self._tombstones.values()):
                return False
            self._tombstones = {t: at for t, at in self._tombstones.items() if at > offset}
            self._write_locked(offset)
            return True

    def add_tombstone(self, topic: str, at_offset: int) -> None:
        """Durably note that `topic`'s records below `at_offset` belong to a deleted incarnation."""
        with self._lock:
            self._tombstones[topic] = max(at_offset, self._tombstones.get(topic, 0))
            self._write_locked(self._offset or 0)

    def _write_locked(self, offset: int) -> None:
        doc = {"version": _VERSION, "commit_log_offset": offset, "deleted_topics": self._tombstones}
        atomic_write(self._path, json.dumps(doc, sort_keys=True).encode("utf-8"))
        self._offset = offset


class AbortFile:
    """Present while a store is open; a clean shutdown removes it."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def exists(self) -> bool:
        return self._path.exists()

    def create(self) -> None:
        self._path.touch()
        fsync_dir(self._path.parent)

    def remove(self) -> None:
        self._path.unlink(missing_ok=True)
        fsync_dir(self._path.parent)
