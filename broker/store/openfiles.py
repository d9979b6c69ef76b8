"""OpenFiles: a bound on how many store files hold an open fd at once (least recently used first out).

Why: there is a consume-queue file per (topic, queue id). Keeping every fd
open meant 2,000 topics of 8 queues held 16,000 fds, and a broker under the
common `ulimit -n 1024` did not start. Consume-queue handles now open their fd
on demand, and one cache shared by the store closes the least recently used fd
*before* another is opened, so the count never exceeds `capacity`.

What an eviction keeps: the FileHandle itself (path, start, size, capacity)
stays in its queue, so max_offset, sizes and retention never need an fd; only
the fd is closed, and the next read or write reopens it.

What an eviction must not lose: durability. A handle written since its last
fsync stays in the DirtySet whether or not its fd is open, and
`FileHandle.fsync` reopens the path when the fd is gone: on Linux, fsync
flushes the inode's dirty pages whichever fd wrote them, so the flush job
still covers those bytes before the checkpoint (or a sync put) counts on them.

Threading: the cache is used on the event-loop thread only (reads, appends,
recovery all run there). The flush thread never takes an fd from it: it
fsyncs a dup taken under the handle's lock, or an fd it opened itself, and an
eviction closes under that same lock, so an eviction never closes an fd the
flush thread is using. That fd is the one the process may hold beyond
`capacity`: a single flush thread fsyncs one file at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

# Consume-queue fds a broker keeps open by default: half of the common 1024 limit,
# leaving the rest to commit-log segments, sockets and config files.
DEFAULT_MAX_OPEN_FILES = 512


class Releasable(Protocol):
    def release_fd(self) -> None:
        """Close the fd; the owner reopens it on its next use."""


class OpenFiles:
    """The handles that currently hold an fd, least recently used first; at most `capacity`."""

    def __init__(self, capacity: int = DEFAULT_MAX_OPEN_FILES) -> None:
        if capacity < 1:
            raise ValueError(f"an open-file cache needs room for at least one file, got {capacity}")
        self.capacity = capacity
        self.evictions = 0  # fds closed to make room (for tests and benchmarks)
        self._lru: OrderedDict[Releasable, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, handle: object) -> bool:
        return handle in self._lru

    def touch(self, handle: Releasable) -> None:
        """An open handle was used: it becomes the most recently used."""
        self._lru.move_to_end(handle)

    def admit(self, handle: Releasable) -> None:
        """Make room for a handle about to open its fd, and count it as open.

        Called before the open, so that the fds held never exceed capacity even
        for a moment; if the open then fails the caller must `forget` it.
        """
        lru = self._lru
        while len(lru) >= self.capacity:
            victim, _ = lru.popitem(last=False)
            victim.release_fd()
            self.evictions += 1
        lru[handle] = None

    def forget(self, handle: Releasable) -> None:
        """The handle closed its fd (or never managed to open it)."""
        self._lru.pop(handle, None)
