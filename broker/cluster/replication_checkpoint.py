"""The replicated end a master last knew, kept across restarts (Kafka's replication-offset-checkpoint).

A master's readers see only what its replicas acknowledged (`ReplicationSource.confirmed`, broker/
replication.py). Held in memory only, that bound was gone after a restart: until a replica connected
again, readers of a sync master saw records no replica had (a send whose outcome was unknown), and a
fenced old master, restarted, served its own tail at positions where the new master holds other
messages. The bound is written here once a second when it moved, and read back at start.

The file may lag the bound by up to a second (it is written again at a clean stop): after a crash, a
few acknowledged records can wait for a replica's acknowledgement before readers see them again. It
may also be ahead of the log when the crash lost the log's unflushed tail (flush async): the bound is
then the log's end, as Kafka takes min(checkpoint, log end), and the log says that acknowledged
records were lost here (a replica may still hold them: promote it rather than let it be cut back).
The file carries the epoch it was written in; a broker that was master, became a replica and was
promoted again ignores what its earlier life wrote.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tidemark.broker.disk.metadata_file import load_json
from tidemark.broker.errors import ConfigFileError
from tidemark.common.fsutil import atomic_write
from tidemark.common.logs import get_logger

if TYPE_CHECKING:
    from tidemark.broker.cluster.replication import ReplicationSource

log = get_logger("tidemark.broker.cluster.replication")

CHECKPOINT_FILE_NAME = "replicationCheckpoint.json"


def load_confirmed(config_dir: Path) -> tuple[int, int] | None:
    """(replicated end, epoch) last written, None without a file; ConfigFileError when the file is not a
    checkpoint (starting without the bound could show readers what no replica has)."""
    path = Path(config_dir) / CHECKPOINT_FILE_NAME
    doc = load_json(path, log)
    if doc is None:
        return None
    confirmed, epoch = doc.get("confirmed"), doc.get("epoch")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (confirmed, epoch)):
        raise ConfigFileError(f"{path} holds no replicated end (confirmed and epoch, integers >= 0); repair or "
                              f"remove it")
    return confirmed, epoch


def save_confirmed(config_dir: Path, confirmed: int, epoch: int) -> None:
    """Write it durably (OSError when it cannot be)."""
    atomic_write(Path(config_dir) / CHECKPOINT_FILE_NAME,
                 json.dumps({"confirmed": confirmed, "epoch": epoch}).encode())


class ReplicationCheckpoint:
    """A master's checkpoint: restored into its ReplicationSource at start, written when the bound moved
    (the controller's once-a-second job, and its stop)."""

    def __init__(self, config_dir: Path, source: ReplicationSource, epoch: Callable[[], int]) -> None:
        self._config_dir = Path(config_dir)
        self._source = source
        self._epoch = epoch
        self._written: tuple[int, int] | None = None

    def restore(self, log_end: int) -> None:
        """At start, with the log recovered to `log_end` (ConfigFileError when the file is not a
        checkpoint)."""
        found = load_confirmed(self._config_dir)
        if found is None:
            return
        confirmed, epoch = found
        if epoch != self._epoch():
            log.info("replication checkpoint of epoch %d ignored (this master's epoch is %d)", epoch, self._epoch(),
                     event="replication_checkpoint_stale")
            return
        if confirmed > log_end:
            log.error("the replicas acknowledged up to %d and this log ends at %d: acknowledged records were "
                      "lost here (an unflushed tail); a replica may hold them", confirmed, log_end,
                      event="replication_checkpoint_ahead_of_log", confirmed=confirmed, log_end=log_end)
            confirmed = log_end
        self._source.restore(confirmed)

    async def save_if_moved(self) -> None:
        confirmed = self._source.confirmed
        if confirmed is None or (confirmed, self._epoch()) == self._written:
            return
        try:
            await asyncio.to_thread(save_confirmed, self._config_dir, confirmed, self._epoch())
        except OSError as e:  # the next tick tries again; the store's health reports a failing disk
            log.warning("replication checkpoint not written: %s", e, event="replication_checkpoint_failed")
            return
        self._written = (confirmed, self._epoch())
