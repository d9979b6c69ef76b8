"""OwnedQueue: a queue this consumer works on, and the one place its state changes.

    ASSIGNED -> LOCKING -> PULLING -> DRAINING -> RELEASED
                   \\________\\____________________-> LOST

ASSIGNED: rebalance gave us the queue. LOCKING: waiting for the broker lock
(zero-duplicate handover; skipped in RocketMQ-style mode). PULLING: lock held,
start offset read, pulling and consuming. DRAINING: the queue moves away; no
new pulls or dispatches, in-flight batches finish, then the offset is committed.
RELEASED: committed and unlocked. LOST: ownership was taken away (lock expired
and fenced, or the broker refused a commit); nothing more is committed.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from client.consumer.process_queue import ProcessQueue
from client.message import MessageQueue


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


class IllegalTransition(RuntimeError):
    pass


@dataclass(eq=False)
class OwnedQueue:
    mq: MessageQueue
    pq: ProcessQueue = field(default_factory=ProcessQueue)
    state: QueueState = QueueState.ASSIGNED
    next_offset: int = -1
    owner_epoch: int | None = None
    reset_generation: int | None = None
    # Batches handed to listeners and not finished yet.
    inflight: int = 0
    pull_task: asyncio.Task | None = None
    # DRAINING -> RELEASED runs as its own task, so cancelling whoever started it cannot skip the
    # final commit and unlock.
    release_task: asyncio.Task | None = None
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    # Bumped when the offset is reset: results of batches from before are ignored.
    epoch_of_cache: int = 0

    def __post_init__(self) -> None:
        self.idle.set()

    def transition(self, to: QueueState) -> None:
        if to not in _ALLOWED[self.state]:
            raise IllegalTransition(f"{self.mq}: {self.state.value} -> {to.value} is not allowed")
        self.state = to
        if to in (QueueState.DRAINING, QueueState.RELEASED, QueueState.LOST):
            self.pq.mark_dropped()

    @property
    def pulling(self) -> bool:
        return self.state is QueueState.PULLING

    @property
    def accepts_results(self) -> bool:
        """Finished batches still move the offset while pulling or draining, never once lost."""
        return self.state in (QueueState.PULLING, QueueState.DRAINING)

    def begin_batch(self) -> None:
        self.inflight += 1
        self.idle.clear()

    def end_batch(self) -> None:
        self.inflight -= 1
        if self.inflight <= 0:
            self.inflight = 0
            self.idle.set()
