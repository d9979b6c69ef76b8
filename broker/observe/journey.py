"""DeliveryLog: the broker's record of which group's client was handed which offsets of a queue, and when:
the "delivered" steps of a message's journey (tidemark message trace, the console's message page).

Everything else a journey shows the broker keeps anyway (the stored message, its retry and dead-letter
copies, the groups' committed offsets); a delivery leaves nothing behind, so it is written down here as it
happens: one entry per queue part of a fetch frame or per unary pull, not per message, in memory, the last
RECENT entries of each queue. A message delivered longer ago than that has no delivered step (its
consumed step still shows), and a restart forgets them all.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

# Entries kept per queue: a queue read by a few groups keeps their last dozens of reads.
RECENT = 64


@dataclass(frozen=True, slots=True)
class Delivery:
    """Offsets [first_offset, next_offset) of a queue handed to a group's client at delivered_ms (a
    record there may have been skipped by a filter)."""

    group: str
    client_id: str
    delivered_ms: int
    first_offset: int
    next_offset: int


class DeliveryLog:
    def __init__(self, recent: int = RECENT) -> None:
        self._recent = recent
        self._queues: dict[tuple[str, int], collections.deque[Delivery]] = {}

    def record(self, topic: str, queue_id: int, group: str, client_id: str, first_offset: int, next_offset: int,
               at_ms: int) -> None:
        """A read of a group (group-less reads are not deliveries) that handed out records."""
        if not group or first_offset < 0 or next_offset <= first_offset:
            return
        entries = self._queues.get((topic, queue_id))
        if entries is None:
            entries = self._queues[(topic, queue_id)] = collections.deque(maxlen=self._recent)
        entries.append(Delivery(group, client_id, at_ms, first_offset, next_offset))

    def of(self, topic: str, queue_id: int, offset: int) -> list[Delivery]:
        """The recorded deliveries that covered `offset`, oldest first."""
        entries = self._queues.get((topic, queue_id), ())
        return [d for d in entries if d.first_offset <= offset < d.next_offset]
