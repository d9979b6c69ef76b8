"""What a pop group has in flight, per queue: the numbers `tidemark group describe/progress` show.

A queue's deliveries under way (received, not yet acked) tell a slow consumer from a stuck one: a slow
consumer holds first deliveries within their invisible time; a stuck one lets them pass their invisible
time unacknowledged, so they come back (FIFO: in place; otherwise through the group's pop retry topic,
whose queues are rows of their own) with a higher attempt, again and again.

Pure: reads the ledger, no clock (now_ms is an argument), no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tidemark.broker.pop.handles import QueueKey
from tidemark.broker.pop.ledger import PopLedger

__all__ = ["QueueInflight", "summarize"]


@dataclass(frozen=True, slots=True)
class QueueInflight:
    """One queue of a pop group (its topic, or the group's pop retry topic for that topic)."""

    topic: str
    queue_id: int
    inflight: int  # received and not yet acked (nor revived, nor back to pending)
    oldest_received_ms: int  # when the longest-held of them was handed out (0: none, or unknown)
    earliest_invisible_until_ms: int  # the first of them to become visible again (0: none)
    latest_invisible_until_ms: int  # the last (0: none)
    redelivered: int  # of them, on their second or later delivery
    max_attempt: int  # the highest delivery attempt among them (0: none)
    overdue: int  # of them, past their invisible time at now_ms (the revive scan has yet to move them)
    pending_redelivery: int  # FIFO: expired ones waiting to be handed out again in place
    waiting: int  # not yet received: stored after the cursor (filters not applied), or FIFO messages held
    # back behind an unfinished message of their message group


def summarize(ledger: PopLedger, keys: Iterable[QueueKey], now_ms: int,
              end_offset: Callable[[str, int], int]) -> list[QueueInflight]:
    """A row per queue key, sorted by topic and queue id; end_offset(topic, queue id) is where readers see
    the queue end. O(entries in flight) of those queues."""
    rows = []
    for key in sorted(keys, key=lambda k: (k.topic, k.queue_id)):
        entries = list(ledger.inflight(key).values())
        pending = ledger.pending(key)
        held = sum(1 for p in pending if p.held)
        deadlines = [e.deadline_ms for e in entries]
        received = [e.received_ms for e in entries if e.received_ms > 0]
        rows.append(QueueInflight(
            topic=key.topic, queue_id=key.queue_id, inflight=len(entries),
            oldest_received_ms=min(received, default=0),
            earliest_invisible_until_ms=min(deadlines, default=0),
            latest_invisible_until_ms=max(deadlines, default=0),
            redelivered=sum(1 for e in entries if e.attempt > 1),
            max_attempt=max((e.attempt for e in entries), default=0),
            overdue=sum(1 for d in deadlines if d <= now_ms),
            pending_redelivery=len(pending) - held,
            waiting=held + max(0, end_offset(key.topic, key.queue_id) - ledger.cursor(key))))
    return rows
