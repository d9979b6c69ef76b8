"""ProcessQueue: the consumer's cache of pulled but unfinished messages of one queue.

It is RocketMQ's ProcessQueue. The pull side puts every pulled batch in; the
consume side takes messages out as they finish. Its central job is offset
safety: messages of a queue finish out of order under concurrent consumption,
so the offset that may be committed is the smallest offset still unfinished
(RocketMQ's ProcessQueue rule) — never "the last one that finished", which would skip a slow
message if the client died.

Concurrency: a ProcessQueue is confined to the consumer's asyncio event-loop
thread. Listener threads never touch it; their results are handed back to the
loop first. That is why, unlike RocketMQ's, it holds no lock.

One ProcessQueue belongs to one QueueLease (one generation of ownership):
when a queue is reset, seeked or handed over, the next lease starts with a
new, empty ProcessQueue, so nothing of the old generation can leak into it.

This module is pure: no I/O, no grpc.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from tidemark.client.message import MessageExt

__all__ = ["ProcessQueue"]

# Rebuild the heaps when dead entries outnumber live ones by this much; the
# constant keeps tiny caches from rebuilding on every removal.
_COMPACT_SLACK = 64


class ProcessQueue:
    """Pulled-but-unfinished messages of one MessageQueue, keyed by queue offset.

    Concurrent and orderly consumption both use :meth:`put_messages` and
    :meth:`remove_messages`: orderly keeps its order per message group in
    message_groups.py, so RocketMQ 4's per-queue orderly cycle (take, commit,
    consume again) has no place here. Confined to one event-loop thread.
    """

    def __init__(self) -> None:
        # Why a dict plus heaps rather than a sorted container: pulls add in
        # ascending runs and completions remove in any order, while reads only
        # ever need the smallest and largest key. A dict gives O(1) membership
        # and removal; a min-heap and a max-heap with lazy deletion (an entry
        # is live iff its offset is still in the dict) give O(log n) inserts
        # and amortised O(log n) min/max, with no O(n) list shifting and no
        # sort per call. Dead entries are purged when they surface at the top
        # and by a rebuild once they outnumber live ones (_compact).
        self._msgs: dict[int, MessageExt] = {}
        self._min_heap: list[int] = []
        self._max_heap: list[int] = []  # negated offsets
        self._msg_count = 0
        self._msg_size = 0
        self._queue_offset_max = -1
        # The broker's read position: every offset below it was either put here or filtered out by
        # the subscription on the way. An empty cache may commit up to it.
        self._scanned = 0

    # -- state --------------------------------------------------------------

    @property
    def msg_count(self) -> int:
        """Messages held."""
        return self._msg_count

    @property
    def msg_size(self) -> int:
        """Record bytes of the messages held (pull_threshold_size_for_queue): what they cost here."""
        return self._msg_size

    @property
    def queue_offset_max(self) -> int:
        """Largest offset ever put; -1 before the first put."""
        return self._queue_offset_max

    @property
    def next_offset(self) -> int:
        """The offset to commit once everything held is finished: past every put or skipped offset."""
        return max(self._queue_offset_max + 1, self._scanned)

    def min_offset(self) -> int | None:
        """Smallest unfinished offset; None when there is none."""
        return self._peek_min() if self._msgs else None

    def max_span(self) -> int:
        """Largest minus smallest waiting offset; 0 with fewer than two messages.

        The pull side stops pulling when this exceeds consume_concurrently_max_span:
        one stuck message must not let the cache grow without bound behind it.
        """
        if len(self._msgs) < 2:
            return 0
        return self._peek_max() - self._peek_min()

    # -- pull side ----------------------------------------------------------

    def put_messages(self, msgs: Sequence[MessageExt]) -> None:
        """Cache pulled messages by queue offset.

        Offsets already held are ignored, so a re-pulled message is never
        consumed twice.
        """
        for msg in msgs:
            offset = msg.queue_offset
            if offset in self._msgs:
                continue
            self._insert(msg)
            self._msg_count += 1
            self._msg_size += msg.store_size
            if offset > self._queue_offset_max:
                self._queue_offset_max = offset

    def advance_to(self, offset: int) -> None:
        """The broker's read position moved to `offset`: what it skipped below matched no subscription.

        Counts as consumed once everything held before it is finished (RocketMQ's
        correctTagsOffset, which only applies to an empty cache)."""
        if offset > self._scanned:
            self._scanned = offset

    # -- concurrent consumption ---------------------------------------------

    def remove_messages(self, msgs: Sequence[MessageExt]) -> int:
        """Forget finished messages and return the offset now safe to commit.

        RocketMQ's removeMessage: -1 when nothing was cached before
        the call; otherwise the smallest offset still cached, or
        ``next_offset`` (past everything put or skipped) when the cache is now
        empty. Feed the result to an increase-only offset store, skipping -1.
        """
        if not self._msgs:
            return -1
        for msg in msgs:
            removed = self._msgs.pop(msg.queue_offset, None)
            if removed is not None:
                self._msg_count -= 1
                self._msg_size -= removed.store_size
        if not self._msgs:
            # Everything pulled has finished: drop the dead heap entries now
            # rather than carry them until the next rebuild.
            self._min_heap.clear()
            self._max_heap.clear()
            return self.next_offset
        self._compact()
        return self._peek_min()

    def __repr__(self) -> str:
        return (
            f"ProcessQueue(msg_count={self._msg_count}, msg_size={self._msg_size}, "
            f"min_offset={self.min_offset()}, queue_offset_max={self._queue_offset_max}, "
            f"scanned={self._scanned})"
        )

    # -- heap bookkeeping ---------------------------------------------------

    def _insert(self, msg: MessageExt) -> None:
        self._msgs[msg.queue_offset] = msg
        heapq.heappush(self._min_heap, msg.queue_offset)
        heapq.heappush(self._max_heap, -msg.queue_offset)

    def _peek_min(self) -> int:
        heap = self._min_heap
        while heap[0] not in self._msgs:
            heapq.heappop(heap)
        return heap[0]

    def _pop_min(self) -> int:
        heap = self._min_heap
        while True:
            offset = heapq.heappop(heap)
            if offset in self._msgs:
                return offset

    def _peek_max(self) -> int:
        heap = self._max_heap
        while -heap[0] not in self._msgs:
            heapq.heappop(heap)
        return -heap[0]

    def _compact(self) -> None:
        # Entries removed from the middle stay in the heaps until they reach
        # the top; without a rebuild a long-stuck smallest message would let
        # them pile up. Rebuilding once dead entries exceed live ones keeps
        # memory O(live) at amortised O(1) per removal.
        live = len(self._msgs)
        limit = 2 * live + _COMPACT_SLACK
        if len(self._min_heap) > limit:
            self._min_heap = list(self._msgs)
            heapq.heapify(self._min_heap)
        if len(self._max_heap) > limit:
            self._max_heap = [-offset for offset in self._msgs]
            heapq.heapify(self._max_heap)
