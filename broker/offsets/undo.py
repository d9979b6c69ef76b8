"""BatchUndo: how to put back the entries one batch of offset-table changes touched.

ConsumerOffsetManager journals a batch's changes in one write when the batch
ends; when the journal cannot take that write, the batch is refused and must
leave no trace (manager.py). Rather than plan every change ahead, the manager
applies changes as they come and, before it first changes an entry, keeps a
copy of it here: the entry's queue offsets, fence states, reset generations,
and whether an admin had removed it. Undoing puts those copies back in place of
whatever the batch left. Entries are small (one dict per topic@group), so a
batch of 500 commits copies at most 500 small dicts. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TableKey = tuple[str, str]  # (topic, group), as in persistence.py


@dataclass(frozen=True, slots=True)
class _Entry:
    """An entry as it was before the batch first changed it (copies; None: absent)."""

    tables: tuple[dict | None, ...]
    removed: bool


class BatchUndo:
    """The state, before the batch, of every entry it changed; `restore` puts it back."""

    def __init__(self, tables: tuple[dict[TableKey, dict[int, Any]], ...], removed: set[TableKey]) -> None:
        self._tables = tables  # the manager's maps keyed by entry: offsets, fence states, generations
        self._removed = removed
        self._before: dict[TableKey, _Entry] = {}

    def keep(self, key: TableKey) -> None:
        """Call before every change of an entry; only the first call of a batch copies it."""
        if key not in self._before:
            self._before[key] = _Entry(tuple(None if (queues := t.get(key)) is None else dict(queues)
                                             for t in self._tables), key in self._removed)

    def restore(self) -> None:
        for key, was in self._before.items():
            for table, queues in zip(self._tables, was.tables, strict=True):
                if queues is None:
                    table.pop(key, None)
                else:
                    table[key] = queues
            if was.removed:
                self._removed.add(key)
            else:
                self._removed.discard(key)
