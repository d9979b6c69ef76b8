"""The master's tables that go to its replicas whole, on the replication stream, whenever they change: the
queue lock table and the topic and subscription-group configs (broker/cluster/replication.py).

Each table has a version that moves with every change and the chunk fields that carry it. The stream puts
a table in its next chunk when the version differs from the one it last sent (the first chunk carries every
table), and a replica that answers that chunk holds the table as of that version (_Replica.answered_chunk).
A grant of a queue lock, and an admin change of a topic or group, is answered once the replicas it waits
for acknowledged the version it made (ReplicationSource.wait_table_replicated): a replica promoted afterwards
holds it. Before, a replica copied these tables once a second with the master's metadata, so a promotion
within that second lost what the master had answered (a queue granted to another member while the holder
went on; a topic created without messages gone).

Pure bookkeeping: the streams and the waits live in ReplicationSource.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tidemark.broker.cluster.replica_progress import _Replica

LOCKS = "locks"
CONFIG = "config"


@dataclass(frozen=True, slots=True)
class _Table:
    version: Callable[[], int]
    fields: Callable[[], dict[str, bytes]]  # the chunk's fields that carry it whole


class ReplicatedTables:
    def __init__(self) -> None:
        self._tables: dict[str, _Table] = {}

    def add(self, name: str, version: Callable[[], int], fields: Callable[[], dict[str, bytes]]) -> None:
        self._tables[name] = _Table(version, fields)

    def versions(self) -> dict[str, int]:
        return {name: table.version() for name, table in self._tables.items()}

    def version(self, name: str) -> int | None:
        """The table's version now; None when this master does not send it."""
        table = self._tables.get(name)
        return None if table is None else table.version()

    def due(self, replica: _Replica) -> dict[str, bytes]:
        """The fields of the tables that changed since the stream last sent them, for the chunk about to go."""
        out: dict[str, bytes] = {}
        for name, table in self._tables.items():
            version = table.version()
            if replica.tables_sent.get(name) != version:
                replica.sending(name, version)
                out.update(table.fields())
        return out

    def held_by(self, replica: _Replica) -> bool:
        """Whether the replica acknowledged every table as it is now."""
        return all(replica.table_acked(name) >= table.version() for name, table in self._tables.items())


__all__ = ["CONFIG", "LOCKS", "ReplicatedTables"]
