"""OwnedQueue: a queue this consumer works on, and the one place its state changes.

    ASSIGNED -> LOCKING -> PULLING -> DRAINING -> RELEASED
                   \\________\\____________________-> LOST

ASSIGNED: rebalance gave us the queue. LOCKING: waiting for the broker lock
(zero-duplicate handover; skipped in RocketMQ-style mode). PULLING: lock held,
start offset read, a lease fetching and consuming. DRAINING: the queue moves
away; no new batches start, running ones finish, then the offset is committed.
RELEASED: committed and unlocked. LOST: ownership was taken away (lock expired
and fenced, or the broker refused a commit); nothing more is committed.

The queue's current QueueLease follows the state: it is created on entering
PULLING (and replaced, within PULLING, by a seek or reset), drains with the
queue, and ends when the queue is released or lost. Its LockHold (lock_hold.py)
says how long this client may still count on the broker lock; the leases of
the queue share it, and whoever waits on it is woken when the queue leaves.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from tidemark.client.consumer.lease import QueueLease
from tidemark.client.consumer.lock_hold import LockHold
from tidemark.client.errors import TidemarkError
from tidemark.client.message import MessageQueue


class QueueState(enum.Enum):
    ASSIGNED = "ASSIGNED"
    LOCKING = "LOCKING"
    PULLING = "PULLING"
    DRAINING = "DRAINING"
    RELEASED = "RELEASED"
    LOST = "LOST"


_ALLOWED = {
    QueueState.ASSIGNED: {QueueState.LOCKING, QueueState.PULLING, QueueState.RELEASED},
    QueueState.LOCKING: {QueueState.PULLING, QueueState.RELEASED, QueueState.LOST},
    QueueState.PULLING: {QueueState.DRAINING, QueueState.LOST},
    QueueState.DRAINING: {QueueState.RELEASED, QueueState.LOST},
    QueueState.RELEASED: set(),
    QueueState.LOST: set(),
}


class IllegalTransition(TidemarkError, RuntimeError):
    """A queue state change the state machine does not allow (a bug in the consumer, not in the caller)."""


@dataclass(eq=False)
class OwnedQueue:
    mq: MessageQueue
    state: QueueState = QueueState.ASSIGNED
    owner_epoch: int | None = None
    # The broker's name for the lock grant held (0: none, or a broker that does not name grants).
    lock_token: int = 0
    # The lock grant's view of the group's progress: (committed offset, reset generation).
    granted_at: tuple[int, int] | None = None
    lease: QueueLease | None = None
    hold: LockHold = field(default_factory=LockHold)
    # DRAINING -> RELEASED runs as its own task, so cancelling whoever started it cannot skip the
    # final commit and unlock.
    release_task: asyncio.Task | None = None
    # DRAINING past the drain timeout: an orderly listener call still runs, and the queue stays locked
    # (and renewed) until it returns; the release goes on without holding up the rebalance that began it.
    kept: bool = False

    def transition(self, to: QueueState) -> None:
        if to not in _ALLOWED[self.state]:
            raise IllegalTransition(f"{self.mq}: {self.state.value} -> {to.value} is not allowed")
        self.state = to
        if to in (QueueState.DRAINING, QueueState.RELEASED, QueueState.LOST):
            self.hold.wake()  # a lapsed lock's confirmation, waiting to ask again, ends at once
        lease = self.lease
        if lease is not None:
            if to is QueueState.DRAINING:
                lease.drain()
            elif to in (QueueState.RELEASED, QueueState.LOST):
                lease.end()

    def replace_lease(self, lease: QueueLease) -> QueueLease | None:
        """Start a new lease generation (PULLING only); the old one ends. Returns the old one."""
        if self.state is not QueueState.PULLING:
            raise IllegalTransition(f"{self.mq}: a lease starts only while PULLING, not {self.state.value}")
        old, self.lease = self.lease, lease
        if old is not None:
            old.end()
        return old

    @property
    def pulling(self) -> bool:
        return self.state is QueueState.PULLING

    def current(self, lease: QueueLease) -> bool:
        """Whether `lease` is this queue's lease and still counts."""
        return lease is self.lease and lease.counts


def by_broker(oqs: list[OwnedQueue]) -> dict[str, list[OwnedQueue]]:
    """Queues grouped by their broker name (each broker is asked once for its own)."""
    out: dict[str, list[OwnedQueue]] = {}
    for oq in oqs:
        out.setdefault(oq.mq.broker_name, []).append(oq)
    return out
