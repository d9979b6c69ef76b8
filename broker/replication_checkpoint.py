"""The replicated end a master last knew, kept across restarts (Kafka's replication-offset-checkpoint).

A master's readers see only what its replicas acknowledged (`ReplicationSource.confirmed`, broker/
replication.py). Held in memory only, that bound was gone after a restart: until a replica connected
again, readers of a sync master saw records no replica had (a send whose outcome was unknown), and a
fenced old master, restarted, served its own tail at positions where the new master holds other
messages. The bound is written here once a second when it moved, and read back at start.

The file may lag the bound by up to a second: after a restart, a few acknowledged records can wait for
a replica's acknowledgement before readers see them again, never the other way round.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

from tidemark.broker.config_file import load_json
from tidemark.broker.errors import ConfigFileError
from tidemark.fsutil import atomic_write
from tidemark.logs import get_logger

if TYPE_CHECKING:
    from tidemark.broker.replication import ReplicationSource

log = get_logger("tidemark.broker.replication")

CHECKPOINT_FILE_NAME = "replicationCheckpoint.json"


def load_confirmed(config_dir: Path) -> int | None:
    """The replicated end last written, None without one; ConfigFileError when the file is not a
    checkpoint (starting without the bound could show readers what no replica has)."""
    path = Path(config_dir) / CHECKPOINT_FILE_NAME
    doc = load_json(path, log)
    if doc is None:
        return None
    confirmed = doc.get("confirmed")
    if not isinstance(confirmed, int) or isinstance(confirmed, bool) or confirmed < 0:
        raise ConfigFileError(f"{path} holds no replicated end (confirmed, an integer >= 0); repair or remove it")
    return confirmed


def save_confirmed(config_dir: Path, confirmed: int) -> None:
    """Write it durably (OSError when it cannot be)."""
    atomic_write(Path(config_dir) / CHECKPOINT_FILE_NAME, json.dumps({"confirmed": confirmed}).encode())


class ReplicationCheckpoint:
    """A master's checkpoint: restored into its ReplicationSource at start, written when the bound moved
    (the controller's once-a-second job)."""

    def __init__(self, config_dir: Path, source: ReplicationSource) -> None:
        self._config_dir = Path(config_dir)
        self._source = source
        self._written: int | None = None

    def restore(self) -> None:
        """ConfigFileError (from load_confirmed) when the file is not a checkpoint."""
        confirmed = load_confirmed(self._config_dir)
        if confirmed is not None:
            self._source.restore(confirmed)
            self._written = confirmed

    async def save_if_moved(self) -> None:
        confirmed = self._source.confirmed
        if confirmed is None or confirmed == self._written:
            return
        try:
            await asyncio.to_thread(save_confirmed, self._config_dir, confirmed)
        except OSError as e:  # the next tick tries again; the store's health reports a failing disk
            log.warning("replication checkpoint not written: %s", e, event="replication_checkpoint_failed")
            return
        self._written = confirmed
