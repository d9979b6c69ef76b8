"""QueueLease: one generation of a consumer's hold on a queue, carried by everything done under it.

A lease begins when the queue is granted (lock acquired, start offset read),
seeked or reset, and ends when it is replaced or the queue goes away. It is
immutable except for its status, which only moves forward:

    ACTIVE -> DRAINING -> ENDED
       \\______________/

ACTIVE: records are fetched and handed to the listener. DRAINING: the queue
moves away; nothing more is handed to the listener threads, and the batches
handed to them already run (concurrent consumption: those not started too,
or a skipped one could leave a gap below batches consumed after it) and still
count. ENDED: nothing done under this lease counts any more (results of late
batches are dropped: the next owner, or the next lease, reads them again).

Every fetched batch and every batch handed to a listener carries its lease, so
"is this still valid" is one look at that lease, from any thread (the status
is a plain attribute written on the event loop). The lease also holds its
generation's working set: a ProcessQueue of its own (a new lease starts with
an empty one) and the count of listener batches running. Under a broker lock
it carries the ownership's LockHold (lock_hold.py), which its successors share.
"""

from __future__ import annotations

import asyncio
import enum

from tidemark.client.consumer.lock_hold import LockHold
from tidemark.client.consumer.process_queue import ProcessQueue
from tidemark.client.message import MessageQueue
from tidemark.client.types import Fence


class LeaseStatus(enum.Enum):
    ACTIVE = "ACTIVE"
    DRAINING = "DRAINING"
    ENDED = "ENDED"


class QueueLease:
    __slots__ = ("mq", "client_id", "owner_epoch", "reset_generation", "start_offset", "pq", "status",
                 "running", "_idle", "lock")

    def __init__(self, mq: MessageQueue, *, client_id: str, owner_epoch: int | None,
                 reset_generation: int | None, start_offset: int, lock: LockHold | None = None) -> None:
        self.mq = mq
        self.client_id = client_id
        self.owner_epoch = owner_epoch  # from the broker's lock grant; None without locking
        self.lock = lock  # how long the broker lock may be counted on; None without locking
        self.reset_generation = reset_generation  # the admin reset this lease has seen
        self.start_offset = start_offset
        self.pq = ProcessQueue()
        self.status = LeaseStatus.ACTIVE
        self.running = 0  # listener batches handed out and not finished
        self._idle: asyncio.Event | None = None

    def successor(self, start_offset: int, reset_generation: int | None) -> QueueLease:
        """The next generation of the same ownership (same owner epoch): after a seek, reset or illegal offset."""
        return QueueLease(self.mq, client_id=self.client_id, owner_epoch=self.owner_epoch,
                          reset_generation=reset_generation, start_offset=start_offset, lock=self.lock)

    @property
    def fence(self) -> Fence:
        return Fence(self.client_id, self.owner_epoch, self.reset_generation)

    @property
    def active(self) -> bool:
        """New batches may be handed to the listener (an orderly queue's threads check it before each batch)."""
        return self.status is LeaseStatus.ACTIVE

    @property
    def counts(self) -> bool:
        """Finished batches still move the offset (ACTIVE or DRAINING)."""
        return self.status is not LeaseStatus.ENDED

    def drain(self) -> None:
        if self.status is LeaseStatus.ACTIVE:
            self.status = LeaseStatus.DRAINING

    def end(self) -> None:
        self.status = LeaseStatus.ENDED
        if self._idle is not None:
            self._idle.set()

    # -- listener batches (event-loop thread) ---------------------------------------------

    def batch_started(self) -> None:
        self.running += 1

    def batch_finished(self) -> None:
        self.running -= 1
        if self.running <= 0:
            self.running = 0
            if self._idle is not None:
                self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no listener batch of this lease runs; False on timeout. Checked again after each
        wake-up: a batch that finished and was submitted again in one step (a skipped batch run
        after a resume) set the event while another batch was already running."""
        try:
            async with asyncio.timeout(timeout_s):
                while self.running and self.status is not LeaseStatus.ENDED:
                    self._idle = asyncio.Event()
                    await self._idle.wait()
            return True
        except TimeoutError:
            return False

    def __repr__(self) -> str:
        return (f"QueueLease({self.mq}, epoch={self.owner_epoch}, generation={self.reset_generation}, "
                f"start={self.start_offset}, {self.status.value}, running={self.running})")
